"""grpo.run.overlap: overlapped rollouts keep their staleness bound, stamp their versions and
leave max_staleness 0 without a thread; resuming re-samples what was queued."""

from __future__ import annotations

import gc
import json
import threading
import time
import weakref
from pathlib import Path

import pytest
import torch
from toy_models import SequencePolicy, token_count_reward

from grpo.cli import main
from grpo.config import GRPOConfig
from grpo.rewards.combine import RewardError, TextReward
from grpo.run.loop import ScheduleConfig, StateSampler, TrainingLoop, make_optimizer
from grpo.step.trainer import GRPOTrainer

REPO = Path(__file__).resolve().parents[2]
SHORT = ["task.train_size=96", "task.eval_size=8", "run.tensorboard=false", "evaluation.every=0"]


def _loop(
    max_staleness: int, num_steps: int = 6, policy_class: type = SequencePolicy,
    worker: str = "thread", tis_cap: float | None = None, reward: object = None, **grpo: object,
) -> TrainingLoop:  # fmt: skip
    torch.manual_seed(0)
    policy = policy_class(num_states=5, vocab_size=4, max_length=4, seed=1)
    config = GRPOConfig(group_size=4, batch_size=8, num_epochs_per_update=2, kl_coeff=0.1, **grpo)
    schedule = ScheduleConfig(num_steps=num_steps, learning_rate=0.05)
    reward = token_count_reward(1) if reward is None else reward
    trainer = GRPOTrainer(policy, reward, make_optimizer(schedule), config)
    trainer.objective.tis_cap = tis_cap  # as grpo.run.train sets rollout.tis_cap
    sampler = StateSampler(list(range(5)), 4, seed=2)
    return TrainingLoop(
        trainer, sampler, schedule, max_staleness=max_staleness, rollout_worker=worker
    )


@pytest.mark.parametrize("worker", ["thread", "process"])
@pytest.mark.parametrize("k", [1, 2])
def test_each_step_is_sampled_k_versions_back_and_never_older(k, worker):
    """Step s trains on groups of version max(s - k, 0): staleness min(s, k) <= k."""
    history = _loop(k, worker=worker).train()
    versions = [row["staleness/sampler_version"] for row in history]
    assert versions == [float(max(s - k, 0)) for s in range(6)]
    assert [row["staleness/max"] for row in history] == [float(min(s, k)) for s in range(6)]
    assert all(row["staleness/mean"] == row["staleness/max"] for row in history)  # one version
    stale = [row for s, row in enumerate(history) if s > 0 and versions[s] < s]
    assert stale and all("importance_weight/mean" in row for row in stale)  # decoupled loss


class _TooOld:
    """A producer stand-in that delivers each step's batch sampled with version 0."""

    def __init__(self, producer):
        self.producer = producer
        self.k, self.running = producer.k, True

    def next_batch(self, step):
        from grpo.run.stamped import sample_stamped

        p = self.producer
        batch = sample_stamped(p.policy, p.reward_model, next(p.sampler), p.G, step, 0)
        batch.metrics["time/wait_weights"] = 0.0
        return batch, 0.0

    def publish(self, version):
        return 0.0


def test_a_batch_older_than_the_bound_stops_the_run_naming_the_step():
    """A batch k + 1 versions old is refused where it would be trained on: an error naming the
    step and the version, no update, and no metric counting dropped groups (none are dropped)."""
    loop = _loop(1)
    loop.producer, real = _TooOld(loop.producer), loop.producer
    history = [loop.train_step()]  # step 0 from version 0: staleness 0
    history.append(loop.train_step())  # step 1 from version 0: staleness 1 = k
    before = loop.trainer.policy.logits.detach().clone()
    with pytest.raises(RuntimeError, match=r"step 2 got groups sampled with version 0, more "
                       r"than max_staleness=1 versions old"):  # fmt: skip
        loop.train_step()
    assert torch.equal(loop.trainer.policy.logits, before)  # refused before any update
    assert not any("dropped" in key for row in history for key in row)
    real.close()


class _RecordingPolicy(SequencePolicy):
    """A policy whose sampler records a log-prob with each action it draws (as vLLM and top-p
    engines do): here -50 for every token, far from the truth, so the loss shows it used them."""

    def sampler_logprobs(self, actions):
        T = max(len(a) for a in actions)
        return torch.full((len(actions), T), -50.0)


