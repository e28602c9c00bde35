"""What a word-problem gain is made of: the format, the worked example, or the arithmetic.

    grpo fetch smollm2                     # before: the folder configs/smollm2_math.yaml names
    grpo train configs/smollm2_math.yaml   # after: its checkpoint of step 64 (the last one)
    python bench/word_problem_diagnosis.py configs/smollm2_math.yaml \\
        --after runs/smollm2_math/checkpoints/step-000064 --record word_problem_diagnosis

The model before training (`--before`; by default the config's `model.path`, for the command
above `~/.cache/grpo/models/SmolLM2-135M-Instruct-dequantized-Q4_1`, where `grpo fetch smollm2`
writes it) and each checkpoint of `--after` (RUN_DIR/checkpoints/step-N, loaded into the same
policy as `bench/evaluate_checkpoints.py` loads it) answer the same held-out problems, greedy,
through the library's own evaluation (`grpo.run.evaluation.evaluate`, with the policy and
rewards `grpo.cli.tasks.build_task` builds from the config). Each problem is asked in several
prompt forms (`FORMS`): the task's full scaffold (the instruction with its "Answer: N"
request, one worked example, the problem); the same without the worked example (the
instruction only); the bare question; and, on request, the worked example without the
instruction. A config of the plain form (`task.options.prompt_form: plain`, for a base
model) has every form written as plain text, as its task writes its own. The problems are the first `--eval-size` of each held-out split the task
evaluates (at 200, the full form's figures are the run's own evaluation). `heldout_bare` is
left out by default: its problems are drawn as `heldout_phrasings`' are, and the bare form
asks them that way on the very problems the other forms ask.

What each cell holds, and how problems are grouped (by number of operations, by the last
operation, by the largest number involved), is in `bench/word_problem_cells.py`; the record's
results are its `tabulate` with the settings, and `bench/word_problem_results.py` renders them.
`--completions FILE` also writes every reply, to read what the figures count.

Cost: (1 + checkpoints) x splits x forms x eval size greedy replies, 960 at the defaults with
one checkpoint. Replies to the full scaffold are short; the others often run to the config's
`max_new_tokens`.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from evaluate_checkpoints import load_checkpoint  # noqa: E402
from records import REPO, RESULTS, TRAINING_PATH, write_record  # noqa: E402
from train_seeds import config_files  # noqa: E402
from word_problem_cells import tabulate  # noqa: E402

from grpo.lm.prompt_forms import in_form  # noqa: E402
from grpo.tasks import word_problems as wp  # noqa: E402

FORMS: dict[str, Callable[[str], list[dict[str, str]]]] = {
    "full": lambda text: wp.messages(text),
    "no_example": lambda text: wp.messages(text, worked_example=False),
    "bare": lambda text: wp.messages(text, bare=True),
    "example_only": lambda text: wp.messages(text)[1:],  # the system instruction dropped
}
"""Prompt forms of one problem's text, as chat messages."""
DEFAULT_FORMS = ("full", "no_example", "bare")
DEFAULT_SPLITS = ("heldout_numbers", "heldout_phrasings")


def with_form(rows: Sequence[dict], form: str, prompt_form: str = "chat") -> list[dict]:
    """Rows of the chat form asked in `form` (the problem's text is its prompt's last message),
    written as the config's `prompt_form` writes them (plain: `grpo.lm.prompt_forms`)."""
    return [{**row, "prompt": in_form(FORMS[form](row["prompt"][-1]["content"]), prompt_form)}
            for row in rows]  # fmt: skip


def greedy_replies(policy: Any, reward: Any, rows: Sequence[dict], batch_size: int) -> list[str]:
    """One greedy reply a row, through the library's held-out evaluation."""
    from grpo.run.evaluation import evaluate

    seen: list[list[str]] = []

    def recording(states: list, texts: list[str]) -> dict[str, float]:
        seen.append(texts)
        return {}

    evaluate(policy, rows, reward, modes=("greedy",), batch_size=batch_size,
             num_logged_samples=0, breakdown=recording)  # fmt: skip
    return seen[0]


def _checkpoints(folders: Sequence[Path]) -> dict[str, Path]:
    """Label ("step N"; with the run's folder when two share a step) -> checkpoint folder."""
    steps = []
    for folder in folders:
        found = re.fullmatch(r"step-(\d+)", folder.name)
        if found is None or not (folder / "state.pt").is_file():
            raise SystemExit(f"--after {folder}: not RUN_DIR/checkpoints/step-N (no state.pt)")
        steps.append(int(found.group(1)))
    unique = len(set(steps)) == len(steps)
    return {(f"step {s}" if unique else f"{f.parent.parent.name} step {s}"): f
            for s, f in zip(steps, folders, strict=True)}  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="the word-problem config the checkpoints were trained with")
    parser.add_argument("--before", help="the model before training (default: model.path)")
    parser.add_argument(
        "--after",
        type=Path,
        nargs="*",
        default=[],
        metavar="CHECKPOINT",
        help="checkpoint folders RUN_DIR/checkpoints/step-N",
    )
    parser.add_argument("--eval-size", type=int, default=80, help="problems per split")
    parser.add_argument("--splits", nargs="+", default=list(DEFAULT_SPLITS), choices=wp.SPLITS[1:])
    parser.add_argument("--forms", nargs="+", default=list(DEFAULT_FORMS), choices=list(FORMS))
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override the config (repeatable)",
    )
    parser.add_argument("--completions", type=Path, help="also write every reply to this JSONL")
    parser.add_argument("--record", metavar="NAME", help="write bench/results/NAME.json")
    parser.add_argument("--results", type=Path, help="the record's folder instead")
    return parser.parse_args(argv)  # fmt: skip


