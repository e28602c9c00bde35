"""Built-in arithmetic task: seeded exact-answer problems, a reward and an evaluation.

A problem is plain text such as ``"12+7="`` with the exact integer answer
``"19"``; a completion is correct when, stripped of surrounding whitespace, it
spells exactly that integer. The format is deliberately bare (no chat template,
no instructions) so that a model of about a million parameters can learn it.

Train and held-out problems are separated by a stable hash of the prompt text,
not by the sampling seed: a held-out problem is never produced for training,
whatever seeds the two datasets were drawn with.

Rows are dicts ``{"prompt": str, "answer": str}``; the reward follows the
library's reward contract ``reward(prompts, completions, **columns)`` and reads
the ``answer`` column. Importing this module pulls in nothing heavier than the
standard library; `greedy_completions` imports torch when it is called.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from grpo.tasks import draw_distinct, hash_split

__all__ = [
    "ArithmeticConfig",
    "OPERATORS",
    "SPLITS",
    "accuracy",
    "evaluate",
    "evaluate_expression",
    "generate_dataset",
    "greedy_completions",
    "problem_split",
    "reward",
]

OPERATORS = ("+", "-", "*")
SPLITS = ("train", "held_out")


@dataclass(frozen=True)
class ArithmeticConfig:
    """Difficulty of the generated problems."""

    num_operands: int = 2
    """How many numbers each problem combines (at least 2)."""
    min_digits: int = 1
    """Fewest digits of an operand; 1 lets operands start at 0."""
    max_digits: int = 2
    """Most digits of an operand; operands are uniform over [10**(min_digits-1), 10**max_digits - 1]."""
    operators: tuple[str, ...] = ("+",)
    """Operators drawn uniformly between operands, from "+", "-", "*"; usual precedence applies."""
    held_out_fraction: float = 0.1
    """Share of all possible prompts reserved for evaluation (chosen by a hash of the prompt)."""

    def __post_init__(self) -> None:
        if not isinstance(self.num_operands, int) or self.num_operands < 2:
            raise ValueError(f"num_operands must be an integer >= 2, got {self.num_operands!r}")
        for name in ("min_digits", "max_digits"):
            value = getattr(self, name)
            if not isinstance(value, int) or not 1 <= value <= 9:
                raise ValueError(f"{name} must be an integer in [1, 9], got {value!r}")
        if self.min_digits > self.max_digits:
            raise ValueError(
                f"min_digits ({self.min_digits}) must be <= max_digits ({self.max_digits})"
            )
        ops = tuple(self.operators)
        if not ops or any(op not in OPERATORS for op in ops):
            raise ValueError(f"operators must be a non-empty subset of {OPERATORS}, got {ops!r}")
        object.__setattr__(self, "operators", ops)
        if not 0.0 < self.held_out_fraction < 1.0:
            raise ValueError(f"held_out_fraction must be in (0, 1), got {self.held_out_fraction!r}")

    @property
    def operand_range(self) -> tuple[int, int]:
        """Smallest and largest operand, inclusive."""
        low = 0 if self.min_digits == 1 else 10 ** (self.min_digits - 1)
        return low, 10**self.max_digits - 1


def evaluate_expression(prompt: str) -> int:
    """Exact value of a prompt such as ``"3+4*5="`` (``*`` binds tighter than ``+``/``-``)."""
    if not prompt.endswith("="):
        raise ValueError(f"prompt {prompt!r} must end with '='")
    total, term, sign, number = 0, 1, 1, ""
    # A trailing "+" flushes the last term; "*" folds numbers into the running term.
    for char in prompt[:-1] + "+":
        if char.isdigit():
            number += char
            continue
        if char not in OPERATORS or not number:
            raise ValueError(f"prompt {prompt!r} is not integers joined by {OPERATORS} then '='")
        term *= int(number)
        number = ""
        if char != "*":
            total += sign * term
            sign, term = (1 if char == "+" else -1), 1
    return total


def problem_split(prompt: str, held_out_fraction: float = 0.1) -> str:
    """``"held_out"`` or ``"train"``: a stable hash of the prompt text decides, not a seed."""
    return hash_split(prompt, held_out_fraction)


def _draw_prompt(rng: random.Random, config: ArithmeticConfig) -> str:
    low, high = config.operand_range
    numbers = [rng.randint(low, high) for _ in range(config.num_operands)]
    ops = [rng.choice(config.operators) for _ in range(config.num_operands - 1)]
    parts = [str(numbers[0])]
    for op, number in zip(ops, numbers[1:], strict=True):
        parts += [op, str(number)]
    return "".join(parts) + "="


def generate_dataset(
    num_problems: int,
    *,
    split: str = "train",
    seed: int = 0,
    config: ArithmeticConfig | None = None,
    unique: bool = True,
) -> list[dict[str, str]]:
    """`num_problems` rows ``{"prompt", "answer"}`` from `split`, the same for the same seed.

    With `unique` the prompts are distinct; a `ValueError` says so when the split
    has too few distinct problems to satisfy the request.
    """
    config = config or ArithmeticConfig()
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if not isinstance(num_problems, int) or num_problems < 0:
        raise ValueError(f"num_problems must be a non-negative integer, got {num_problems!r}")
    rng = random.Random(f"arithmetic/{split}/{seed}")  # str seeds hash stably across runs
    prompts = draw_distinct(
        num_problems,
        lambda: _draw_prompt(rng, config),
        lambda prompt: problem_split(prompt, config.held_out_fraction) == split,
        unique=unique,
        shortfall=lambda found: (
            f"num_problems={num_problems} distinct {split!r} problems could not be drawn "
            f"(found {found}); raise max_digits or num_operands, or pass unique=False"
        ),
    )
    return [{"prompt": p, "answer": str(evaluate_expression(p))} for p in prompts]


def _parse(completion: Any, index: int) -> str:
    if not isinstance(completion, str):
        raise TypeError(
            f"completions[{index}] must be a str, got {type(completion).__name__}; "
            "the arithmetic task uses plain-text prompts, not chat messages"
        )
    return completion.strip()


def reward(
    prompts: Sequence[str], completions: Sequence[str], answer: Sequence[str], **_: Any
) -> list[float]:
    """1.0 where the stripped completion is exactly the answer's integer, else 0.0."""
    if not len(prompts) == len(completions) == len(answer):
        raise ValueError(
            f"prompts, completions and answer must have the same length, got "
            f"{len(prompts)}, {len(completions)} and {len(answer)}"
        )
    return [
        1.0 if _parse(completion, i) == str(target).strip() else 0.0
        for i, (completion, target) in enumerate(zip(completions, answer, strict=True))
    ]


