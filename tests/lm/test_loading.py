"""grpo.lm.loading's folder check: every folder save_pretrained writes loads (a LoRA run's
adapter folder included), and a local folder missing its config or tokenizer is named in one
line however its path is written."""

from __future__ import annotations

import shutil

import pytest
import torch
from tiny_models import load_tiny_causal_lm

from grpo.lm.loading import LoraSettings, apply_lora, load_model_and_tokenizer, save_model


def test_a_lora_adapter_folder_loads_with_its_adapters(tiny_lm_dir, tmp_path):
    """The folder save_model writes for a LoRA model (adapter_config.json, no config.json)
    loads as it did before the folder check: its logits are the adapted model's, not the base's."""
    model, tokenizer = load_tiny_causal_lm(tiny_lm_dir("llama"))
    adapted = apply_lora(model, LoraSettings(r=2, alpha=4))
    torch.manual_seed(0)
    with torch.no_grad():  # non-zero adapters: B starts at zero, which would change nothing
        for name, p in adapted.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    folder = save_model(adapted, tokenizer, tmp_path / "final")
    assert not (folder / "config.json").exists() and (folder / "adapter_config.json").is_file()
    loaded, _ = load_model_and_tokenizer(folder, dtype="float32")
    ids = torch.tensor([tokenizer("say a b c")["input_ids"]])
    with torch.no_grad():
        want, got = adapted(input_ids=ids).logits, loaded(input_ids=ids).logits
        base = load_tiny_causal_lm(tiny_lm_dir("llama"))[0](input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(got, base, atol=1e-3)


def test_a_relative_folder_of_one_slash_is_checked_too(tiny_lm_dir, tmp_path, monkeypatch):
    """A path like "out/final" (read locally by transformers, though it could name a hub model)
    without its tokenizer: the one-line error naming it, not transformers' hub lookup."""
    monkeypatch.chdir(tmp_path)
    shutil.copytree(tiny_lm_dir("llama"), tmp_path / "out" / "final")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / "out" / "final" / name).unlink()
    with pytest.raises(FileNotFoundError, match=r"'out/final' has no tokenizer file \(one of"):
        load_model_and_tokenizer("out/final")
