"""grpo.run.overlap_process: the rollout producer in a forked process resumes where its
draws were, forwards its errors and its death to the trainer, and leaves when the trainer
is gone; settings it cannot serve are refused by name."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from toy_models import SequencePolicy

from grpo.run.loop import StateSampler
from grpo.run.overlap_process import RolloutProcessError
from tests.run.test_overlap import Killed, _loop, kill_after_3

REPO = Path(__file__).resolve().parents[2]


class _FileLoggedSampler(StateSampler):
    """A StateSampler that appends every batch it draws to a file: the process draws from
    its own copy, so only a file shows what it drew."""

    def __init__(self, path: Path, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.path = path

    def __next__(self):
        batch = super().__next__()
        with open(self.path, "a", encoding="utf-8") as log:
            log.write(f"{batch}\n")
        return batch


def _logged(loop, path: Path, seed: int):
    loop.sampler = loop.producer.sampler = _FileLoggedSampler(path, list(range(5)), 4, seed=seed)
    return loop


def test_an_interrupted_process_run_resumes_by_drawing_the_queued_prompts_again(tmp_path):
    """Killed after step 3 of 6 with k = 2: the checkpoint holds the state from before step
    3's draw (sent by the process), and the resumed run draws steps 3..5's prompts again."""
    _logged(_loop(2, worker="process"), tmp_path / "straight", seed=2).train()
    half = _logged(_loop(2, worker="process"), tmp_path / "half", seed=2)
    with pytest.raises(Killed):
        half.train(after_step=kill_after_3)
    torch.save(half.state_dict(), tmp_path / "state.pt")
    resumed = _logged(_loop(2, worker="process"), tmp_path / "resumed", seed=99)
    resumed.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
    history = resumed.train()
    straight = (tmp_path / "straight").read_text().splitlines()
    assert len(straight) == 6
    assert (tmp_path / "resumed").read_text().splitlines() == straight[3:]
    assert [row["staleness/sampler_version"] for row in history[3:]] == [3.0, 3.0, 3.0]


class _FailingPolicy(SequencePolicy):
    """Samples twice, then fails as `how` says: raise, or die as if the kernel killed it."""

    how = "raise"

    def generate_actions(self, states, num_actions_per_state, **kwargs):
        self.calls = getattr(self, "calls", 0) + 1
        if self.calls == 3:
            if self.how == "raise":
                raise KeyError("no such token")
            os.kill(os.getpid(), signal.SIGKILL)
        return super().generate_actions(states, num_actions_per_state, **kwargs)


def test_an_error_in_the_process_is_raised_in_the_trainer_with_its_traceback():
    """The process's third batch (step 2) raises: the trainer gets the same KeyError when it
    waits for that batch, noted with where it came from; steps 0 and 1 were trained, and the
    state saved then resumes at step 2 in a fresh run."""
    loop = _loop(1, policy_class=_FailingPolicy, worker="process")
    with pytest.raises(KeyError, match="no such token") as raised:
        loop.train()
    notes = "\n".join(getattr(raised.value, "__notes__", []))
    assert "raised in the rollout process, sampling step 2" in notes
    assert "generate_actions" in notes  # the process's own traceback
    assert loop.step == 2 and not loop.producer.running
    state = loop.state_dict()  # the state before step 2's draw, sent before the error
    resumed = _loop(1, worker="process")
    resumed.load_state_dict(state)
    assert len(resumed.train()) == 6


def test_a_process_that_dies_is_an_error_naming_its_exit_code_and_the_step_in_flight():
    """Killed (SIGKILL) while sampling step 2: no hang, an error naming the exit code."""
    _FailingPolicy.how = "kill"
    try:
        loop = _loop(1, policy_class=_FailingPolicy, worker="process")
        begin = time.monotonic()
        with pytest.raises(RolloutProcessError, match=r"exited with code -9 while the trainer "
                           r"waited for step 2's batch"):  # fmt: skip
            loop.train()
        assert time.monotonic() - begin < 30
        assert loop.step == 2
    finally:
        _FailingPolicy.how = "raise"


def test_the_process_ignores_ctrl_c_and_exits_when_the_trainer_is_killed(tmp_path):
    """Ctrl-C (SIGINT) is the trainer's to handle: the process lives on. A trainer that then
    dies without closing (os._exit) leaves a process with batches of over 64 KiB to send
    (a pipe's buffer): it sees its parent gone, or its pipe broken, and exits within seconds."""
    script = textwrap.dedent(f"""
        import os, signal, sys, time
        sys.path[:0] = [{str(REPO)!r}, {str(REPO / "tests")!r}]
        from toy_models import SequencePolicy
        from tests.run.test_overlap import _loop

        class Bulky(SequencePolicy):
            @property
            def rollout_metrics(self):  # about 400 kB pickled with every batch
                return {{f"pad/{{i}}": float(i) for i in range(20000)}}

        loop = _loop(1, num_steps=50, policy_class=Bulky, worker="process")
        loop.train_step()
        pid = loop.producer._process.pid
        os.kill(pid, signal.SIGINT)
        time.sleep(1.0)
        print(pid, loop.producer._process.is_alive(), flush=True)
        os._exit(0)
    """)
    out = tmp_path / "out.txt"
    with open(out, "w", encoding="utf-8") as stdout:  # not a pipe the process would hold open
        subprocess.run([sys.executable, "-c", script], stdout=stdout, timeout=120, check=True)
    pid, alive_after_ctrl_c = out.read_text().split()
    assert alive_after_ctrl_c == "True"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and _alive(int(pid)):
        time.sleep(0.1)
    assert not _alive(int(pid))


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def test_settings_a_process_cannot_serve_are_refused_by_name():
    """A worker name outside the table, in the loop and in the run's settings; a process
    with vLLM servers (which sample in processes of their own), before anything loads."""
    from grpo.run.config import RunSettings
    from grpo.run.config_files import load_config
    from grpo.run.structured import ConfigError
    from grpo.run.train import build_loop

    with pytest.raises(ValueError, match=r"run.rollout_worker: got 'fork'; allowed: thread"):
        _loop(1, worker="fork")
    with pytest.raises(ValueError, match=r"run.rollout_worker: got 'fork'"):
        RunSettings(rollout_worker="fork")
    config = load_config(
        str(REPO / "configs" / "demo.yaml"),
        ["run.max_staleness=1", "run.rollout_worker=process", "rollout.engine=vllm_server",
         "rollout.server.urls=[http://127.0.0.1:9]"],
    )  # fmt: skip
    with pytest.raises(ConfigError, match="run.rollout_worker=process with rollout.engine"):
        build_loop(config, lambda config: pytest.fail("the parts were built"))
    config = load_config(
        str(REPO / "configs" / "demo.yaml"),
        ["run.max_staleness=1", "run.rollout_worker=process", "model.device=cuda"],
    )
    with pytest.raises(ConfigError, match="rollout_worker=process with model.device cuda"):
        build_loop(config, lambda config: pytest.fail("the parts were built"))
