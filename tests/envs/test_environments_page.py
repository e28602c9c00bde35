"""docs/environments.md's code, run as written on a tiny causal LM: the page's snippets work."""

import math
import re
from pathlib import Path

import pytest
from tiny_models import build_tiny_causal_lm, load_tiny_causal_lm

from grpo.lm.policy import CausalLMPolicy, CausalLMSettings
from grpo.lm.sampling import GenerationSettings

PAGE = Path(__file__).resolve().parents[2] / "docs" / "environments.md"


def test_the_pages_python_blocks_run_in_order(tmp_path):
    """Every ```python block of the page, in order, in one namespace holding `policy`: the
    environment plays, eight episodes come back, and a training step runs on them."""
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.DOTALL)
    assert len(blocks) == 3
    model, tokenizer = load_tiny_causal_lm(build_tiny_causal_lm(tmp_path / "m", arch="qwen2", max_positions=512))
    settings = CausalLMSettings(GenerationSettings(max_new_tokens=3, seed=0))
    namespace = {"policy": CausalLMPolicy(model, tokenizer, settings)}
    for block in blocks:
        exec(compile(block, str(PAGE), "exec"), namespace)  # noqa: S102 - the page's own code
    rollouts = namespace["rollouts"]
    assert len(rollouts) == 8 and all(1 <= r.turns <= 5 for r in rollouts)
    assert all(r.total_reward == pytest.approx(sum(r.rewards)) for r in rollouts)
    metrics = namespace["metrics"]
    assert metrics["total_samples"] == 32.0 and math.isfinite(metrics["step_loss"])
    env = namespace["Countdown"](2)
    env.reset()
    assert env.step("2") == ("go on", False) and env.step("1") == (None, True)
    assert env.reward() == 1.0
