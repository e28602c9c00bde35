"""`grpo.lm.gguf_convert` on tiny GGUF files written by the test: a Llama chat model
(tests/lm/tiny_gguf.py) and a Gemma 3 base model (tests/lm/tiny_gemma.py)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from grpo.lm.gguf_convert import ConversionError, Probe, check_folder, convert_gguf, sha256_file
from tests.lm.tiny_gemma import PROBE, TINY_PINS, tiny_gemma, write_gemma_gguf
from tests.lm.tiny_gguf import write_tiny_gguf

pytest.importorskip("gguf")

EOS = "<|im_end|>"


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gguf")
    gguf_path = write_tiny_gguf(tmp / "tiny.Q4_1.gguf")
    folder = tmp / "tiny-dequantized-Q4_1"
    manifest = convert_gguf(gguf_path, folder, eos_token=EOS, probe=Probe(max_new_tokens=8),
                            source={"package": "tiny"}, extra_files={"LICENSE": b"licence"})  # fmt: skip
    return gguf_path, folder, manifest


def test_saved_logits_equal_the_gguf_models_on_a_new_prompt(converted):
    """The folder, loaded as a user loads it, gives the GGUF-loaded model's logits exactly."""
    gguf_path, folder, _ = converted
    where = {"pretrained_model_name_or_path": str(gguf_path.parent), "gguf_file": gguf_path.name}
    ref = AutoModelForCausalLM.from_pretrained(**where, dtype=torch.float32).eval()
    saved = AutoModelForCausalLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = tokenizer(["the thin hen then", "hi"], return_tensors="pt", padding=True)
    assert ids["input_ids"].tolist() == AutoTokenizer.from_pretrained(**where)(
        ["the thin hen then", "hi"], padding=True)["input_ids"]  # fmt: skip
    with torch.no_grad():
        assert torch.equal(saved(**ids).logits, ref(**ids).logits)
    assert saved.dtype == torch.float32 and type(saved).__name__ == "LlamaForCausalLM"


def test_generation_config_has_only_token_ids_and_stops_at_the_end_of_turn(converted):
    """No sampling settings are written; EOS is `<|im_end|>` in both configs and the tokenizer."""
    _, folder, _ = converted
    written = json.loads((folder / "generation_config.json").read_text())
    assert set(written) <= {"bos_token_id", "eos_token_id", "pad_token_id", "transformers_version"}
    eos_id = AutoTokenizer.from_pretrained(folder).convert_tokens_to_ids(EOS)
    assert written["eos_token_id"] == eos_id == 2
    assert not GenerationConfig.from_pretrained(folder).do_sample  # greedy unless asked
    config = json.loads((folder / "config.json").read_text())
    assert config["eos_token_id"] == eos_id and "quantization_config" not in config
    assert AutoTokenizer.from_pretrained(folder).eos_token == EOS
    assert "<|im_start|>assistant" in (folder / "chat_template.jinja").read_text()


def test_manifest_records_the_probe_and_every_files_hash(converted):
    """conversion.json: the GGUF file's hash, a probe answer ending at EOS, each file's hash."""
    gguf_path, folder, manifest = converted
    assert json.loads((folder / "conversion.json").read_text()) == manifest
    assert manifest["source"] == {"package": "tiny", "gguf_file": gguf_path.name,
                                  "gguf_sha256": sha256_file(gguf_path)}  # fmt: skip
    probe = manifest["probe"]
    assert probe["ends_with_eos"] and probe["greedy_answer"].endswith(EOS)
    assert probe["max_abs_logit_difference"] <= probe["logit_tolerance"] == 1e-5
    assert manifest["files"]["LICENSE"] == sha256_file(folder / "LICENSE")
    assert set(manifest["files"]) >= {"model.safetensors", "config.json", "tokenizer.json"}
    assert check_folder(folder) == manifest


