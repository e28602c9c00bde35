"""Every engine samples only what `GenerationSettings` say, never a checkpoint's own defaults.

A copy of a tiny model whose `generation_config.json` sets every kind of sampling
knob must sample, with the same seed, exactly what the clean model samples, and
report the same log-probs; and a rollout warns about nothing.
"""

import logging
import types
import warnings

import pytest
import torch
from tiny_models import load_tiny_causal_lm
from transformers import AutoModelForCausalLM
from transformers.utils import logging as hf_logging

from grpo.lm.engines import RolloutSettings
from grpo.lm.policy import CausalLMPolicy, CausalLMSettings
from grpo.lm.sampling import GenerationSettings

PROMPTS = [{"prompt": "say a"}, {"prompt": "count b c"}, {"prompt": "red"}]


def dirty_copy(clean, folder):
    """The clean model saved again with sampling defaults in its generation_config.json."""
    model, tokenizer = load_tiny_causal_lm(clean)
    ids = tokenizer(" a b c yes no red blue")["input_ids"]
    defaults = {
        "do_sample": True,
        "min_p": 0.3,
        "suppress_tokens": ids[:2],
        "bad_words_ids": [[ids[2]], [ids[3], ids[4]]],
        "sequence_bias": [[[ids[5]], 4.0]],
        "repetition_penalty": 1.7,
        "temperature": 0.3,
        "top_k": 7,
        "top_p": 0.6,
    }
    for name, value in defaults.items():
        setattr(model.generation_config, name, value)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    reloaded = AutoModelForCausalLM.from_pretrained(folder).generation_config
    assert reloaded.suppress_tokens == ids[:2] and reloaded.min_p == 0.3  # it ships them
    return folder


def rollout(path, engine, **generation):
    model, tokenizer = load_tiny_causal_lm(path)
    settings = GenerationSettings(**{"max_new_tokens": 6, "temperature": 0.9, **generation})
    policy = CausalLMPolicy(
        model, tokenizer, CausalLMSettings(settings), rollout=RolloutSettings(engine=engine)
    )
    groups = policy.generate_actions(PROMPTS, 4)
    return [(c.completion_ids, c.engine_logprobs) for group in groups for c in group]


@pytest.mark.parametrize(
    ("arch", "engine"), [("qwen2", "transformers"), ("gpt2", "transformers"), ("llama", "lean")]
)
@pytest.mark.parametrize("generation", [{}, {"top_k": 20, "top_p": 0.95}, {"do_sample": False}])
def test_checkpoint_sampling_defaults_change_nothing(
    tiny_lm_dir, tmp_path, arch, engine, generation
):
    """Same seed: the checkpoint with sampling defaults samples the clean one's tokens exactly,
    with the same reported log-probs (truncated sampling reports them)."""
    clean = tiny_lm_dir(arch)
    dirty = dirty_copy(clean, tmp_path / "dirty")
    expected = rollout(clean, engine, **generation)
    assert rollout(dirty, engine, **generation) == expected
    assert len({ids for ids, _ in expected}) > 1 or not generation.get("do_sample", True)


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records = []

    def emit(self, record):
        self.records.append(record)


def test_a_rollout_warns_about_nothing(tiny_lm_dir, tmp_path, recwarn):
    """No Python warning and no transformers warning (e.g. generation_config passed together with
    generation arguments) in a rollout, truncated or not, from a checkpoint with defaults."""
    dirty = dirty_copy(tiny_lm_dir("qwen2"), tmp_path / "dirty")
    hf_logging.warning_once.cache_clear()  # transformers warns once per process otherwise
    handler = _Records()
    logger = logging.getLogger("transformers")
    logger.addHandler(handler)
    try:
        warnings.simplefilter("always")
        recwarn.clear()
        for generation in ({}, {"top_k": 20}):
            rollout(dirty, "transformers", **generation)
    finally:
        logger.removeHandler(handler)
    assert [str(w.message) for w in recwarn] == []
    assert [r.getMessage() for r in handler.records] == []


def test_vllm_is_built_without_the_checkpoints_sampling_defaults():
    """vLLM gets generation_config="vllm" (its neutral defaults, no generation_config.json read),
    and engine_kwargs cannot set it back."""
    from grpo.lm.engines.settings import VLLMSettings
    from grpo.lm.engines.vllm import VLLMEngine

    for on_cpu in (False, True):
        engine = types.SimpleNamespace(
            settings=VLLMSettings(), dtype=torch.float32, sleeps=False, on_cpu=on_cpu
        )
        assert VLLMEngine._llm_args(engine)["generation_config"] == "vllm"  # what LLM(...) gets
    with pytest.raises(ValueError, match="generation_config"):
        VLLMSettings(engine_kwargs={"generation_config": "auto"})
