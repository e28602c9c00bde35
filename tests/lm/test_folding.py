"""`chunked_output_layer` (grpo.lm.folding): which models fold by default, and that a whole GRPO
step on a large-vocabulary model then makes no (n, T, V) logits tensor anywhere.

The memory guard records the shape of every tensor torch creates (a dispatch mode sees
each op's outputs, forward and backward) and looks at those whose last dimension is V:
one sampling step needs (N, V) and a folded chunk (rows, V); the logits path makes
(n, T + 1, V) per micro-batch, and stacking `generate`'s scores (N, T, V). The guard runs on
the tiny Llama grown to V = AUTO_MIN_VOCAB, and on the tiny Gemma 3 (sliding-window and full
attention, tied embeddings) at Gemma 3's own V = 262,144.
"""

import logging
import math

import pytest
import torch
from tiny_models import load_tiny_causal_lm
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import grpo.functional.output_layer as output_layer
from grpo.config import GRPOConfig
from grpo.lm.engines import RolloutSettings
from grpo.lm.folding import AUTO_MIN_VOCAB, check_folding_mode
from grpo.lm.loading import LoraSettings, apply_lora
from grpo.lm.policy import CausalLMPolicy, CausalLMSettings
from grpo.lm.sampling import GenerationSettings
from grpo.rewards.combine import TextReward
from grpo.step.trainer import GRPOTrainer

PROMPTS = [{"prompt": "say a b"}, {"prompt": "count"}]
G = 4
N = len(PROMPTS) * G  # rows of one sampling step
T = 6  # max_new_tokens
GEMMA3_VOCAB = 262_144
LARGE = {"llama": AUTO_MIN_VOCAB, "gemma3": GEMMA3_VOCAB}
"""The vocabulary each model is scored at: the Llama grown to it, the Gemma 3 built with it."""


class _LastDimShapes(TorchDispatchMode):
    """Records the shape of every tensor an op returns whose last dimension is `size`."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size
        self.shapes: set[tuple[int, ...]] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor) and leaf.dim() and leaf.shape[-1] == self.size:
                self.shapes.add(tuple(leaf.shape))
        return out


def _large_vocab_policy(path, engine: str, V: int, **settings) -> CausalLMPolicy:
    """The tiny model at `path` with a vocabulary of V, grown to it when built smaller (ids
    past the tokenizer decode to '')."""
    model, tokenizer = load_tiny_causal_lm(path)
    torch.manual_seed(0)
    if model.config.vocab_size != V:
        model.resize_token_embeddings(V, mean_resizing=False)
    generation = GenerationSettings(max_new_tokens=T, temperature=0.9, seed=1, top_p=0.9)
    return CausalLMPolicy(
        model, tokenizer, CausalLMSettings(generation, **settings), RolloutSettings(engine)
    )


def _logits_rows(policy: CausalLMPolicy, trainer: GRPOTrainer, V: int) -> dict[tuple, int]:
    """Shapes (..., V) made by one train step and one greedy evaluation, with more than N rows
    (the output weight's transpose (H, V) left out) -> rows of each."""
    H = policy.model.config.hidden_size
    with _LastDimShapes(V) as seen:
        trainer.train_step(PROMPTS)
        policy.generate_actions(PROMPTS, 1, do_sample=False)
    rows = {shape: math.prod(shape[:-1]) for shape in seen.shapes if shape != (H, V)}
    return {shape: r for shape, r in rows.items() if r > N}


def _trainer(policy: CausalLMPolicy) -> GRPOTrainer:
    """KL to a reference (its pass scores too) and top-p sampling (the old-log-prob pass runs)."""
    config = GRPOConfig(group_size=G, batch_size=N, num_epochs_per_update=1, kl_coeff=0.05,
                        entropy_coeff=0.01, skip_zero_advantage=False)  # fmt: skip
    reward = TextReward(lambda prompts, completions, **_: [float(len(c)) for c in completions])
    return GRPOTrainer(policy, reward, None, config)


def _model_dir(tiny_lm_dir, arch: str):
    """The Gemma 3 is built at its vocabulary (a grown embedding would lose its scaling)."""
    return tiny_lm_dir(arch, vocab_size=LARGE[arch] if arch == "gemma3" else None)


@pytest.mark.parametrize(
    ("arch", "engine"), [("llama", "transformers"), ("llama", "lean"), ("gemma3", "transformers")]
)
def test_a_default_step_makes_no_n_t_v_logits(tiny_lm_dir, monkeypatch, arch, engine):
    """With the default settings and V = AUTO_MIN_VOCAB (Llama) or 262,144 (Gemma 3), no tensor
    (..., V) of a train step (rollout with top-p, old-log-prob, reference and gradient passes)
    or of a greedy evaluation holds more than N rows: one sampling step's, or one folded
    chunk's."""
    V = LARGE[arch]
    monkeypatch.setattr(output_layer, "DEFAULT_CHUNK_ELEMENTS", N * V)  # blocks of N rows
    monkeypatch.setattr(output_layer, "CHUNK_ROWS", N)  # one block a chunk
    policy = _large_vocab_policy(_model_dir(tiny_lm_dir, arch), engine, V)
    trainer = _trainer(policy)
    trainer.train_step(PROMPTS)  # the first step runs the one-time checks (one row each)
    assert _logits_rows(policy, trainer, V) == {}


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_the_guard_sees_the_logits_path(tiny_lm_dir, monkeypatch, arch):
    """With chunked_output_layer false the same guard finds (n, T + 1, V) logits: it can fail."""
    V = LARGE[arch]
    monkeypatch.setattr(output_layer, "DEFAULT_CHUNK_ELEMENTS", N * V)
    monkeypatch.setattr(output_layer, "CHUNK_ROWS", N)
    path = _model_dir(tiny_lm_dir, arch)
    policy = _large_vocab_policy(path, "transformers", V, chunked_output_layer=False)
    trainer = _trainer(policy)
    trainer.train_step(PROMPTS)
    big = _logits_rows(policy, trainer, V)
    assert any(len(shape) == 3 and shape[1] > 1 for shape in big), big


def test_auto_equals_the_logits_path_on_a_large_vocabulary(tiny_lm_dir):
    """'auto' at V = AUTO_MIN_VOCAB folds (no model logits called in scoring) and scores as the
    logits path to 1e-5, in log-probs and in the output layer's gradient."""
    V = AUTO_MIN_VOCAB
    auto = _large_vocab_policy(tiny_lm_dir("llama"), "transformers", V)
    plain = CausalLMPolicy(
        auto.model, auto.tokenizer, CausalLMSettings(auto.settings.generation, chunked_output_layer=False)
    )
    actions = [a for group in auto.generate_actions(PROMPTS, G) for a in group]
    results = []
    for policy in (auto, plain):
        policy.model.zero_grad(set_to_none=True)
        out = policy.get_token_log_probabilities([None] * N, actions)
        out.logprobs.sum().backward()
        results.append((out.logprobs.detach(), policy.model.lm_head.weight.grad.clone()))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=1e-4, atol=1e-5)


