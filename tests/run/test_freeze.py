"""model.freeze: the matched parameters leave a training run exactly as loaded (a tied
embedding with its output layer), everything else trains, and the optimizer holds no state
for them; a pattern that matches nothing is refused by name."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from grpo.cli import main as grpo
from grpo.lm.loading import freeze_parameters
from grpo.lm.policy import CausalLMPolicy
from grpo.run.rundir import read_checkpoint

DEMO_MODEL = Path(__file__).resolve().parents[2] / "grpo" / "assets" / "arith-tiny"


def _train(tmp_path: Path, freeze: str) -> Path:
    run = tmp_path / "run"
    config = tmp_path / "tiny.yaml"
    config.write_text(textwrap.dedent(f"""
        model: {{path: {DEMO_MODEL}, device: cpu, use_reference: false, freeze: {freeze}}}
        task: {{name: arithmetic, train_size: 16, eval_size: 4}}
        prompts_per_step: 2
        grpo: {{group_size: 4, batch_size: 8, kl_coeff: 0.0}}
        policy: {{generation: {{max_new_tokens: 4}}}}
        schedule: {{num_steps: 2, learning_rate: 0.05}}
        evaluation: {{modes: [greedy], every: 0}}
        run: {{threads: 1, dir: {run}, checkpoint_every: 2}}
    """))
    assert grpo(["train", str(config)]) == 0
    return run


def test_a_frozen_tied_embedding_leaves_training_exactly_as_loaded(tmp_path):
    """The embedding (tied to the output layer) ends as loaded, every other weight moved, and
    the checkpoint's Adam state covers exactly the other weights."""
    before = load_file(DEMO_MODEL / "model.safetensors")
    run = _train(tmp_path, '["model.embed_tokens.*"]')
    after = load_file(run / "final" / "model.safetensors")
    embedding = "model.embed_tokens.weight"
    assert torch.equal(after[embedding], before[embedding])  # also the tied output layer
    changed = [k for k in before if k != embedding and not torch.equal(after[k], before[k])]
    assert len(changed) == len(before) - 1  # every other weight took the updates
    optimizer = read_checkpoint(run / "checkpoints" / "step-000002")["trainer"]["optimizer"]
    shapes = sorted(tuple(state["exp_avg"].shape) for state in optimizer["state"].values())
    assert shapes == sorted(tuple(before[k].shape) for k in before if k != embedding)


def test_only_the_unfrozen_parameters_are_trainable():
    """A frozen tied embedding leaves the policy's trainable parameters, output layer included."""
    policy = CausalLMPolicy.from_pretrained(str(DEMO_MODEL), freeze=("model.embed_tokens.*",))
    trainable = policy.get_parameters()
    assert "model.embed_tokens.weight" not in trainable
    total = sum(p.numel() for p in policy.model.parameters())
    embedding = policy.model.get_input_embeddings().weight
    assert policy.model.get_output_embeddings().weight is embedding  # tied: frozen together
    assert sum(p.numel() for p in trainable.values()) == total - embedding.numel()


def test_a_pattern_that_matches_nothing_is_refused_by_name():
    """A freeze pattern that matches no parameter is an error naming the key and the pattern."""
    policy = CausalLMPolicy.from_pretrained(str(DEMO_MODEL))
    with pytest.raises(ValueError, match=r"model.freeze: 'embed\*' matches no parameter"):
        freeze_parameters(policy.model, ("embed*",), "model.freeze")
