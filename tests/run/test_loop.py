"""Tests for grpo.run.loop: the state sampler, the schedule, evaluation cadence and exact resume."""

from __future__ import annotations

import io
import math

import pytest
import torch
from toy_models import SequencePolicy, token_count_reward

from grpo.config import GRPOConfig
from grpo.run.loop import ScheduleConfig, StateSampler, TrainingLoop, make_optimizer
from grpo.step.trainer import GRPOTrainer

MEASURED = ("time/", "throughput/", "memory/")  # wall time and memory: never reproducible


def test_sampler_covers_every_row_once_per_pass_and_is_seeded():
    """Each pass of the sampler is a permutation of the rows; the same seed gives the same order."""
    rows = [{"prompt": str(i)} for i in range(10)]
    first = StateSampler(rows, 4, seed=3)
    batches = [next(first) for _ in range(5)]  # 20 rows = two full passes
    drawn = [r["prompt"] for b in batches for r in b]
    assert sorted(drawn[:10]) == sorted(drawn[10:]) == [str(i) for i in range(10)]
    again = StateSampler(rows, 4, seed=3)
    assert [next(again) for _ in range(5)] == batches
    with pytest.raises(ValueError, match="batch_size: got 0"):
        StateSampler(rows, 0)
    with pytest.raises(ValueError, match="empty"):
        StateSampler([], 2)


def test_sampler_state_continues_the_same_sequence():
    """A sampler restored from state_dict (mid-pass) draws what the original would have drawn."""
    rows = list(range(7))
    original = StateSampler(rows, 3, seed=5)
    next(original)
    saved = StateSampler(rows, 3, seed=99)
    saved.load_state_dict(original.state_dict())
    assert [next(saved) for _ in range(6)] == [next(original) for _ in range(6)]


def test_sampler_restored_onto_changed_rows_starts_a_fresh_pass():
    """A saved mid-pass order over 7 rows is dropped (with a warning) when 6 rows are loaded."""
    original = StateSampler(list(range(7)), 3, seed=5)
    next(original)
    fewer = StateSampler(list(range(6)), 3, seed=5)
    with pytest.warns(RuntimeWarning, match="has 6 rows, 7 when the checkpoint was written"):
        fewer.load_state_dict(original.state_dict())
    assert sorted(next(fewer) + next(fewer)) == list(range(6))  # a whole pass of the 6 rows


def test_schedule_config_names_bad_fields():
    """ScheduleConfig rejects bad values with the field's dotted name."""
    with pytest.raises(ValueError, match="schedule.num_steps"):
        ScheduleConfig(num_steps=0)
    with pytest.raises(ValueError, match="schedule.lr_scheduler"):
        ScheduleConfig(lr_scheduler="exponential")
    with pytest.raises(ValueError, match="schedule.learning_rate"):
        ScheduleConfig(learning_rate=float("nan"))
    with pytest.raises(ValueError, match="schedule.adam_betas"):
        ScheduleConfig(adam_betas=(0.9, 1.0))


def _loop(num_steps: int, sink=None, eval_every: int = 2, lr_scheduler="cosine") -> TrainingLoop:
    torch.manual_seed(0)
    policy = SequencePolicy(num_states=5, vocab_size=4, max_length=4, seed=1)
    config = GRPOConfig(group_size=4, batch_size=8, num_epochs_per_update=2, kl_coeff=0.1)
    schedule = ScheduleConfig(num_steps=num_steps, learning_rate=0.05, warmup_steps=2,
                              lr_scheduler=lr_scheduler)  # fmt: skip
    trainer = GRPOTrainer(policy, token_count_reward(1), make_optimizer(schedule), config)

    def evaluate():
        with torch.no_grad():
            p = torch.softmax(policy.logits, dim=-1)[..., 1].mean().item()
        return {"eval/p_token_1": p}, [{"prompt": 0, "completion": "-", "reward": p}]

    sampler = StateSampler(list(range(5)), 4, seed=2)
    return TrainingLoop(trainer, sampler, schedule, evaluate=evaluate, eval_every=eval_every,
                        sink=sink)  # fmt: skip


def _without_timing(rows):
    return [{k: v for k, v in row.items() if not k.startswith(MEASURED)} for row in rows]


