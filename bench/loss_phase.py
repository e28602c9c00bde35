"""The loss phase under two or more values of one policy setting, side by side on one batch.

    python bench/loss_phase.py --record loss_precision                 # smollm2_math, precisions
    python bench/loss_phase.py configs/gemma3_math.yaml --record loss_precision_gemma
    python bench/loss_phase.py --compare pack_completions=false,true --record loss_packing
    python bench/loss_phase.py configs/demo.yaml --rounds 1            # a quick look

Builds the config's task and policy as `grpo train` does (under `policy.precision:
bf16-copy`, so that its bfloat16 copy exists, unless the precision is not compared), samples
one step's B x G completions from the first B training prompts, then times the loss phase
under each value of `--compare FIELD=V1,V2,...` (a `policy.` setting; default the compute
precision, bf16-mixed against bf16-copy) on that same batch: every micro-batch scored with
gradients (`get_token_log_probabilities`) and its summed log-probs' backward, as the
trainer's gradient pass does, with no optimizer step, so every round sees the same weights.
The values alternate within each round, after one untimed round, and each round's time is
divided by the first value's in the same round. Beside the times: the largest gap of each
value's log-probs from the first one's, and the relative difference of the float32 gradients
they leave (||g - g_first|| / ||g_first||): the price of the speed, on real weights.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("config", nargs="?", default="configs/smollm2_math.yaml")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="config overrides, as for grpo train")  # fmt: skip
    parser.add_argument("--compare", default="precision=bf16-mixed,bf16-copy",
                        metavar="FIELD=V1,V2", help="a policy setting and its values, "
                        "comma-separated; the first is the one the others are divided by")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds, after one untimed")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--record", metavar="NAME", help="write bench/results/NAME.json")
    args = parser.parse_args(argv)
    args.field, _, values = args.compare.partition("=")
    args.values = values.split(",") if values else []
    if args.rounds < 1 or len(args.values) < 2:
        parser.error("allowed: --rounds >= 1 and --compare FIELD=V1,V2 with two values or more")
    return args


def setting_values(field: str, values: list[str]) -> list[Any]:
    """`values` as the policy setting `field` takes them (a precision checked by name, a
    bool from true/false, other fields as YAML reads them); ValueError naming --compare."""
    import yaml

    from grpo.lm.settings import CausalLMSettings
    from grpo.precision import check_precision

    if field not in CausalLMSettings.__dataclass_fields__:
        raise ValueError(f"--compare: got {field!r}; allowed: a field of policy settings")
    if field == "precision":
        return [check_precision("--compare", v) for v in values]
    return [yaml.safe_load(v) for v in values]


def loss_phase(policy: Any, states: list, actions: list) -> tuple[float, Tensor, Tensor]:
    """(seconds, log-probs (N, T), float32 gradient of the trainable weights, flattened) of
    the gradient pass over `actions`, micro-batch by micro-batch."""
    params = [p for p in policy.model.parameters() if p.requires_grad]
    policy.model.zero_grad(set_to_none=True)
    step = policy.settings.micro_batch_size
    logprobs = []
    start = time.perf_counter()
    for s in range(0, len(actions), step):
        out = policy.get_token_log_probabilities(states[s : s + step], actions[s : s + step])
        (out.logprobs * out.completion_mask).sum().backward()
        logprobs.append(out.logprobs.detach().masked_fill(~out.completion_mask, 0.0))
    seconds = time.perf_counter() - start
    width = max(x.shape[1] for x in logprobs)
    padded = torch.cat([torch.nn.functional.pad(x, (0, width - x.shape[1])) for x in logprobs])
    grads = torch.cat([p.grad.flatten() for p in params if p.grad is not None])
    return seconds, padded, grads


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from grpo.cli.tasks import build_task
    from grpo.run.config_files import load_config

    torch.set_num_threads(args.threads)
    values = setting_values(args.field, args.values)
    copy = ["policy.precision=bf16-copy"] if args.field == "precision" else []
    config = load_config(args.config, [*args.set, *copy])
    parts = build_task(config)
    policy = parts.policy
    B, G = config.prompts_per_step, config.grpo.group_size
    states = list(parts.train_states[:B])
    torch.manual_seed(config.seed)
    actions = [a for group in policy.generate_actions(states, G) for a in group]
    rows = [s for s in states for _ in range(G)]
    names = [str(v) for v in args.values]  # as given: the table's and the record's labels
    times: dict[str, list[float]] = {name: [] for name in names}
    first: dict[str, tuple[Tensor, Tensor]] = {}
    for round_ in range(args.rounds + 1):  # round 0 warms up, untimed
        for name, value in zip(names, values, strict=True):
            setattr(policy.settings, args.field, value)
            seconds, logprobs, grads = loss_phase(policy, rows, actions)
            if round_:
                times[name].append(seconds)
            first.setdefault(name, (logprobs, grads))
    base = names[0]
    base_lp, base_grad = first[base]
    runs = []
    for name in names:
        lp, grad = first[name]
        ratios = [t / b for t, b in zip(times[name], times[base], strict=True)]
        runs.append({
            "value": name,
            "seconds": times[name],
            "median_seconds": statistics.median(times[name]),
            "ratios": ratios,
            "median_ratio": statistics.median(ratios),
            "logprob_gap_max": float((lp - base_lp).abs().max()),
            "grad_rel_diff": float((grad - base_grad).norm() / base_grad.norm()),
        })  # fmt: skip
    return {
        "config": args.config,
        "overrides": args.set,
        "field": args.field,
        "threads": args.threads,
        "rounds": args.rounds,
        "completions": len(actions),
        "completion_tokens_mean": statistics.mean(a.num_tokens for a in actions),
        "prompt_tokens_mean": statistics.mean(len(a.prompt_ids) for a in actions),
        "micro_batch_size": policy.settings.micro_batch_size,
        "runs": runs,
    }


def _field(results: dict[str, Any]) -> str:
    return results.get("field", "precision")  # records written before --compare: precisions


def _value(run: dict[str, Any]) -> str:
    return run["value"] if "value" in run else run["precision"]


def table(results: dict[str, Any]) -> str:
    field, base = _field(results), _value(results["runs"][0])
    lines = [
        f"| {field} | loss phase s (median) | x {base} (each round) | largest log-prob gap "
        f"to {base} | gradient difference |",
        "|---|---|---|---|---|",
    ]
    for run in results["runs"]:
        ratios = ", ".join(f"{r:.2f}" for r in run["ratios"])
        lines.append(
            f"| {_value(run)} | {run['median_seconds']:.2f} | {run['median_ratio']:.2f} "
            f"({ratios}) | {run['logprob_gap_max']:.3g} | {run['grad_rel_diff']:.1%} |"
        )
    return "\n".join(lines)


def note(results: dict[str, Any]) -> str:
    """What the table measured, in one paragraph."""
    return (
        f"One batch of `{results['config']}`: {results['completions']} completions of "
        f"{results['completion_tokens_mean']:.1f} tokens on average after prompts of "
        f"{results['prompt_tokens_mean']:.1f}, scored with gradients in micro-batches of "
        f"{results['micro_batch_size']} and back-propagated, at {results['threads']} threads; "
        f"{results['rounds']} timed rounds after one untimed, the values of "
        f"`policy.{_field(results)}` alternating within each round and each round divided by "
        "the first value's. The gap and the difference compare each value's log-probs and "
        "float32 weight gradients with the first one's on the same batch and weights."
    )


def main(argv: Sequence[str] | None = None, folder: Path | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    results = measure(args)
    from provenance import table_and_note

    print(table_and_note(table, note, results))
    if args.record:
        from records import RESULTS, write_config_record

        scripts = ["bench/loss_phase.py"]
        write_config_record(args.record, results, args.config, scripts, argv, folder or RESULTS)
    return results


if __name__ == "__main__":
    main()
