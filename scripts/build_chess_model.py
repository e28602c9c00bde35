"""Build the chess-move checkpoint `grpo/assets/chess-tiny/` from nothing.

1. Draw positions as the chess task draws them (`grpo.tasks.chess.generate_dataset`: random
   legal play, 1-40 plies) from its "supervised" hash range: never a held-out position, and
   never one of the "train" positions GRPO trains on (`SUPERVISED_FRACTION`, which the chess
   config must repeat as `task.options.supervised_fraction`).
2. Train a WordLevel tokenizer with the `tokenizers` library on their FEN prompts and move
   lists: one token per character of a FEN, one per move with its leading space (" e2e4"),
   every move a piece could ever make added so that none is unknown.
3. Build a small Llama causal LM from its config class, with random weights.
4. Supervised training on ``FEN: <fen>\\n`` -> ``M: <every legal move, sorted><eos>``
   (cross-entropy on the answer only), stopped early on purpose: the model writes the format
   and lists many legal moves, but misses some and invents others, so GRPO has room to
   improve it (the task's reward on held-out positions about 0.3-0.6; the chess loop's model
   started at 0.468).
5. Save model (safetensors) and tokenizer with `save_pretrained`, plus `build_info.json`
   recording how they were made and the held-out reward, precision and coverage.

Deterministic for a given seed and thread count:
`python scripts/build_chess_model.py` (a few minutes on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import random
import resource
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

# Waiting threads sleep rather than spin: on a machine shared with other work, spinning
# threads slow a step of this small model several times over (set before torch starts them).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from transformers import PreTrainedTokenizerFast  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a plain script from a checkout, installed or not
sys.path.insert(0, str(REPO / "scripts"))

from build_demo_model import build_model, save, sft_batch, word_level_tokenizer  # noqa: E402

from grpo.tasks import chess  # noqa: E402
from grpo.tasks.arithmetic import greedy_completions  # noqa: E402

SUPERVISED_FRACTION = 0.45  # hash range [0.1, 0.55): supervised; [0.55, 1): GRPO's "train"
MAX_NEW_TOKENS = 64  # a list of up to 62 moves and <eos>: every held-out position's fits
MODEL = dict(
    hidden_size=96,
    intermediate_size=192,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=4,
    max_position_embeddings=192,  # a FEN prompt (at most ~90 tokens) and the longest list
    tie_word_embeddings=True,
)
MOVE = r" [a-h][1-8][a-h][1-8][qrbn]?"  # one token: a move and the space before it


def every_move() -> list[str]:
    """Every UCI move some piece could make on some board: a queen's or a knight's step from
    each square, and pawn promotions to each piece (1,968 moves)."""
    squares = [(f, r) for r in range(8) for f in range(8)]
    name = lambda f, r: "abcdefgh"[f] + str(r + 1)  # noqa: E731
    moves = []
    for (f1, r1), (f2, r2) in itertools.permutations(squares, 2):
        df, dr = abs(f2 - f1), abs(r2 - r1)
        if df == 0 or dr == 0 or df == dr or {df, dr} == {1, 2}:
            moves.append(name(f1, r1) + name(f2, r2))
        if df <= 1 and (r1, r2) in ((6, 7), (1, 0)):
            moves += [name(f1, r1) + name(f2, r2) + piece for piece in "qrbn"]
    return moves


def build_tokenizer(rows: list[dict[str, str]]) -> PreTrainedTokenizerFast:
    """A WordLevel tokenizer: FEN characters and whole moves, <bos> prepended."""
    corpus = [row["prompt"] + row["answer"] for row in rows]
    corpus.append("".join(" " + move for move in every_move()))  # no move is ever unknown
    corpus.append("FEN: KQRBNPkqrbnp/12345678 wb-\nM:")  # every character a prompt can hold
    # a move with its leading space is one piece, any other character one piece
    return word_level_tokenizer(MOVE + r"|[\s\S]", corpus, MODEL["max_position_embeddings"])


def positions(count: int, split: str, seed: int) -> list[dict[str, str]]:
    """The task's rows of `split` with the target answer ``M: <legal moves>``."""
    rows = chess.generate_dataset(
        count, split=split, seed=seed, supervised_fraction=SUPERVISED_FRACTION
    )
    return [{**row, "answer": "M: " + row["legal_moves"]} for row in rows]