def measure(
    parts: Any,
    rows: dict[str, list[dict]],
    forms: Sequence[str],
    models: dict[str, Path | None],
    batch_size: int,
    prompt_form: str = "chat",
) -> tuple[dict, dict[str, float]]:
    """replies[model][split][form] (one greedy reply a row of the chat form, asked in
    `prompt_form`) and each model's seconds; a model's checkpoint folder (None: the policy as
    built) is loaded before it answers."""
    replies: dict[str, dict[str, dict[str, list[str]]]] = {}
    seconds = {}
    for label, folder in models.items():
        start = time.perf_counter()
        if folder is not None:
            load_checkpoint(parts.policy, folder)
        replies[label] = {split: {} for split in rows}
        for (split, split_rows), form in itertools.product(rows.items(), forms):
            asked = with_form(split_rows, form, prompt_form)
            texts = greedy_replies(parts.policy, parts.reward, asked, batch_size)
            replies[label][split][form] = texts
            right = wp.correct([], texts, [row["answer"] for row in split_rows])
            print(f"{label} {split} {form}: accuracy {sum(right) / len(right):.3f} "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)  # fmt: skip
        seconds[label] = round(time.perf_counter() - start, 1)
    return replies, seconds


def write_replies(path: Path, rows: dict[str, list[dict]], replies: dict) -> None:
    """Every reply, one JSON line each: model, split, form, equation, answer, completion."""
    with path.open("w") as out:
        for model, by_split in replies.items():
            for split, by_form in by_split.items():
                for form, texts in by_form.items():
                    for row, text in zip(rows[split], texts, strict=True):
                        line = {"model": model, "split": split, "form": form,
                                "equation": row["equation"], "answer": row["answer"],
                                "completion": text}  # fmt: skip
                        out.write(json.dumps(line) + "\n")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from grpo.cli.tasks import _options, build_task
    from grpo.run.config_files import load_config
    from grpo.run.train import seed_everything

    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.eval_size < 2:
        raise SystemExit(f"--eval-size: got {args.eval_size}; allowed: 2 or more")
    afters = _checkpoints(args.after)
    overrides = [*args.overrides, f"task.eval_size={args.eval_size}"]
    if args.before:
        overrides.append(f"model.path={args.before}")
    config = load_config(args.config, overrides)
    if config.task.name != "word_problems":
        raise SystemExit(f"{args.config}: task.name: {config.task.name!r}; allowed: word_problems")
    seed_everything(config.seed, config.run.deterministic, config.run.threads)
    extra = ("answer_check", "format_weight")
    settings, _ = _options(wp.WordProblemsConfig, config.task.options, extra)
    chat = dataclasses.replace(settings, prompt_form="chat")  # messages, to take the text from
    rows = {split: wp.generate_dataset(args.eval_size, split=split, seed=0, config=chat)
            for split in args.splits}  # the task's own held-out rows: seed 0  # fmt: skip
    parts = build_task(config)
    batch = config.evaluation.batch_size
    models = {"before": None, **afters}
    replies, seconds = measure(parts, rows, args.forms, models, batch, settings.prompt_form)
    paths = {"before": config.model.path, **{k: str(v) for k, v in afters.items()}}
    results = {
        "config": args.config, "overrides": args.overrides, "eval_size": args.eval_size,
        "batch_size": batch, "splits": args.splits, "forms": args.forms,
        "models": [{"label": k, "path": v, "seconds": seconds[k]} for k, v in paths.items()],
        "generations": len(paths) * len(rows) * len(args.forms) * args.eval_size,
        **tabulate(rows, replies),
    }  # fmt: skip
    if args.completions:
        write_replies(args.completions, rows, replies)
    if args.record:
        inside = [p for p in (args.config,) if (REPO / p).resolve().is_relative_to(REPO)]
        depends = ["bench/word_problem_diagnosis.py", *inside, *config_files(config)]
        path = write_record(args.record, results, [*depends, *TRAINING_PATH],
                            argv=["bench/word_problem_diagnosis.py", *argv],
                            folder=args.results or RESULTS)  # fmt: skip
        print(f"record: {path}")
    return results


if __name__ == "__main__":
    main()
