"""`grpo train`: build a run from its config, train with checkpoints, resume, finish.

The order of a run, and why:
1. Join torchrun's process group if there is one (only rank 0 writes files).
2. Seed every RNG and switch on deterministic algorithms (the chess loop's set-up),
   so that a CPU run with a seed is reproducible bit for bit.
3. Build the task (policy, reward, states, evaluation) and the loop; every
   data row is checked here, so bad data stop the run before its folder is
   created (the same command runs once the data are fixed).
4. On `--resume`: load the newest intact checkpoint, drop log lines written
   after it, and only then open the log files for appending.
5. Train; after every `run.checkpoint_every` steps and at the end, checkpoint
   (its wall time logged as "time/checkpoint" at the step it follows).
   A reward function that breaks its contract (`RewardError`) stops the run
   with its checkpoints intact and a message naming the last one and how to
   continue once the reward or the data is fixed (`grpo train --resume`).
6. Save the final model, the plot and the summary.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from grpo import distributed
from grpo.precision import COPIED
from grpo.protocols import hook
from grpo.rewards.errors import RewardError
from grpo.run.config import RunConfig
from grpo.run.config_files import resolved_yaml
from grpo.run.loop import StateSampler, TrainingLoop, make_optimizer
from grpo.run.metrics import (
    JsonlLogger,
    MetricsLogger,
    MultiLogger,
    NullLogger,
    ProgressLogger,
    TensorBoardLogger,
    WandbLogger,
)
from grpo.run.parts import TaskParts
from grpo.run.rundir import RunDirectory, SamplesLogger
from grpo.run.structured import ConfigError, to_dict
from grpo.step.trainer import GRPOTrainer

__all__ = ["build_loop", "close_policy", "seed_everything", "train"]


def seed_everything(seed: int, deterministic: bool, threads: int | None) -> None:
    """Python, NumPy and torch RNGs from `seed`; deterministic kernels; a fixed thread count."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if threads is not None:
        torch.set_num_threads(threads)
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False


def build_loop(
    config: RunConfig, build_parts: Callable[[RunConfig], TaskParts], sink: Any = None
) -> tuple[TrainingLoop, TaskParts]:
    """The parts `build_parts(config)` makes and a `TrainingLoop` over them."""
    world = distributed.world_size()
    if config.prompts_per_step % world:
        raise ConfigError(
            f"prompts_per_step: got {config.prompts_per_step}, not divisible by the "
            f"{world} processes; allowed: a multiple of the number of processes"
        )
    if world > 1:  # each rank samples its own prompts with its own seed
        generation = config.policy.generation
        if generation.seed is not None:
            generation.seed += 1000 * distributed.rank()
    if config.policy.precision in COPIED and (world > 1 or config.run.max_staleness):
        where = (
            f"{world} processes" if world > 1 else f"run.max_staleness={config.run.max_staleness}"
        )
        raise ConfigError(
            f"policy.precision: bf16-copy with {where}; allowed: bf16-copy on one process with "
            "max_staleness 0 (the copy's gradients reach the float32 weights by hooks that data "
            "parallelism and a sampling thread would bypass), or bf16-mixed"
        )
    if config.run.max_staleness and config.rollout.engine == "vllm":
        raise ConfigError(
            f"run.max_staleness={config.run.max_staleness} with rollout.engine vllm: the "
            "in-process vLLM engine cannot be copied for a sampling thread; allowed: "
            "max_staleness 0, or engine vllm_server, transformers or lean"
        )
    worker = config.run.rollout_worker if config.run.max_staleness else None
    if worker == "process" and config.rollout.engine == "vllm_server":
        raise ConfigError(
            "run.rollout_worker=process with rollout.engine vllm_server: the servers already "
            "sample in processes of their own; allowed: rollout_worker thread"
        )
    if worker == "process" and str(config.model.device).startswith("cuda"):
        raise ConfigError(
            f"run.rollout_worker=process with model.device {config.model.device}: CUDA cannot "
            "be used in a forked process; allowed: rollout_worker thread"
        )
    parts = build_parts(config)
    try:
        trainer = GRPOTrainer(
            parts.policy, parts.reward, make_optimizer(config.schedule), config.grpo,
            config.distributed, grad_scaler=parts.grad_scaler,
        )  # fmt: skip
        trainer.objective.tis_cap = config.rollout.tis_cap  # stale samples' correction cap
        sampler = StateSampler(parts.train_states, config.prompts_per_step, seed=config.seed)
        loop = TrainingLoop(
            trainer,
            sampler,
            config.schedule,
            evaluate=parts.evaluate,
            eval_every=config.evaluation.every,
            sink=sink,
            max_staleness=config.run.max_staleness,
            rollout_worker=config.run.rollout_worker,
        )
    except BaseException:
        close_policy(parts.policy)
        raise
    return loop, parts


