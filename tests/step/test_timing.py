"""Step timing: each phase holds exactly its own work, and the phases add up to the step."""

import mmap
import sys
import time
from functools import partial

import pytest
import torch
from toy_models import FunctionReward, TablePolicy

import grpo.step.trainer
from grpo import GRPOConfig, GRPOTrainer
from grpo.distributed import SingleProcess
from grpo.step.timing import PHASES, StepTimer, memory_metrics

TIME_KEYS = ["time/step", *(f"time/{p}" for p in PHASES), "time/other"]


class FakeClock:
    """A clock that moves only when the test's models say they spent time."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def spend(self, seconds: float) -> None:
        self.now += seconds


def test_phases_entered_twice_add_up_and_other_is_the_rest():
    """Phase seconds accumulate over entries; time/other = the step minus the phases, exactly."""
    clock, syncs = FakeClock(), []
    timer = StepTimer(clock, synchronize=lambda: syncs.append(clock.now))
    clock.spend(0.5)  # outside any phase
    for _ in range(2):
        with timer.phase("sampling"):
            clock.spend(2.0)
    with timer.phase("optimizer"):
        clock.spend(4.0)
    clock.spend(0.25)
    timer.count_sampled([type("Completion", (), {"num_tokens": 3})(), "an action"])
    metrics = timer.metrics(SingleProcess())
    assert metrics == {
        "time/step": 8.75,
        "time/sampling": 4.0,
        "time/rewards": 0.0,
        "time/old_logprobs": 0.0,
        "time/loss_backward": 0.0,
        "time/optimizer": 4.0,
        "time/other": 0.75,
        "throughput/tokens_per_s": 4 / 8.75,  # 3 tokens + 1 for an action without num_tokens
        "throughput/samples_per_s": 2 / 8.75,
    }
    assert len(syncs) == 1 + 2 * 3 + 1  # start, both ends of each phase entry, the end


class TimedPolicy(TablePolicy):
    """A table policy whose sampling costs 1 s and each scoring pass 10 s of the fake clock."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(3, 3)
        self.clock = clock

    def generate_actions(self, states, num_actions_per_state, **kwargs):
        self.clock.spend(1.0)
        return super().generate_actions(states, num_actions_per_state, **kwargs)

    def get_log_probabilities(self, states, actions):
        self.clock.spend(10.0)
        return super().get_log_probabilities(states, actions)


def _timed_trainer(monkeypatch, clock: FakeClock, **config) -> GRPOTrainer:
    """A trainer whose step timer reads `clock`: rewards cost 100 s, an optimizer step 1000 s."""
    monkeypatch.setattr(grpo.step.trainer, "StepTimer", partial(StepTimer, clock))
    reward = FunctionReward(lambda s, a: (clock.spend(100.0 / 12), float(a == s))[1])

    def optimizer(params):
        adam = torch.optim.Adam(params, lr=0.1)
        step = adam.step
        adam.step = lambda *args: (clock.spend(1000.0), step(*args))[1]
        return adam

    settings = GRPOConfig(group_size=4, batch_size=12, entropy_coeff=0.0, **config)
    return GRPOTrainer(TimedPolicy(clock), reward, optimizer, settings)


def test_each_phase_of_a_step_holds_exactly_its_own_work(monkeypatch):
    """Hand-counted: 1 s sampling, 100 s rewards, 10 s per scoring pass, 1000 s per optimizer step."""
    clock = FakeClock()
    trainer = _timed_trainer(monkeypatch, clock, num_epochs_per_update=2, skip_zero_advantage=False)
    metrics = trainer.train_step([0, 1, 2])  # N = 12: one mini-batch per epoch, two epochs
    assert {k: metrics[k] for k in TIME_KEYS} == pytest.approx(
        {
            "time/step": 2131.0,
            "time/sampling": 1.0,
            "time/rewards": 100.0,
            "time/old_logprobs": 10.0,  # the no-grad pass for π_old: two epochs can differ
            "time/loss_backward": 20.0,  # one scoring pass per mini-batch, two epochs
            "time/optimizer": 2000.0,
            "time/other": 0.0,
        },
        rel=1e-12,
    )
    assert metrics["throughput/samples_per_s"] == pytest.approx(12 / 2131.0, rel=1e-12)
    assert metrics["throughput/tokens_per_s"] == metrics["throughput/samples_per_s"]


def test_dynamic_sampling_rounds_all_count_as_sampling(monkeypatch):
    """Every round of dynamic sampling is sampling and rewards; the phases still sum to the step."""
    torch.manual_seed(0)  # a first round with a group of equal rewards: a second round
    clock = FakeClock()
    trainer = _timed_trainer(
        monkeypatch, clock, dynamic_sampling=True, dynamic_sampling_max_rounds=2
    )
    metrics = trainer.train_step([0, 1, 2], refill=lambda: [0, 1, 2])
    rounds = metrics["dynamic/rounds"]
    assert rounds == 2
    assert metrics["time/sampling"] == rounds
    assert metrics["time/rewards"] == pytest.approx(100.0 * rounds, rel=1e-12)
    assert metrics["throughput/samples_per_s"] == pytest.approx(
        12 * rounds / metrics["time/step"], rel=1e-12
    )
    phases = sum(metrics[f"time/{p}"] for p in PHASES) + metrics["time/other"]
    assert phases == pytest.approx(metrics["time/step"], rel=1e-12)


def test_with_the_real_clock_the_phases_are_disjoint_parts_of_the_step():
    """With perf_counter, the step lies within the caller's own wall time around it, and its
    phases never overlap: each is >= 0 and time/other (the step minus them) is >= 0."""
    trainer = GRPOTrainer(
        TablePolicy(3, 3),
        FunctionReward(lambda s, a: float(a == s)),
        config=GRPOConfig(group_size=4, batch_size=6, num_epochs_per_update=2, entropy_coeff=0.0),
    )
    begin = time.perf_counter()
    metrics = trainer.train_step([0, 1, 2])
    outside = time.perf_counter() - begin
    assert all(metrics[k] >= 0 for k in TIME_KEYS)  # time/other included
    assert 0 < metrics["time/step"] <= outside


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="resident size from /proc")
def test_the_resident_size_counts_written_pages_and_the_peak_remembers_them():
    """On Linux: 256 MiB reserved but not written leaves the resident size as it was (< 50 MiB
    more); written, it adds at least 200 MiB; freed, they leave it again, while the peak keeps
    them. No CUDA entry without CUDA."""
    mib = 1 / 1024  # in GiB
    before = memory_metrics()
    block = mmap.mmap(-1, 256 * 2**20)  # anonymous: reserved, no page written yet
    reserved = memory_metrics()
    pages = torch.frombuffer(block, dtype=torch.uint8)
    pages.fill_(1)
    written = memory_metrics()
    del pages
    block.close()  # unmapped
    freed = memory_metrics()
    assert reserved["memory/rss_gib"] - before["memory/rss_gib"] < 50 * mib
    assert written["memory/rss_gib"] - reserved["memory/rss_gib"] >= 200 * mib
    assert written["memory/rss_gib"] - freed["memory/rss_gib"] >= 200 * mib
    assert freed["memory/peak_rss_gib"] >= reserved["memory/rss_gib"] + 200 * mib
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        assert "memory/cuda_max_allocated_gib" not in written