def supervised_positions(count: int, seed: int, workers: int) -> list[dict[str, str]]:
    """About `count` distinct supervised rows, drawn in `workers` processes with the seeds
    seed * workers + i (python-chess is the slow part); the same rows for the same arguments."""
    share = -(-count // workers)
    seeds = [seed * workers + i for i in range(workers)]
    with ProcessPoolExecutor(workers) as pool:
        parts = pool.map(positions, [share] * workers, ["supervised"] * workers, seeds)
        rows = {row["fen"]: row for part in parts for row in part}  # two draws may meet
    return list(rows.values())[:count]


def held_out_metrics(model, tokenizer, rows: list[dict[str, str]]) -> dict[str, float]:
    """The task's evaluation of greedy lists: reward, precision, coverage, format ..."""
    generate = lambda p: greedy_completions(model, tokenizer, p, MAX_NEW_TOKENS)  # noqa: E731
    result = chess.evaluate(generate, rows)
    keys = ("reward", "precision", "coverage", "format_rate", "wellformed_rate", "distinct_rate")
    return {key: round(result[key], 4) for key in keys}


def answer_loss(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The mean cross-entropy of the answer tokens (labels not -100), as `model(**batch).loss`,
    with the output layer applied at those positions alone (the prompt's are most of a row)."""
    hidden = model.model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
    ).last_hidden_state  # (b, L, d)
    labels = batch["labels"][:, 1:]  # (b, L - 1): the token each position predicts
    keep = labels != -100
    logits = model.lm_head(hidden[:, :-1][keep])  # (n, V): answer positions only
    return torch.nn.functional.cross_entropy(logits, labels[keep])


def learning_rate_factor(step: int, steps: int) -> float:
    """50 warm-up steps, then a cosine from 1 down to 0.1 at the last step."""
    return min(1.0, (step + 1) / 50) * (0.1 + 0.45 * (1 + math.cos(math.pi * step / steps)))


def train(model, tokenizer, rows, held_out, args: argparse.Namespace) -> list[dict]:
    """`args.steps` AdamW steps on batches of supervised positions; returns the log (the loss,
    and the held-out metrics every `args.eval_every` steps and at the end)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: learning_rate_factor(step, args.steps)
    )
    rng = random.Random(args.seed)
    log = []
    model.train()
    for step in range(1, args.steps + 1):
        batch = sft_batch(tokenizer, rng.sample(rows, args.batch_size))
        loss = answer_loss(model, batch)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        evaluate = step == args.steps or (args.eval_every and step % args.eval_every == 0)
        if evaluate or step % 100 == 0:
            entry = {"step": step, "loss": round(loss.item(), 4)}
            if evaluate:
                entry.update(held_out_metrics(model, tokenizer, held_out))
            log.append(entry)
            print(json.dumps(entry), flush=True)
    return log


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "grpo" / "assets" / "chess-tiny")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=1500, help="SFT steps; few on purpose")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    parser.add_argument("--positions", type=int, default=30000, help="supervised positions")
    parser.add_argument("--eval-positions", type=int, default=200, help="held-out positions")
    parser.add_argument("--eval-every", type=int, default=0, help="0: at the end only")
    parser.add_argument("--threads", type=int, default=2, help="torch threads and processes")
    parser.add_argument("--record", metavar="NAME",
                        help="also write the build as the result record bench/results/NAME.json")
    parser.add_argument("--shape", type=json.loads, default={},
                        help="model shape overrides as JSON, e.g. '{\"num_hidden_layers\": 2}'")  # fmt: skip
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    load, start, start_cpu = os.getloadavg()[0], time.time(), _cpu_seconds()
    rows = supervised_positions(args.positions, args.seed, args.threads)
    held_out = positions(args.eval_positions, "held_out", 0)  # the chess config's held-out rows
    tokenizer = build_tokenizer(rows)
    shape = {**MODEL, **args.shape}
    model = build_model(tokenizer, shape)
    log = train(model, tokenizer, rows, held_out, args)
    info = {
        "task": {"prompt": "fen", "min_plies": 1, "max_plies": 40,
                 "supervised_fraction": SUPERVISED_FRACTION},  # fmt: skip
        "model": {"class": "LlamaForCausalLM", "parameters": model.num_parameters(), **shape},
        "vocab_size": len(tokenizer),
        "sft": {
            k: (str(v) if isinstance(v, Path) else v)
            for k, v in vars(args).items()
            if k not in ("out", "shape")
        },
        "held_out": {k: v for k, v in log[-1].items() if k not in ("step", "loss")},
        "max_new_tokens": MAX_NEW_TOKENS,
        "log": log,
        "build_seconds": round(time.time() - start, 1),
        "torch": torch.__version__,
    }
    save(model, tokenizer, args.out, info)
    if args.record:
        _record(args, info, load, _cpu_seconds() - start_cpu, argv)
    return info


def _cpu_seconds() -> float:
    """CPU seconds of this process and of its finished children (the position draws)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _record(args: argparse.Namespace, info: dict, load: float, cpu: float, argv) -> None:
    """The build as a result record (`bench/records.py`), with its timing flags."""
    sys.path.insert(0, str(REPO / "bench"))
    from common import timing_flags
    from records import write_record

    folder = sum(f.stat().st_size for f in args.out.iterdir() if f.is_file())
    flags = timing_flags(load, cpu, info["build_seconds"], args.threads)
    results = {**info, "folder_bytes": folder, "load_before": round(load, 2),
               "cpu_seconds": round(cpu, 1), "flags": flags}  # fmt: skip
    shown = args.out.resolve().relative_to(REPO).as_posix()
    depends = ["scripts/build_chess_model.py", "scripts/build_demo_model.py", "grpo/tasks/chess.py",
               "grpo/tasks/__init__.py", "grpo/rewards/chess.py", shown]  # fmt: skip
    argv = sys.argv[1:] if argv is None else argv
    write_record(args.record, results, depends, argv=["scripts/build_chess_model.py", *argv])


if __name__ == "__main__":
    main()
