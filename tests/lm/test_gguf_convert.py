"""`grpo.lm.gguf_convert` on a tiny Llama GGUF file written by the test (tests/lm/tiny_gguf.py)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from grpo.lm.gguf_convert import ConversionError, Probe, check_folder, convert_gguf, sha256_file
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
    """The greedy probe must reach `<|im_end|>`; otherwise an error and no folder."""
    gguf_path = write_tiny_gguf(tmp_path / "mute.gguf", eos_bias=-1.0)
    folder = tmp_path / "out"
    with pytest.raises(ConversionError, match="did not end with '<\\|im_end\\|>' within 8"):
        convert_gguf(gguf_path, folder, eos_token=EOS, probe=Probe(max_new_tokens=8))
    assert not folder.exists()


def test_an_eos_token_outside_the_vocabulary_is_refused(tmp_path):
    """The end-of-turn token must be in the file's vocabulary."""
    gguf_path = write_tiny_gguf(tmp_path / "t.gguf")
    with pytest.raises(ConversionError, match="'<eot>' is not in the GGUF"):
        convert_gguf(gguf_path, tmp_path / "out", eos_token="<eot>")
