"""grpo.step.staleness: which weights sample which step, and what a step reports (by hand)."""

import pytest

from grpo.step.staleness import (
    StalenessLog,
    admitted,
    sampling_version,
    staleness,
    staleness_metrics,
    steps_ahead,
)


def test_sampling_version_is_k_behind_and_never_before_the_start():
    """Step s samples with version max(s - k, first): k = 0 is the synchronous step."""
    assert [sampling_version(s, 0) for s in range(4)] == [0, 1, 2, 3]
    assert [sampling_version(s, 1) for s in range(4)] == [0, 0, 1, 2]
    assert [sampling_version(s, 2) for s in range(5)] == [0, 0, 0, 1, 2]
    # a run resumed at step 10 has only version 10's weights: its first k steps are fresh
    assert [sampling_version(s, 2, first_version=10) for s in range(10, 14)] == [10, 10, 10, 11]


def test_staleness_is_the_version_gap_and_refuses_a_future_sampler():
    """staleness(trainer, sampler) = trainer - sampler; a sampler ahead of the trainer is an error."""
    assert staleness(5, 5) == 0 and staleness(5, 3) == 2
    with pytest.raises(ValueError, match="newer than trainer_version"):
        staleness(3, 4)


def test_admitted_keeps_exactly_the_groups_within_the_bound():
    """At version 7 with k = 2, groups of versions 5..7 are admitted, 4 and older are not."""
    assert admitted(7, [7, 6, 5, 4, 0], 2) == [True, True, True, False, False]
    assert admitted(7, [7, 6], 0) == [True, False]


def test_every_scheduled_step_is_admitted_and_at_most_k_stale():
    """The schedule of sampling_version never produces a group older than k (k = 0..3)."""
    for k in range(4):
        for first in (0, 3):
            for step in range(first, first + 20):
                version = sampling_version(step, k, first)
                assert admitted(step, [version], k) == [True]
                assert staleness(step, version) == min(k, step - first)


def test_steps_ahead_counts_the_batches_not_yet_trained_on():
    """With the trainer at version 4 and the sampler about to draw step 6: steps 4 and 5 ahead."""
    assert steps_ahead(6, 4) == 2 and steps_ahead(4, 4) == 0


def test_metrics_of_a_hand_made_log():
    """Mean and max over the trained groups' staleness; both waits reported as given."""
    log = StalenessLog(trained=[0, 1, 1, 2], wait_samples=0.25, wait_weights=1.5)
    assert staleness_metrics(log) == {
        "staleness/mean": 1.0,
        "staleness/max": 2.0,
        "time/wait_samples": 0.25,
        "time/wait_weights": 1.5,
    }
    assert staleness_metrics(StalenessLog())["staleness/mean"] == 0.0  # nothing trained yet
