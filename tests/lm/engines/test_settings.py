"""Tests for grpo.lm.engines.settings: defaults, validation naming the field, YAML-style mappings."""

import pytest

from grpo.lm.engines import ENGINE_NAMES, ROLLOUT_ENGINES, RolloutSettings, VLLMSettings


def test_defaults_keep_the_transformers_engine():
    """The default rollout is today's transformers generate; vLLM defaults share weights and check."""
    rollout = RolloutSettings()
    assert rollout.engine == "transformers"
    assert rollout.vllm.weight_sync == "auto"
    assert rollout.vllm.check_weights is True
    assert rollout.vllm.tis_cap is None


def test_every_engine_name_has_a_constructor():
    """The names settings accept are exactly the keys of the engine table."""
    assert set(ENGINE_NAMES) == set(ROLLOUT_ENGINES)


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("gpu_memory_utilization", 0.0, "vllm.gpu_memory_utilization"),
        ("gpu_memory_utilization", 1.0, "vllm.gpu_memory_utilization"),
        ("gpu_memory_utilization", True, "vllm.gpu_memory_utilization"),
        ("max_model_len", 0, "vllm.max_model_len"),
        ("max_model_len", 2.5, "vllm.max_model_len"),
        ("dtype", "int8", "vllm.dtype"),
        ("weight_sync", "nccl", "vllm.weight_sync"),
        ("sleep_between_rollouts", 1, "vllm.sleep_between_rollouts"),
        ("check_weights", "yes", "vllm.check_weights"),
        ("probe_tolerance", 0.0, "vllm.probe_tolerance"),
        ("probe_tolerance", float("nan"), "vllm.probe_tolerance"),
        ("probe_tolerance", True, "vllm.probe_tolerance"),
        ("tis_cap", 0.5, "vllm.tis_cap"),
        ("tis_cap", float("inf"), "vllm.tis_cap"),
        ("engine_kwargs", ["max_num_seqs"], "vllm.engine_kwargs"),
        ("engine_kwargs", {"load_format": "auto"}, "load_format"),
        ("engine_kwargs", {"enforce_eager": False}, "enforce_eager"),
    ],
)
def test_vllm_settings_name_the_bad_field(field, value, match):
    """Each invalid value raises a ValueError naming the field (and the got/allowed values)."""
    with pytest.raises(ValueError, match=match) as info:
        VLLMSettings(**{field: value})
    assert "got" in str(info.value) and "allowed" in str(info.value)


@pytest.mark.parametrize(
    "key", ["quantization", "cpu_offload_gb", "speculative_config", "compilation_config"]
)
def test_engine_kwargs_that_change_the_weights_are_refused_by_name(key):
    """An LLM argument that would make vLLM hold other weights than the trainer's is an error
    naming the key and why; other arguments pass."""
    with pytest.raises(ValueError, match=rf"vllm\.engine_kwargs: got '{key}', but .+") as info:
        VLLMSettings(engine_kwargs={key: 1})
    assert "trainer's weights" in str(info.value) and "allowed" in str(info.value)
    assert VLLMSettings(engine_kwargs={"max_num_seqs": 8}).engine_kwargs == {"max_num_seqs": 8}


def test_engine_name_is_checked():
    """An unknown engine is named with the allowed ones."""
    with pytest.raises(
        ValueError, match=r"rollout\.engine: got 'sglang'; allowed: transformers, lean, vllm"
    ):
        RolloutSettings(engine="sglang")


def test_vllm_section_must_be_settings():
    """A raw mapping in the constructor is a TypeError pointing at from_dict."""
    with pytest.raises(TypeError, match="from_dict"):
        RolloutSettings(vllm={"tis_cap": 2.0})


def test_from_dict_builds_the_nested_section():
    """A YAML-shaped mapping becomes RolloutSettings with VLLMSettings inside."""
    rollout = RolloutSettings.from_dict(
        {"engine": "vllm", "vllm": {"tis_cap": 2.0, "engine_kwargs": {"max_num_seqs": 64}}}
    )
    assert rollout.engine == "vllm"
    assert rollout.vllm == VLLMSettings(tis_cap=2.0, engine_kwargs={"max_num_seqs": 64})


@pytest.mark.parametrize(
    ("values", "match"),
    [
        ({"engin": "vllm"}, r"rollout: got unknown key\(s\) 'engin'"),
        ({"vllm": {"tis": 2.0}}, r"rollout\.vllm: got unknown key\(s\) 'tis'"),
    ],
)
def test_from_dict_rejects_unknown_keys(values, match):
    """Misspelt keys at either level are named, with the allowed keys."""
    with pytest.raises(ValueError, match=match):
        RolloutSettings.from_dict(values)


def test_one_tis_cap_for_every_engine_with_the_older_vllm_spelling_accepted():
    """rollout.tis_cap is the cap; vllm.tis_cap alone sets it too; two different values are
    refused naming both keys."""
    assert RolloutSettings(tis_cap=2.0).vllm.tis_cap == 2.0  # the vLLM engine reads it there
    assert RolloutSettings(vllm=VLLMSettings(tis_cap=3.0)).tis_cap == 3.0
    assert RolloutSettings(tis_cap=2.0, vllm=VLLMSettings(tis_cap=2.0)).tis_cap == 2.0
    with pytest.raises(ValueError, match=r"rollout\.tis_cap=2\.0 and vllm\.tis_cap=3\.0"):
        RolloutSettings(tis_cap=2.0, vllm=VLLMSettings(tis_cap=3.0))