def close_policy(policy: Any) -> None:
    """The policy's `close` hook, if it has one (frees e.g. a vLLM engine)."""
    close = hook(policy, "close")
    if close is not None:
        close()


def _sinks(config: RunConfig, run_dir: RunDirectory, start_step: int) -> MetricsLogger:
    """Every sink the config asks for (rank 0 only; the others log nothing)."""
    if not distributed.is_main_process():
        return NullLogger()
    sinks: list[Any] = [JsonlLogger(run_dir.metrics), SamplesLogger(run_dir.samples)]
    if config.run.tensorboard:
        with contextlib.suppress(ImportError):  # documented: only when tensorboard is installed
            sinks.append(TensorBoardLogger(run_dir.tensorboard, purge_step=start_step + 1))
    if config.run.wandb is not None:
        w = config.run.wandb
        sinks.append(
            WandbLogger(
                w.project, run_dir.path, mode=w.mode, name=w.name or run_dir.path.name,
                config=to_dict(config),
            )
        )  # fmt: skip
    header = f"run directory {run_dir.path}"
    if any(isinstance(sink, TensorBoardLogger) for sink in sinks):
        header += f"; watch it with: tensorboard --logdir {run_dir.tensorboard}"
    steps, every = config.schedule.num_steps, config.run.log_every
    sinks.append(ProgressLogger(steps, every=every, start_step=start_step, header=header))
    return MultiLogger(sinks)


def train(
    config: RunConfig, build_parts: Callable[[RunConfig], TaskParts], *, resume: bool = False
) -> dict[str, Any]:
    """Run (or continue) the training `config` describes on the parts `build_parts(config)`
    returns (called after seeding); returns the summary."""
    started = time.perf_counter()
    distributed.init_from_env()
    main = distributed.is_main_process()
    run_dir = RunDirectory(config.run.dir)
    if not resume and main:
        run_dir.check_unused()  # before the model loads
    seed_everything(config.seed, config.run.deterministic, config.run.threads)
    loop, parts = build_loop(config, build_parts)
    try:
        return _train_built(config, loop, parts, run_dir, resume, started)
    finally:
        close_policy(parts.policy)  # before torchrun's group ends; errors included


def _train_built(
    config: RunConfig,
    loop: TrainingLoop,
    parts: TaskParts,
    run_dir: RunDirectory,
    resume: bool,
    started: float,
) -> dict[str, Any]:
    """Steps 3 (folder) to 6 of the module docstring, on a built loop."""
    main = distributed.is_main_process()
    if not resume and main:  # only now: bad data or a bad model leave no folder behind
        run_dir.create(resolved_yaml(config))
    distributed.barrier()
    start_step = 0
    if resume:
        found = run_dir.latest_checkpoint()
        if found is not None:
            start_step, state = found
            loop.load_state_dict(state)
        if main:  # no checkpoint: the run starts over, its step-0 evaluation included
            run_dir.truncate_logs(start_step if found is not None else -1)
    sink = _sinks(config, run_dir, start_step)  # opened after the logs were cut back
    loop.sink = sink.log

    def after_step(step: int) -> None:
        every = config.run.checkpoint_every
        if (every and step % every == 0) or loop.done:
            start = time.perf_counter()
            state = loop.state_dict()  # collective under FSDP2: every rank takes part
            if main:
                run_dir.save_checkpoint(step, state, config.run.keep_checkpoints, parts.licence)
            distributed.barrier()
            sink.log({"time/checkpoint": time.perf_counter() - start}, step)

    try:
        loop.train(after_step)
    except RewardError as err:
        raise RewardError(_stopped(err, loop.step, run_dir)) from err
    finally:
        sink.close()
    summary: dict[str, Any] = {}
    if main:
        if config.run.save_final and parts.save is not None:
            parts.save(run_dir.final)
        _plot(run_dir)
        summary = run_dir.write_summary(
            loop.evaluations, steps=loop.step, headline=list(parts.headline),
            seconds=time.perf_counter() - started, resumed_from=start_step,
        )  # fmt: skip
    distributed.barrier()
    return summary


def _stopped(err: RewardError, step: int, run_dir: RunDirectory) -> str:
    """`err` and what a stopped run left behind: its last checkpoint and how to continue."""
    steps = run_dir.complete_steps()
    kept = (
        f"its checkpoint of step {steps[-1]} is intact"
        if steps
        else "no checkpoint was written yet, so a resumed run starts over"
    )
    return (
        f"{err}. The run stopped after {step} completed step{'' if step == 1 else 's'}; "
        f"{kept}. Fix the reward function or the data, then continue with: "
        f"grpo train --resume {run_dir.path}"
    )


def _plot(run_dir: RunDirectory) -> None:
    from grpo.run.plots import plot_run

    with contextlib.suppress(ImportError):  # documented: the plot needs matplotlib
        plot_run(run_dir.metrics, run_dir.plot)
