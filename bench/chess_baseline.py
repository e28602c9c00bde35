"""The chess task's prompt-only baseline: held-out metrics with standard errors, and group spread.

    python bench/chess_baseline.py configs/smollm2_chess.yaml --positions 50 --groups 8
    python bench/chess_baseline.py configs/smollm2_chess.yaml --set task.options.prompt=fen

The config's model, prompt and sampling settings, untrained. Two measurements:

1. GRPO's signal: `--groups` training positions, `grpo.group_size` samples each
   at the config's sampling settings, as a training step draws them. A group
   whose rewards are all equal has zero advantages and teaches nothing; the
   script counts the groups with a non-zero reward spread and prints every
   group's rewards.
2. Held-out positions (the split `grpo eval` evaluates), greedy and sampled
   (one completion each): the mean and its standard error (sample standard
   deviation / sqrt(n)) of the task's reward, precision (share of listed moves
   that are legal), coverage (share of legal moves found), the format-valid
   share and the completion length in tokens, as `grpo.tasks.chess.breakdown`
   defines them per completion; the seconds each mode took.

Prints one JSON object at the end. Run it with `nice` on shared machines.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from collections.abc import Sequence

from grpo.cli.tasks import build_task
from grpo.rewards.chess import check_moves
from grpo.run.config_files import load_config
from grpo.run.evaluation import MODES
from grpo.run.train import seed_everything
from grpo.tasks import chess


def _mean_sem(values: Sequence[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else float("nan")
    return mean, math.sqrt(var / n)


def _per_completion(fen: str, text: str, num_tokens: int, settings) -> dict[str, float]:
    """The evaluation's metrics of one completion (an unformatted one counts 0)."""
    moves = chess.parse_move_list(text)
    row = {"reward": chess.score_completion(fen, text, settings), "length": float(num_tokens)}
    if moves is None:
        return {**row, "format_rate": 0.0, "precision": 0.0, "coverage": 0.0}
    check = check_moves(fen, moves, settings.piece)
    return {**row, "format_rate": 1.0, "precision": check.precision, "coverage": check.coverage}


def _generate(policy, rows, k: int, batch_size: int, overrides: dict) -> list[list]:
    groups = []
    for start in range(0, len(rows), batch_size):
        groups += policy.generate_actions(rows[start : start + batch_size], k, **overrides)
    return groups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("config")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--positions", type=int, default=50, help="held-out positions")
    parser.add_argument("--groups", type=int, default=8, help="training positions, G samples each")
    parser.add_argument("--modes", nargs="+", default=["greedy", "sampled"], choices=list(MODES))
    args = parser.parse_args()

    config = load_config(args.config, [*args.set, f"task.eval_size={args.positions}"])
    config.evaluation.reference_kl = False  # the untrained model is its own reference
    seed_everything(config.seed, config.run.deterministic, config.run.threads)
    options = dict(config.task.options)
    prompt = options.get("prompt", "fen")
    fields = {f.name for f in dataclasses.fields(chess.ChessRewardConfig)} - {"piece"}
    settings = chess.ChessRewardConfig(
        **{k: v for k, v in options.items() if k in fields}, piece=chess.PROMPT_PIECE.get(prompt)
    )
    parts = build_task(config)
    policy, batch = parts.policy, config.evaluation.batch_size
    plies = {k: options[k] for k in ("min_plies", "max_plies") if k in options}
    held = chess.generate_dataset(args.positions, split="held_out", prompt=prompt, **plies)
    result: dict = {"config": args.config, "set": args.set, "positions": args.positions}
    if args.groups:
        G = config.grpo.group_size
        start = time.perf_counter()
        states = list(parts.train_states[: args.groups])
        groups = _generate(policy, states, G, config.prompts_per_step, {})
        seconds = time.perf_counter() - start
        rewards = [
            [round(chess.score_completion(s["fen"], a.text, settings), 4) for a in group]
            for s, group in zip(states, groups, strict=True)
        ]
        spread = sum(len(set(r)) > 1 for r in rewards)
        result["groups"] = {"G": G, "count": len(rewards), "with_spread": spread,
                            "seconds": round(seconds, 1), "rewards": rewards}  # fmt: skip
        print("groups", json.dumps(result["groups"]), flush=True)
    for mode in args.modes:
        start = time.perf_counter()
        groups = _generate(policy, held, 1, batch, MODES[mode])
        seconds = time.perf_counter() - start
        per = [
            _per_completion(row["fen"], g[0].text, g[0].num_tokens, settings)
            for row, g in zip(held, groups, strict=True)
        ]
        stats = {key: _mean_sem([p[key] for p in per]) for key in per[0]}
        result[mode] = {"seconds": round(seconds, 1), **stats}
        print(mode, json.dumps(result[mode]), flush=True)
        for row, g in list(zip(held, groups, strict=True))[:3]:
            print("  ", row["fen"], "->", repr(g[0].text[:120]), flush=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