def accuracy(completions: Sequence[str], answers: Sequence[str]) -> float:
    """Share of exactly correct completions, in [0, 1]."""
    if len(completions) != len(answers) or not answers:
        raise ValueError(
            f"completions and answers must be non-empty and of equal length, got "
            f"{len(completions)} and {len(answers)}"
        )
    scores = reward([""] * len(answers), completions, answers)
    return sum(scores) / len(scores)


def evaluate(
    generate: Callable[[list[str]], list[str]], rows: Sequence[dict[str, str]]
) -> dict[str, float]:
    """Run `generate` (prompts -> completions) on `rows`; ``{"accuracy", "num_problems"}``."""
    prompts = [row["prompt"] for row in rows]
    completions = generate(prompts)
    if len(completions) != len(prompts):
        raise ValueError(
            f"generate returned {len(completions)} completions for {len(prompts)} prompts"
        )
    return {
        "accuracy": accuracy(completions, [row["answer"] for row in rows]),
        "num_problems": float(len(rows)),
    }


def greedy_completions(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    max_new_tokens: int = 6,
    batch_size: int = 256,
) -> list[str]:
    """Greedy-decoded completions of a causal LM (left padding), special tokens removed."""
    import torch  # imported here so that the task stays importable without torch

    tokenizer.padding_side = "left"  # generation appends on the right, so pad on the left
    was_training = model.training
    model.eval()
    completions: list[str] = []
    with torch.no_grad():
        for start in range(0, len(prompts), batch_size):
            batch = tokenizer(
                list(prompts[start : start + batch_size]), return_tensors="pt", padding=True
            )
            output = model.generate(
                **batch,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
            new_tokens = output[:, batch["input_ids"].shape[1] :]  # (b, T) generated part
            completions += tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
    model.train(was_training)
    return completions
