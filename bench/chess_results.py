"""The chess page's tables (docs/chess.md), rendered from records by `bench/render_results.py`.

Records read: `chess_model` (`python scripts/build_chess_model.py --record chess_model`: the
shipped model), `chess` (`bench/train_seeds.py configs/chess.yaml`: three seeds at beta 0.1),
`chess_beta_1`, `chess_beta_0.3` and `chess_beta_0` (the same at other betas) and, through
`render_results.trl_comparison`, `chess_vs_trl`. Each renderer takes the records and the
`source` function that writes where its numbers come from.

Seed 001's own figures (`SEED_001`) are the ones its design document reports for its chess
model, with its own reward function; they were not measured here and are not comparable with
ours, so every renderer that shows them labels them as quoted, and the one-sentence summary
leaves them out.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

SEED_001_START, SEED_001_END = 0.468, 0.421  # its average reward before and after its update
SEED_001 = {1.0: (-0.065, 0.97), 0.3: (-0.059, 0.885), 0.1: (-0.047, 0.775)}
"""beta -> (seed 001's change in reward, its KL share of the loss)."""
SWEEP = (("chess_beta_1", 1.0), ("chess_beta_0.3", 0.3), ("chess", 0.1), ("chess_beta_0", 0.0))
ROWS = (  # (label, key after eval/<mode>/)
    ("reward", "reward_mean"),
    ("precision (legal share of the listed moves)", "precision"),
    ("coverage (share of the legal moves listed)", "coverage"),
    ("format share (one `M:` line)", "format_rate"),
    ("KL to the starting model, per token", "kl_mean"),
)


def _ends(run: dict) -> tuple[dict, dict]:
    """A run's first (step 0) and last held-out evaluations."""
    evaluations = sorted(run.get("checkpoint_evaluations") or run["evaluations"],
                         key=lambda e: e["step"])  # fmt: skip
    return evaluations[0], evaluations[-1]


def changes(record: dict, key: str) -> list[float]:
    """Each seed's held-out `key` at its end minus at its start."""
    return [last[key] - first[key] for first, last in map(_ends, record["results"]["runs"])]


def _spread(values: list[float], signed: bool = True) -> str:
    """"mean (each value)": what a row of seeds shows."""
    fmt = "{:+.3f}" if signed else "{:.3f}"
    each = ", ".join(fmt.format(v) for v in values)
    return f"{fmt.format(statistics.fmean(values))} ({each})"


def model(records: dict, source: Callable[..., str]) -> str:
    """The shipped model: its size, build time and held-out start."""
    record = records["chess_model"]
    r = record["results"]
    m, held = r["model"], r["held_out"]
    rows = ["| parameters | layers x hidden (MLP) | vocabulary | files | build time | held-out "
            "greedy reward | precision | coverage | format share |",
            "|---|---|---|---|---|---|---|---|---|",
            f"| {m['parameters']:,} | {m['num_hidden_layers']} x {m['hidden_size']} "
            f"({m['intermediate_size']}) | {r['vocab_size']:,} | {r['folder_bytes'] / 1e6:.1f} MB | "
            f"{r['build_seconds']:.0f} s | {held['reward']:.3f} | {held['precision']:.3f} | "
            f"{held['coverage']:.3f} | {held['format_rate']:.3f} |"]  # fmt: skip
    flags = "; ".join(r.get("flags", []))
    note = (f"Built from {r['sft']['positions']:,} supervised positions in {r['sft']['steps']} "
            f"steps of {r['sft']['batch_size']}; held-out figures on {r['sft']['eval_positions']} "
            "positions, greedy.")  # fmt: skip
    if flags:
        note += f" The build shared the machine ({flags}): its time is longer than alone."
    return "\n".join(rows) + "\n\n" + note + "\n\n" + source(record)


def output(records: dict, source: Callable[..., str]) -> str:
    """The end of seed 0's `grpo train` output: the before/after table a run prints."""
    record = records["chess"]
    run = record["results"]["runs"][0]
    return "```\n" + "\n".join(run["end_of_output"]) + "\n```\n\n" + source(record)


def seeds(records: dict, source: Callable[..., str]) -> str:
    """Held-out before and after for each seed at beta 0.1, and the training's watch-list."""
    record = records["chess"]
    runs = record["results"]["runs"]
    head = ["held-out", "before", *(f"after, seed {run['seed']}" for run in runs),
            "change: mean (per seed)"]  # fmt: skip
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for mode in ("greedy", "sampled"):
        for label, key in ROWS:
            name = f"eval/{mode}/{key}"
            ends = [_ends(run) for run in runs]
            if not all(name in last for _, last in ends):
                continue
            before = statistics.fmean(first[name] for first, _ in ends)
            rows.append(f"| {mode} {label} | {before:.3f} | "
                        + " | ".join(f"{last[name]:.3f}" for _, last in ends)
                        + f" | {_spread(changes(record, name))} |")  # fmt: skip
    rows += ["", "| seed | steps | training time | median step | whole run | sampled entropy, "
             "first tenth -> last tenth | KL share of the loss | timing shared the machine |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for run in runs:
        t = run["training"]
        entropy = t.get("entropy/mean", {})
        rows.append(f"| {run['seed']} | {run['steps']} | {run['training_seconds']:.0f} s | "
                    f"{run['median_step_seconds']:.2f} s | {run['wall_seconds']:.0f} s | "
                    f"{entropy.get('first', float('nan')):.3f} -> "
                    f"{entropy.get('last', float('nan')):.3f} | "
                    f"{t['loss/kl_share']['all']:.3f} | {', '.join(run['flags']) or 'no'} |")  # fmt: skip
    note = ("`before` is the shipped model (greedy: the same for every seed; sampled: the mean "
            "of the seeds' own draws). Sampled: one completion per position at the training's "
            "temperature and top-p. The KL share of the loss is |KL term| / (|policy term| + "
            "|KL term|) per step, averaged over the run (`loss/kl_share`).")  # fmt: skip
    return "\n".join(rows) + "\n\n" + verdict(record) + " " + note + "\n\n" + source(record)


def verdict(record: dict) -> str:
    """The greedy reward's gain over the seeds against their spread, and seed 001's change,
    labelled as quoted and not comparable."""
    key = "eval/greedy/reward_mean"
    gains = changes(record, key)
    finals = [_ends(run)[1][key] for run in record["results"]["runs"]]
    spread = max(finals) - min(finals)
    if min(gains) > spread:
        said = (f"every seed's gain exceeds the spread of their final rewards ({spread:.3f}), "
                f"the smallest by {min(gains) / spread:.1f}x" if spread else
                "the seeds end at the same reward")  # fmt: skip
    else:
        said = f"the smallest gain does not exceed the spread of the final rewards ({spread:.3f})"
    return (f"Held-out greedy reward changes by {_spread(gains)} over {len(gains)} seeds: {said}. "
            "Quoted for reference, not comparable (another model, another reward function, not "
            "measured here): the chess loop's own report gives its run's reward as "
            f"{SEED_001_START} -> {SEED_001_END} ({SEED_001_END - SEED_001_START:+.3f}).")  # fmt: skip


def sweep(records: dict, source: Callable[..., str]) -> str:
    """Beta 1, 0.3, 0.1 and 0 at equal steps: the change in held-out reward and the KL's share."""
    rows = ["| beta | steps | greedy reward change: mean (per seed) | sampled reward change | "
            "greedy precision change | greedy coverage change | KL share of the loss (last "
            "tenth) | sampled KL to the start | quoted, not comparable: the chess loop's reward "
            "change, KL share |",
            "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    used = []
    for name, beta in SWEEP:
        record = records[name]
        used.append(record)
        runs = record["results"]["runs"]
        share = [run["training"]["loss/kl_share"] for run in runs]
        kl = statistics.fmean(_ends(run)[1]["eval/sampled/kl_mean"] for run in runs)
        theirs = SEED_001.get(beta)
        theirs = f"{theirs[0]:+.3f}, {100 * theirs[1]:.1f} %" if theirs else "not run"
        rows.append(
            f"| {beta:g} | {runs[0]['steps']} | {_spread(changes(record, 'eval/greedy/reward_mean'))} | "
            f"{statistics.fmean(changes(record, 'eval/sampled/reward_mean')):+.3f} | "
            f"{statistics.fmean(changes(record, 'eval/greedy/precision')):+.3f} | "
            f"{statistics.fmean(changes(record, 'eval/greedy/coverage')):+.3f} | "
            f"{100 * statistics.fmean(s['all'] for s in share):.1f} % "
            f"({100 * statistics.fmean(s['last'] for s in share):.1f} %) | {kl:.3f} | {theirs} |"
        )  # fmt: skip
    seeds = {beta: [run["seed"] for run in record["results"]["runs"]]
             for (_, beta), record in zip(SWEEP, used, strict=True)}  # fmt: skip
    shown = "; ".join(f"beta {beta:g}: seed{'s' if len(s) > 1 else ''} {', '.join(map(str, s))}"
                      for beta, s in seeds.items())  # fmt: skip
    note = (f"Every beta trains from the same model for the same steps ({shown}); changes are "
            "held-out after minus before, and a seed draws the same positions at every beta. "
            "The last column is quoted from the chess loop's own report, not measured here: its "
            "own model after one update with its own reward function, not comparable with the "
            "columns before it.")  # fmt: skip
    return "\n".join(rows) + "\n\n" + note + "\n\n" + source(*used)


def summary(records: dict, source: Callable[..., str]) -> str:
    """One sentence: the before and after over the seeds (seed 001's quoted figures, not
    comparable, are left to the seeds table)."""
    record = records["chess"]
    key = "eval/greedy/reward_mean"
    ends = [_ends(run) for run in record["results"]["runs"]]
    before = statistics.fmean(first[key] for first, _ in ends)
    finals = [last[key] for _, last in ends]
    verb = "raises" if min(finals) > before else "lowers" if max(finals) < before else "moves"
    return (f"GRPO at the chess loop's settings {verb} the shipped chess model's held-out greedy reward "
            f"from {before:.3f} to {min(finals):.3f}-{max(finals):.3f} ({len(finals)} seeds, "
            f"{ends[0][1]['step']} steps).\n\n" + source(record))  # fmt: skip


RENDERERS: dict[str, Callable[..., str]] = {
    "model": model,
    "output": output,
    "seeds": seeds,
    "sweep": sweep,
    "summary": summary,
}