def test_check_folder_names_a_changed_file(converted, tmp_path):
    """A cached folder whose file no longer hashes as recorded is rejected, naming the file."""
    _, folder, _ = converted
    copy = tmp_path / "copy"
    copy.mkdir()
    for path in folder.iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    (copy / "LICENSE").write_bytes(b"edited")
    with pytest.raises(ConversionError, match="LICENSE changed"):
        check_folder(copy)


def test_a_model_that_never_ends_its_turn_is_not_published(tmp_path):
    """The greedy probe must reach `<|im_end|>`; otherwise an error, no folder, and no
    half-written `out.partial` left behind; a folder published before stays as it was."""
    gguf_path = write_tiny_gguf(tmp_path / "mute.gguf", eos_bias=-1.0)
    folder = tmp_path / "out"
    with pytest.raises(ConversionError, match="did not end with '<\\|im_end\\|>' within 8"):
        convert_gguf(gguf_path, folder, eos_token=EOS, probe=Probe(max_new_tokens=8))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mute.gguf"]
    folder.mkdir()
    (folder / "kept").write_text("an earlier conversion")
    with pytest.raises(ConversionError):
        convert_gguf(gguf_path, folder, eos_token=EOS, probe=Probe(max_new_tokens=8))
    assert [p.name for p in folder.iterdir()] == ["kept"]
    assert not (tmp_path / "out.partial").exists()


def test_an_eos_token_outside_the_vocabulary_is_refused(tmp_path):
    """The end-of-turn token must be in the file's vocabulary."""
    gguf_path = write_tiny_gguf(tmp_path / "t.gguf")
    with pytest.raises(ConversionError, match="'<eot>' is not in the GGUF"):
        convert_gguf(gguf_path, tmp_path / "out", eos_token="<eot>")


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    """The tiny Gemma 3 model, its GGUF file (Q8_0 and Q5_0 matrices), and a prompt's ids."""
    tmp = tmp_path_factory.mktemp("gemma")
    model = tiny_gemma()
    ids = torch.tensor([[2, 60, 38, 22, 36, 37, 7, 103, 7, 10, 7, 80, 7, 11, 90, 6, 44, 31]])
    return model, write_gemma_gguf(tmp / "tiny-gemma.gguf", model), ids


def test_a_tiny_gemma3_converts_to_its_own_logits(gemma, tmp_path):
    """The folder converted with the pins gives the logits of the model the file was written
    from, exactly; its plain-prompt probe stops at the newline."""
    model, path, ids = gemma
    manifest = convert_gguf(path, tmp_path / "out", eos_token="<eos>", probe=PROBE, pins=TINY_PINS)
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    with torch.no_grad():
        assert torch.equal(saved(ids).logits, model(ids).logits)
    assert manifest["probe"]["prompt"] == PROBE.prompt and manifest["probe"]["greedy_answer"] == "\n"
    assert manifest["pins"]["query_pre_attn_scalar"] == {
        "pinned": 32, "transformers_read": 256, "stated_by": None}  # fmt: skip
    assert "chat_template.jinja" not in {p.name for p in (tmp_path / "out").iterdir()}


def test_without_pins_transformers_defaults_make_another_model(gemma, tmp_path):
    """Unpinned, the conversion passes its own check (both sides share transformers' defaults:
    attention scale 256, every layer sliding, local theta 1e4) yet is not the model written."""
    model, path, ids = gemma
    convert_gguf(path, tmp_path / "out", eos_token="<eos>", probe=PROBE)
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    with torch.no_grad():
        assert (saved(ids).logits - model(ids).logits).abs().max() > 1e-3
    assert saved.config.query_pre_attn_scalar == 256


def test_a_base_model_that_never_reaches_its_stop_string_is_not_published(tmp_path):
    """The plain-prompt probe must reach its stop string within max_new_tokens."""
    path = write_gemma_gguf(tmp_path / "mute.gguf", tiny_gemma(newline_bias=-1.0))
    with pytest.raises(ConversionError, match="did not end with the stop string '\\\\n' within 4"):
        convert_gguf(path, tmp_path / "out", eos_token="<eos>", probe=PROBE, pins=TINY_PINS)
    assert not (tmp_path / "out").exists()