@pytest.mark.parametrize("worker", ["thread", "process"])
def test_a_stale_batch_is_weighed_against_the_log_probs_its_sampler_recorded(worker):
    """Stale batches are scored by the sampler's copy only where the sampler recorded nothing:
    the recording policy's stale steps spend no scoring time and are weighed against the
    recorded log-probs, min(π_old / e^-50, tis_cap) = tis_cap on every token; the plain
    policy's are scored and weighed around 1. Both report the gap and the capped share."""
    plain = _loop(1, worker=worker, tis_cap=2.0).train()
    recording = _loop(1, policy_class=_RecordingPolicy, worker=worker, tis_cap=2.0).train()
    for history in (plain, recording):
        assert [row["staleness/max"] for row in history] == [0.0] + [1.0] * 5
        assert all("rollout/logprob_gap_mean" in row for row in history[1:])
    assert all(row["time/sampler/logprobs"] > 0 for row in plain[1:])
    assert all(row["time/sampler/logprobs"] == 0.0 for row in recording[1:])
    assert all(row["importance_weight/mean"] == pytest.approx(2.0) for row in recording[1:])
    assert all(row["rollout/tis_capped_frac"] == 1.0 for row in recording[1:])
    assert all(row["rollout/logprob_gap_max"] > 40.0 for row in recording[1:])
    assert all(0.5 < row["importance_weight/mean"] < 1.5 for row in plain[1:])
    assert all(row["rollout/tis_capped_frac"] < 0.5 for row in plain[1:])
    # scored by the sampler's copy, one version behind the trainer: a gap, weights not all 1
    assert all(row["rollout/logprob_gap_max"] > 0.0 for row in plain[1:])
    assert all(row["importance_weight/mean"] != 1.0 for row in plain[1:])


@pytest.mark.parametrize("worker", ["thread", "process"])
def test_an_overlapped_run_is_reproducible_from_its_seed(worker):
    """Two runs with max_staleness 1 end with the same weights: versions, not timing, decide."""
    first = _loop(1, worker=worker)  # each seeds torch's generator, which the toy samples from
    first.train()
    second = _loop(1, worker=worker)
    second.train()
    assert torch.equal(first.trainer.policy.logits, second.trainer.policy.logits)


def test_a_process_samples_what_a_thread_samples():
    """The process draws from its fork of torch's generator as the thread draws from the
    generator itself (the trainer draws none): the same batches, the same final weights,
    for k = 1 and 2; so the worker changes where sampling runs, not what it samples."""
    for k in (1, 2):
        thread = _loop(k, worker="thread")  # seeds torch's generator: built just before use
        thread_history = thread.train()
        process = _loop(k, worker="process")
        process_history = process.train()
        assert torch.equal(thread.trainer.policy.logits, process.trainer.policy.logits)
        for a, b in zip(thread_history, process_history, strict=True):
            assert a["reward/mean"] == b["reward/mean"]


def test_overlap_changes_the_run_and_max_staleness_0_starts_no_thread():
    """k = 0 has no producer and no extra thread; k = 1 trains on other samples than k = 0.
    (Threads are compared by identity: one an earlier test left may end during this one.)"""
    before = set(threading.enumerate())
    sync = _loop(0)
    started = []
    sync.train(after_step=lambda step: started.append(set(threading.enumerate()) - before))
    assert sync.producer is None and started == [set()] * 6
    overlapped = _loop(1)
    during = []
    overlapped.train(after_step=lambda step: during.append(set(threading.enumerate()) - before))
    assert overlapped.producer is not None and during[0]  # the producer's thread ran
    assert not torch.equal(sync.trainer.policy.logits, overlapped.trainer.policy.logits)
    assert not set(threading.enumerate()) - before  # the producer's thread ended with the run


def test_settings_overlap_cannot_serve_are_refused_by_name():
    """Dynamic sampling's extra rounds cannot be sampled ahead: named in the error."""
    with pytest.raises(ValueError, match=r"run.max_staleness=1 with grpo.dynamic_sampling"):
        _loop(1, dynamic_sampling=True)
    with pytest.raises(ValueError, match="run.max_staleness"):
        _loop(-1)


class Killed(Exception):
    """The run stopped from outside."""


def kill_after_3(step: int) -> None:
    """`after_step` of a run killed once step 3 is done."""
    if step == 3:
        raise Killed


