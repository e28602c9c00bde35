"""Where a step's update points: what varies within the groups, and which lengths it favours.

    python bench/group_anatomy.py configs/smollm2_math.yaml --prompts 32
    python bench/group_anatomy.py configs/smollm2_math.yaml --model RUN/final --prompts 32

Samples G completions for each of the first `--prompts` training prompts with
the config's policy and sampling settings (a run's first rollouts; with
`--model`, a trained model's), scores them with the task's reward functions,
and reports for each advantage scale of `grpo.functional.SCALES` (mean
baseline):

- the groups by what separates their samples: nothing (advantage 0, no
  gradient), the first reward function (the main check: `correct` for word
  problems), or only the other functions (every sample fails or passes the
  main check alike, a minor reward such as the format alone ranks them);
- each kind's share of the update's weight, the sum of |A| over its samples;
- the length gap: sum(A * length) / (sum |A| / 2), in tokens. With a centred
  baseline the positive and negative advantages of a group balance, so this is
  the mean length of the samples the update favours minus that of the ones it
  disfavours, each weighted by |A|. Negative: the update pulls toward shorter
  completions, whatever the loss's aggregation.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from grpo.functional.advantages import (  # noqa: E402
    SCALES,
    group_advantages,
    informative_groups,
)

KINDS = ("nothing", "main", "others only")


def group_kinds(rewards: torch.Tensor, main: torch.Tensor, group_size: int) -> list[str]:
    """Per group: which rewards separate its samples. rewards, main: (N,) -> B names."""
    # "nothing": no sample informative under the mean baseline (all rewards equal)
    signal = informative_groups(group_advantages(rewards.double(), group_size), group_size)  # (B,)
    firsts = main.view(-1, group_size)  # (B, G)
    varies = (firsts != firsts[:, :1]).any(1)  # (B,) the main check separates some samples
    return [
        ("main" if v else "others only") if s else "nothing"
        for s, v in zip(signal.tolist(), varies.tolist(), strict=True)
    ]


def anatomy(
    rewards: torch.Tensor, main: torch.Tensor, lengths: torch.Tensor, group_size: int, scale: str
) -> dict[str, dict[str, float]]:
    """Per kind (and "all"): groups, share of sum |A|, length gap in tokens. (N,) inputs."""
    advantages = group_advantages(rewards.double(), group_size, scale=scale)  # (N,)
    kinds = group_kinds(rewards, main, group_size)
    weight = advantages.abs().view(-1, group_size).sum(1)  # (B,)
    pull = (advantages * lengths.double()).view(-1, group_size).sum(1)  # (B,)
    total = float(weight.sum())
    report = {}
    for kind in (*KINDS, "all"):
        chosen = torch.tensor([kind in ("all", k) for k in kinds])  # (B,)
        mass = float(weight[chosen].sum())
        report[kind] = {
            "groups": int(chosen.sum()),
            "weight_share": mass / total if total else 0.0,
            "length_gap": float(pull[chosen].sum()) / (mass / 2) if mass else 0.0,
        }
    return report


def sample(config_path: str, overrides: Sequence[str], num_prompts: int) -> dict[str, list]:
    """The first rollouts of a run of this config: rewards, main check and lengths (N,)."""
    from grpo.cli.tasks import build_task
    from grpo.run.config_files import load_config
    from grpo.run.train import seed_everything

    config = load_config(config_path, [*overrides, "task.eval_size=0"])
    seed_everything(config.seed, config.run.deterministic, config.run.threads)
    parts = build_task(config)
    group_size, per_call = config.grpo.group_size, config.prompts_per_step
    states = list(parts.train_states[:num_prompts])
    rows: dict[str, list] = {"rewards": [], "main": [], "lengths": [], "texts": []}
    for start in range(0, len(states), per_call):
        chunk = states[start : start + per_call]
        actions = [a for group in parts.policy.generate_actions(chunk, group_size) for a in group]
        repeated = [s for s in chunk for _ in range(group_size)]
        rewards, per_function = parts.reward.score(repeated, actions)
        first = next(iter(per_function.values()))
        rows["rewards"] += rewards.tolist()
        rows["main"] += [-math.inf if v is None else float(v) for v in first]  # None: "-inf"
        rows["lengths"] += [a.num_tokens for a in actions]
        rows["texts"] += [a.text for a in actions]
        print(f"sampled {start + len(chunk)}/{len(states)} prompts", file=sys.stderr, flush=True)
    rows["group_size"] = group_size
    return rows


def table(rows: dict[str, list]) -> str:
    """One markdown row per scale and kind."""
    lines = ["| scale | groups by what separates them | groups | share of sum abs(A) | length gap (tokens) |",
             "|---|---|---|---|---|"]  # fmt: skip
    args = [torch.tensor(rows[k]) for k in ("rewards", "main", "lengths")]
    for scale in SCALES:
        for kind, row in anatomy(*args, rows["group_size"], scale).items():
            lines.append(f"| {scale} | {kind} | {row['groups']} | {row['weight_share']:.2f} | "
                         f"{row['length_gap']:+.1f} |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("--model", help="a model folder to sample from (default: model.path)")
    parser.add_argument("--prompts", type=int, default=32, help="training prompts, G samples each")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--json", help="write the samples (rewards, lengths, texts) here")
    args = parser.parse_args()
    overrides = [*args.set, *([f"model.path={args.model}"] if args.model else [])]
    rows = sample(args.config, overrides, args.prompts)
    if args.json:
        Path(args.json).write_text(json.dumps(rows))
    print(table(rows))


if __name__ == "__main__":
    main()