def test_auto_keeps_the_logits_below_the_threshold(tiny_lm_dir):
    """'auto' with the tiny vocabulary (< AUTO_MIN_VOCAB): the model's forward makes the
    (n, T + 1, V) logits, as with false."""
    model, tokenizer = load_tiny_causal_lm(tiny_lm_dir("llama"))
    V = model.config.vocab_size
    assert V < AUTO_MIN_VOCAB
    policy = CausalLMPolicy(model, tokenizer, CausalLMSettings(GenerationSettings(max_new_tokens=T, seed=2)))
    actions = [a for group in policy.generate_actions(PROMPTS, G) for a in group]
    with torch.no_grad(), _LastDimShapes(V) as seen:
        policy.get_token_log_probabilities([None] * N, actions)
    assert any(len(shape) == 3 and shape[1] > 1 for shape in seen.shapes)


def test_auto_falls_back_where_true_refuses(tiny_lm_dir, caplog):
    """LoRA on the output layer: true raises naming the setting; auto scores with the logits
    and logs why, once."""
    policy = _large_vocab_policy(tiny_lm_dir("llama"), "transformers", AUTO_MIN_VOCAB)
    model = apply_lora(policy.model, LoraSettings(r=4, alpha=8, target_modules=("q_proj", "lm_head")))
    generation = policy.settings.generation
    refusing = CausalLMPolicy(model, policy.tokenizer, CausalLMSettings(generation, chunked_output_layer=True))
    actions = [a for group in refusing.generate_actions(PROMPTS[:1], 2) for a in group]
    with pytest.raises(ValueError, match="chunked_output_layer: needs .* plain nn.Linear"):
        refusing.get_token_log_probabilities([None] * 2, actions)
    auto = CausalLMPolicy(model, policy.tokenizer, CausalLMSettings(generation))
    with caplog.at_level(logging.INFO, logger="grpo.lm.folding"):
        for _ in range(2):
            auto.get_token_log_probabilities([None] * 2, actions)
    logged = [r for r in caplog.records if "chunked_output_layer 'auto'" in r.getMessage()]
    assert len(logged) == 1 and "plain nn.Linear" in logged[0].getMessage()


@pytest.mark.parametrize("value", [None, "yes", 1, "true"])
def test_other_values_are_refused(value):
    """Only true, false and 'auto' are settings."""
    with pytest.raises(ValueError, match="chunked_output_layer: got"):
        check_folding_mode(value)
    with pytest.raises(ValueError, match="chunked_output_layer: got"):
        CausalLMSettings(chunked_output_layer=value)