class _LoggedSampler(StateSampler):
    """A StateSampler that records every batch it draws."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.drawn = []

    def __next__(self):
        self.drawn.append(super().__next__())
        return self.drawn[-1]


def test_an_interrupted_overlapped_loop_resumes_by_drawing_the_queued_prompts_again(tmp_path):
    """Killed after step 3 of 6 with k = 2 (batches 4, 5 drawn ahead): the saved state draws the
    prompts of steps 3..5 again, as the uninterrupted run drew them."""
    straight = _loop(2)
    straight.sampler = straight.producer.sampler = _LoggedSampler(list(range(5)), 4, seed=2)
    straight.train()
    half = _loop(2)
    with pytest.raises(Killed):
        half.train(after_step=kill_after_3)
    torch.save(half.state_dict(), tmp_path / "state.pt")
    resumed = _loop(2)
    resumed.sampler = resumed.producer.sampler = _LoggedSampler(list(range(5)), 4, seed=99)
    resumed.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
    history = resumed.train()
    assert resumed.sampler.drawn == straight.sampler.drawn[3:]
    assert [row["staleness/sampler_version"] for row in history[3:]] == [3.0, 3.0, 3.0]


def _rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if "staleness/sampler_version" in row]


@pytest.mark.parametrize("worker", ["thread", "process"])
def test_the_demo_overlapped_stamps_versions_and_resume_resamples_the_queue(
    tmp_path, monkeypatch, worker
):
    """configs/demo.yaml with max_staleness 2 (lean engine, 4 steps): versions max(s - 2, 0);
    resumed from step 2's checkpoint, steps 2 and 3 are sampled again with version 2."""
    monkeypatch.chdir(REPO)  # the demo names its model by a path relative to the repository
    sets = [*SHORT, "run.max_staleness=2", "schedule.num_steps=4", "run.checkpoint_every=2"]
    sets.append(f"run.rollout_worker={worker}")
    args = [arg for item in [*sets, f"run.dir={tmp_path / 'run'}"] for arg in ("--set", item)]
    assert main(["train", "configs/demo.yaml", *args]) == 0
    rows = _rows(tmp_path / "run")
    assert [row["staleness/sampler_version"] for row in rows] == [0.0, 0.0, 0.0, 1.0]
    (tmp_path / "run" / "checkpoints" / "step-000004").rename(tmp_path / "later")
    assert main(["train", "--resume", str(tmp_path / "run")]) == 0
    resumed = _rows(tmp_path / "run")
    assert [row["staleness/sampler_version"] for row in resumed] == [0.0, 0.0, 2.0, 2.0]
    assert resumed[:2] == rows[:2]  # the log before the checkpoint is kept as it was


def test_in_process_vllm_with_overlap_is_refused_before_anything_loads():
    """The in-process vLLM engine cannot be copied for a sampling thread: refused naming both
    settings (servers can: tests/lm/engines/test_vllm_server.py)."""
    from grpo.run.config_files import load_config
    from grpo.run.structured import ConfigError
    from grpo.run.train import build_loop

    config = load_config(
        str(REPO / "configs" / "demo.yaml"), ["run.max_staleness=1", "rollout.engine=vllm"]
    )
    with pytest.raises(ConfigError, match="run.max_staleness=1 with rollout.engine vllm:"):
        build_loop(config, lambda config: pytest.fail("the parts were built"))


def _cache_on() -> bool:
    from grpo.precision import compute_precision

    with compute_precision("bf16-mixed", "cpu"):
        return torch.is_autocast_cache_enabled()


@pytest.mark.parametrize(("worker", "while_running"), [("thread", False), ("process", True)])
def test_a_sampling_thread_runs_autocast_without_its_weight_cache(worker, while_running):
    """grpo.precision: the weight cache, which a second thread's autocast disturbs, is off
    for every bf16 forward from the sampling thread's start to its close, then on again; a
    process (its own autocast state) leaves it on."""
    assert _cache_on()
    seen = []
    _loop(1, worker=worker).train(after_step=lambda step: seen.append(_cache_on()))
    assert seen == [while_running] * 6
    assert _cache_on()


