"""bench/llamacpp_decode.py: the GGUF file llama.cpp decodes holds the very weights grpo samples
from (F32: equal; BF16: the matrices rounded to bfloat16, vectors equal), with the same
metadata; and the padded batch both sides start from."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests" / "lm"))

import decode_results  # noqa: E402
import llamacpp_decode as bench  # noqa: E402

gguf = pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def quantized(tmp_path_factory) -> Path:
    """A tiny Gemma 3 GGUF whose matrices are Q8_0 / Q5_0 (tests/lm/tiny_gemma.py)."""
    from tiny_gemma import tiny_gemma, write_gemma_gguf

    return write_gemma_gguf(tmp_path_factory.mktemp("gguf") / "tiny.Q8_0.gguf", tiny_gemma())


def _tensors(path: Path) -> dict[str, tuple[str, np.ndarray]]:
    reader = gguf.GGUFReader(path)
    return {t.name: (t.tensor_type.name, gguf.quants.dequantize(t.data, t.tensor_type))
            for t in reader.tensors}  # fmt: skip


def _fields(path: Path) -> dict:
    reader = gguf.GGUFReader(path)
    return {f.name: f.contents() for f in reader.fields.values() if not f.name.startswith("GGUF.")}


def test_f32_rewrite_holds_the_dequantized_weights_exactly(quantized):
    source, rewritten = _tensors(quantized), _tensors(bench.rewritten_gguf(quantized, "F32"))
    assert source.keys() == rewritten.keys()
    assert any(kind not in ("F32", "F16") for kind, _ in source.values())  # something was quantized
    for name, (_, values) in source.items():
        kind, theirs = rewritten[name]
        assert kind == "F32", name
        assert np.array_equal(theirs, values), name


def test_bf16_rewrite_rounds_matrices_only(quantized):
    source, rewritten = _tensors(quantized), _tensors(bench.rewritten_gguf(quantized, "BF16"))
    for name, (_, values) in source.items():
        kind, theirs = rewritten[name]
        if values.ndim >= 2:
            expected = torch.from_numpy(values.copy()).bfloat16().float().numpy()
            assert kind == "BF16", name
            assert np.array_equal(theirs.reshape(values.shape), expected), name
        else:
            assert kind == "F32" and np.array_equal(theirs, values), name


def test_rewrite_keeps_the_metadata_but_the_file_type(quantized):
    before = _fields(quantized)
    after = _fields(bench.rewritten_gguf(quantized, "BF16"))
    assert after.pop("general.file_type") == int(gguf.LlamaFileType.MOSTLY_BF16)
    before.pop("general.file_type", None)
    assert after == before


def test_padded_rows_repeat_each_prompt_g_times_left_padded():
    ids, mask = bench._padded([[5, 6, 7], [8]], G=2, pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [5, 6, 7], [0, 0, 8], [0, 0, 8]]
    assert mask.tolist() == [[1, 1, 1], [1, 1, 1], [0, 0, 1], [0, 0, 1]]


def test_table_compares_each_grpo_part_with_llamacpp_at_the_same_weights():
    results = {
        "grpo-float32": {"weights": "float32", "tokens_per_s": 300.0, "median_s": 1, "check_gap": 0},
        "llama.cpp-F32": {"weights": "m.F32.gguf", "tokens_per_s": 200.0, "median_s": 1, "logit_gap": 0},
        "grpo-bfloat16": {"weights": "bfloat16", "tokens_per_s": 100.0, "median_s": 1, "check_gap": 0},
    }  # fmt: skip
    rows = decode_results.llamacpp_table(results).splitlines()
    assert "| grpo-float32 | float32 | 300 | 1.50 |" in rows[2]
    assert "| grpo-bfloat16 | bfloat16 | 100 | - |" in rows[4]  # no llama.cpp-BF16 measured


def test_rendered_block_names_the_workload_and_llamacpp_build():
    parts = {
        "grpo-bfloat16": {"weights": "bfloat16", "tokens_per_s": 90.0, "median_s": 2.0, "check_gap": 0.01},
        "llama.cpp-BF16": {"weights": "m.BF16.gguf", "tokens_per_s": 60.0, "median_s": 3.0,
                           "logit_gap": 0.02, "system_info": "AVX512_BF16 = 1", "llama_cpp_python": "0.3.36"},
    }  # fmt: skip
    workload = {"B": 4, "G": 8, "T": 128, "prompt_tokens": [160, 171], "temperature": 0.7, "threads": 2}
    record = {"results": {"config": "configs/x.yaml", "workload": workload, "parts": parts}}
    text = decode_results.llamacpp({"llamacpp_decode": record}, lambda r: "SOURCE")
    assert "| grpo-bfloat16 | bfloat16 | 90 | 1.50 | 2.00 | 1.0e-02 |" in text
    assert "4 prompts of 160-171 tokens from `configs/x.yaml` x 8 completions x exactly 128" in text
    assert "4096 tokens a rollout" in text and "`AVX512_BF16 = 1`" in text
    assert text.endswith("SOURCE")


def test_a_failed_part_is_a_row_that_says_so_and_no_ratio_against_it():
    parts = {
        "grpo-float32": {"weights": "float32", "tokens_per_s": 300.0, "median_s": 1, "check_gap": 0},
        "llama.cpp-F32": {"weights": "m.F32.gguf", "failed": bench._failure(-11)},
    }  # fmt: skip
    rows = decode_results.llamacpp_table(parts).splitlines()
    assert rows[2].startswith("| grpo-float32 | float32 | 300 | - |")
    assert rows[3] == "| llama.cpp-F32 | m.F32.gguf | crashed (SIGSEGV) | - | - | - |"
    assert bench._failure(3) == "failed (exit status 3)"
