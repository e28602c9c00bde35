"""Write this example's data files: two-number sums as JSONL rows {"prompt", "answer"}.

    python examples/your_data/make_data.py

Your own data needs no script: any JSONL file whose rows hold a "prompt" (a string, or a
list of chat messages) and the columns your reward functions read. Here the held-out rows
share no prompt with the training rows.
"""

import json
import random
from pathlib import Path

here = Path(__file__).resolve().parent
rng = random.Random(0)
pairs = [(a, b) for a in range(100) for b in range(100)]
rng.shuffle(pairs)
splits = {"test.jsonl": pairs[:200], "train.jsonl": pairs[200:2200]}
for name, rows in splits.items():
    with open(here / name, "w") as out:
        for a, b in rows:
            out.write(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n")