def _until(condition, seconds: float = 30.0) -> None:
    """Wait for `condition()` (polling), failing the test after `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


class _GatedPolicy(SequencePolicy):
    """Counts every batch drawn (its class holds the count: the producer samples with a deep
    copy); from the second draw on, a draw ends only once the producer is closing, so that
    close() is always asked while a batch is being sampled."""

    draws: list[int] = []
    producer = None

    def generate_actions(self, states, num_actions_per_state, **kwargs):
        cls = type(self)
        cls.draws.append(len(states))
        if len(cls.draws) >= 2:
            _until(lambda: cls.producer.closing)
        return super().generate_actions(states, num_actions_per_state, **kwargs)


def test_after_close_the_thread_draws_no_further_batch():
    """k = 4, an error in step 0's update while step 1's batch is being drawn: the run stops
    with that error, and the thread finishes the batch in hand but draws none of steps 2-4,
    whose weights (version 0) it holds already: 2 draws, not 5."""
    _GatedPolicy.draws = []
    loop = _loop(4, policy_class=_GatedPolicy)
    _GatedPolicy.producer = loop.producer

    def fail(*args, **kwargs):
        _until(lambda: len(_GatedPolicy.draws) == 2)  # step 1's batch is being drawn
        raise RuntimeError("update failed")

    loop.trainer.train_step = fail
    with pytest.raises(RuntimeError, match="update failed"):
        loop.train()
    assert not loop.producer.running and len(_GatedPolicy.draws) == 2


def test_close_frees_the_sampling_threads_copy_of_the_policy():
    """The thread samples with a deep copy of the policy; once closed, nothing holds it."""
    loop = _loop(1)
    loop.train_step()
    copy = weakref.ref(loop.producer.sampling_policy)
    assert copy() is not None and copy() is not loop.trainer.policy
    loop.close()
    gc.collect()
    assert copy() is None and loop.producer.sampling_policy is None


@pytest.mark.parametrize("worker", ["thread", "process"])
def test_a_loop_driven_step_by_step_stops_its_worker_at_the_end_of_a_with_block(worker):
    """`with TrainingLoop(...) as loop: loop.train_step()`: the worker runs inside the block and
    is stopped at its end (an exception leaving the block stops it too)."""
    before = threading.active_count()
    with _loop(1, worker=worker) as loop:
        loop.train_step()
        loop.train_step()
        assert loop.producer.running and threading.active_count() > before
    assert not loop.producer.running
    _until(lambda: threading.active_count() == before, 10.0)  # a process's pipe threads end
    with pytest.raises(KeyError), _loop(1, worker=worker) as loop:
        loop.train_step()
        raise KeyError("stop")
    assert not loop.producer.running
    _until(lambda: threading.active_count() == before, 10.0)


def spins_on_state_2(prompts, completions, **_):
    """Reward 0, after spinning in Python for up to 20 s on prompt 2 (a hanging reward)."""
    for prompt in prompts:
        deadline = time.monotonic() + 20.0
        while prompt == 2 and time.monotonic() < deadline:
            pass
    return [0.0] * len(prompts)


@pytest.mark.parametrize("worker", ["thread", "process"])
def test_a_reward_that_hangs_in_the_rollout_worker_stops_the_run_with_one_error(worker):
    """Rewards run in the worker's thread (math-verify's signal-based timeouts could not): a
    reward past its timeout there is stopped, and the trainer raises one RewardError naming
    the function and the sample it hangs on."""
    reward = TextReward(spins_on_state_2, timeout_seconds=0.3)
    begin = time.monotonic()
    with pytest.raises(RewardError, match=r"^reward function 'spins_on_state_2' ran longer than "
                       r"its 0.3 s on sample \d+ \(prompt '2'\)"):  # fmt: skip
        _loop(1, worker=worker, reward=reward).train()
    assert time.monotonic() - begin < 15.0


def test_the_demo_overlapped_with_top_p_reports_the_gap_on_every_step(tmp_path, monkeypatch):
    """configs/demo.yaml with top_p 0.9, rollout.tis_cap 2 and max_staleness 1: every step's row
    has the sampler-trainer gap and the capped share, fresh step 0 (the engine's log q against
    π_old of the same weights) as the stale ones (against the older weights' log q)."""
    monkeypatch.chdir(REPO)
    sets = [*SHORT, "run.max_staleness=1", "schedule.num_steps=3", "run.checkpoint_every=0",
            "policy.generation.top_p=0.9", "rollout.tis_cap=2.0", f"run.dir={tmp_path / 'run'}"]  # fmt: skip
    assert main(["train", "configs/demo.yaml", *[a for s in sets for a in ("--set", s)]]) == 0
    rows = _rows(tmp_path / "run")
    assert [row["staleness/max"] for row in rows] == [0.0, 1.0, 1.0]
    for row in rows:
        assert 0 < row["rollout/logprob_gap_mean"] <= row["rollout/logprob_gap_max"]
        assert 0 <= row["rollout/tis_capped_frac"] <= 1