def test_resumed_loop_ends_bitwise_where_the_uninterrupted_one_does(tmp_path):
    """Stop after 3 of 6 steps, save and load the state in a fresh loop: same parameters, same logs."""
    straight = _loop(6)
    straight.train()

    first = _loop(6)
    stops = []
    first.train(after_step=lambda step: stops.append(step))
    assert stops == [1, 2, 3, 4, 5, 6]

    class Killed(Exception):
        pass

    def kill_after_3(step):
        if step == 3:
            raise Killed

    half = _loop(6)
    with pytest.raises(Killed):
        half.train(after_step=kill_after_3)
    path = tmp_path / "state.pt"
    torch.save(half.state_dict(), path)
    resumed = _loop(6)
    torch.manual_seed(1234)  # the resumed process starts from other global RNG draws
    resumed.load_state_dict(torch.load(path, weights_only=True))
    resumed.train()
    assert torch.equal(resumed.trainer.policy.logits, straight.trainer.policy.logits)
    assert _without_timing(resumed.history) == _without_timing(straight.history)
    assert [e["step"] for e in resumed.evaluations] == [0, 2, 4, 6]
    assert resumed.evaluations == straight.evaluations
    assert resumed.scheduler.get_last_lr() == straight.scheduler.get_last_lr()


def test_evaluations_leave_the_run_as_it_would_be_without_them():
    """An evaluator that samples from the policy (torch's global RNG) after every step changes
    neither the trained parameters nor a logged metric."""
    plain = _loop(4, eval_every=0)
    plain.evaluator = None
    plain.train()
    evaluated = _loop(4, eval_every=1)
    policy = evaluated.trainer.policy
    evaluated.evaluator = lambda: ({"eval/n": len(policy.generate_actions([0, 1, 2], 4))}, [])
    evaluated.train()
    assert [e["step"] for e in evaluated.evaluations] == [0, 1, 2, 3, 4]
    assert torch.equal(policy.logits, plain.trainer.policy.logits)
    assert _without_timing(evaluated.history) == _without_timing(plain.history)


def test_lr_warms_up_then_decays_and_metrics_reach_the_sink():
    """Step s runs at the scheduled rate; every step and evaluation record reaches the sink once."""
    records = []
    loop = _loop(4, sink=records, eval_every=0)
    loop.train()
    lrs = [row["lr"] for row in records if "lr" in row]
    peak = 0.05
    cosine = [peak * 0.5 * (1 + math.cos(math.pi * (s - 2) / 2)) for s in (2, 3)]
    assert lrs == pytest.approx([0.0, peak / 2, *cosine], rel=1e-12)
    assert [row["step"] for row in records] == [0, 1, 2, 3, 4, 4]
    assert "eval/samples" in records[0] and "reward/mean" in records[1]
    first = records[1]["reward/mean"]
    assert all(row["reward/start"] == first for row in records[1:5])
    assert records[4]["reward/change"] == pytest.approx(records[4]["reward/mean"] - first)
    assert 0.0 <= records[1]["loss/kl_share"] <= 1.0


@pytest.mark.parametrize(
    ("name", "factor"),
    [
        ("constant", lambda s: min(1.0, s / 2)),
        ("linear", lambda s: s / 2 if s < 2 else (6 - s) / 4),
        ("cosine", lambda s: s / 2 if s < 2 else 0.5 * (1 + math.cos(math.pi * (s - 2) / 4))),
    ],
)
def test_learning_rate_follows_each_schedule(name, factor):
    """Step s runs at lr * factor(s): linear warm-up over 2 steps, then constant, linear or cosine."""
    loop = _loop(6, eval_every=0, lr_scheduler=name)
    lrs = [record["lr"] for record in loop.train()]
    assert lrs == pytest.approx([0.05 * factor(s) for s in range(6)], rel=1e-6, abs=1e-12)


def test_progress_sink_prints_evaluations_on_their_own_line():
    """An evaluation record is written as one 'eval at step k' line with its numbers."""
    from grpo.run.metrics import ProgressLogger

    stream = io.StringIO()
    progress = ProgressLogger(total_steps=2, every=1, stream=stream)
    progress.log({"eval/greedy/accuracy": 0.25, "eval/samples": []}, 0)
    progress.log({"reward/mean": 0.5, "step_loss": 0.1}, 1)
    lines = stream.getvalue().splitlines()
    assert lines[0] == "eval at step 0: greedy/accuracy=0.25"
    assert lines[1].startswith("step 1/2 reward=0.5 step_loss=0.1")
