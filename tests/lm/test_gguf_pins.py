"""`grpo.lm.gguf_pins`: pinned config values checked against a GGUF file's metadata and written out."""

from __future__ import annotations

import json

import pytest

from grpo.lm.gguf_convert import ConversionError, convert_gguf
from grpo.lm.gguf_pins import check_pins, pin_config, write_pins
from tests.lm.tiny_gemma import PROBE, TINY_PINS, tiny_gemma, write_gemma_gguf

pytest.importorskip("gguf")

META = {"general.architecture": "gemma3", "gemma3.block_count": 4}
LAYERS = ["sliding_attention", "full_attention"] * 2


def test_a_pin_replaces_what_transformers_read_and_records_it():
    """Pins set nested and plain fields; the record keeps the value read and the key stating it."""
    config = {
        "query_pre_attn_scalar": 256,
        "rope_parameters": {"sliding_attention": {"rope_theta": 1e4}},
    }
    pins = {"query_pre_attn_scalar": 32, "rope_parameters.sliding_attention.rope_theta": 100.0}
    record = pin_config(config, pins, {**META, "gemma3.attention.scale": 32**-0.5})
    assert config == {
        "query_pre_attn_scalar": 32,
        "rope_parameters": {"sliding_attention": {"rope_theta": 100.0}},
    }
    assert record["query_pre_attn_scalar"] == {
        "pinned": 32, "transformers_read": 256, "stated_by": "gemma3.attention.scale"}  # fmt: skip
    assert record["rope_parameters.sliding_attention.rope_theta"]["stated_by"] is None


@pytest.mark.parametrize(
    ("key", "value", "field", "pinned"),
    [
        ("gemma3.rope.freq_base_swa", 200.0, "rope_parameters.sliding_attention.rope_theta", 100.0),
        ("gemma3.attention.sliding_window_pattern", 4, "layer_types", LAYERS),  # every 4th: 1 full
        (
            "gemma3.attention.sliding_window_pattern",
            [True, False, False, True],
            "layer_types",
            LAYERS,
        ),
        ("gemma3.attention.scale", 0.0625, "query_pre_attn_scalar", 32),  # 1/sqrt(256)
        ("gemma3.attention.sliding_window", 512, "sliding_window", 4),
    ],
)
def test_metadata_that_disagrees_with_a_pin_is_an_error_naming_the_key(key, value, field, pinned):
    """A file that states another value than the pin is not the file the pin was written for."""
    with pytest.raises(
        ConversionError, match=f"{key} = .* means {field} = .*but the conversion pins"
    ):
        pin_config({}, {field: pinned}, {**META, key: value})


def test_a_pin_on_a_field_the_config_does_not_have_is_an_error():
    """On a transformers config, a pinned field it does not define would be set and read back
    yet never read by the model (a transformers release that spells it otherwise): refused."""
    from transformers import Gemma3TextConfig

    config = Gemma3TextConfig()
    pin_config(config, {"query_pre_attn_scalar": 32}, META)
    assert config.query_pre_attn_scalar == 32
    with pytest.raises(ConversionError, match="has no field 'rope_local_theta'"):
        pin_config(config, {"rope_local_theta": 100.0}, META)


def test_a_pattern_that_agrees_passes():
    """llama.cpp's pattern 2 (every second layer full) and its per-layer flags both mean LAYERS."""
    for pattern in (2, [True, False, True, False]):
        config = {}
        pin_config(
            config,
            {"layer_types": tuple(LAYERS)},
            {**META, "gemma3.attention.sliding_window_pattern": pattern},
        )
        assert config["layer_types"] == LAYERS


def test_pins_are_written_into_config_json_and_read_back(tmp_path):
    """write_pins states every pin in config.json; check_pins finds them there and in the config
    transformers builds, and names a field that was edited afterwards."""
    from transformers import Gemma3TextConfig

    Gemma3TextConfig(num_hidden_layers=4).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    del saved["query_pre_attn_scalar"], saved["layer_types"]  # left to the defaults
    (tmp_path / "config.json").write_text(json.dumps(saved))
    pins = {k: v for k, v in TINY_PINS.items() if k != "hidden_activation"}
    write_pins(tmp_path / "config.json", pins)
    check_pins(tmp_path, pins)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["query_pre_attn_scalar"] == 32 and written["layer_types"] == LAYERS
    assert written["rope_parameters"]["sliding_attention"]["rope_theta"] == 100.0
    with pytest.raises(
        ConversionError, match="query_pre_attn_scalar in config.json is 32, not the pinned 64"
    ):
        check_pins(tmp_path, {**pins, "query_pre_attn_scalar": 64})


def test_a_gguf_file_stating_another_local_rope_theta_is_not_converted(tmp_path):
    """End to end: the tiny Gemma file with gemma3.rope.freq_base_swa = 200 against the pin 100."""
    path = write_gemma_gguf(tmp_path / "t.gguf", tiny_gemma(), swa_theta=200.0)
    with pytest.raises(ConversionError, match="gemma3.rope.freq_base_swa = 200.0"):
        convert_gguf(path, tmp_path / "out", eos_token="<eos>", probe=PROBE, pins=TINY_PINS)
    assert not (tmp_path / "out").exists()
