"""bench/roofline_counts.py and bench/roofline.py: FLOPs and bytes by hand on a tiny Llama and
against torch's own FLOP counter, the limit and its ratio, peaks per dtype, and a two-step run
of the demo config that yields the table and a record its renderer reads."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import roofline  # noqa: E402
import roofline_counts as rc  # noqa: E402
import roofline_peaks  # noqa: E402
import roofline_results  # noqa: E402

# hidden 8, 2 layers, intermediate 16, vocab 32, 2 heads of 4, 1 key-value head
TINY = dict(hidden_size=8, num_hidden_layers=2, intermediate_size=16, vocab_size=32,
            num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False)  # fmt: skip
# per layer: q 8x8 = 64, k 8x4 = 32, v 32, o 64 (192); gate, up, down 8x16 each (384): 576
LAYER = 576
HEAD = 8 * 32  # the output layer, 256 weights


def tiny_config(**changes):
    from transformers import LlamaConfig

    config = LlamaConfig(**{**TINY, **changes})
    config._attn_implementation = "eager"  # QK^T and AV as plain matmuls torch can count
    return config


def tiny_shape() -> rc.ModelShape:
    return rc.ModelShape.from_config(tiny_config())


def test_the_tiny_llama_shape_and_its_weights_by_hand():
    """head_dim = 8 / 2; 2 x 576 layer weights + 256 output-layer weights = 1408."""
    s = tiny_shape()
    assert (s.hidden, s.layers, s.heads, s.kv_heads, s.head_dim) == (8, 2, 2, 1, 4)
    assert rc.layer_matmul_params(s) == LAYER
    assert rc.matmul_params(s) == 2 * LAYER + HEAD == 1408


def test_matmul_params_are_the_models_matrix_weights():
    """The count equals the numel of every Linear weight of the model (lm_head untied)."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM(tiny_config())
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert rc.matmul_params(tiny_shape()) == linear


def test_per_token_forward_flops_by_hand():
    """The first token of a sequence (1 key): 2 x 1152 layer weights = 2304, the output layer
    2 x 256 = 512, attention 2 layers x 2 heads x 4 x d = 4 x 1 key x 16 = 64: 2880 FLOPs."""
    s = tiny_shape()
    assert rc.token_flops(s) == 2304
    assert rc.output_layer_flops(s, 1) == 512
    assert rc.attention_flops(s, 1) == 64
    assert rc.token_flops(s) + rc.output_layer_flops(s, 1) + rc.attention_flops(s, 1) == 2880


def test_forward_and_backward_flops_equal_torchs_flop_counter():
    """torch's FlopCounterMode on a forward of S tokens (eager attention: the full S x S
    scores, so S^2 key pairs) gives exactly the counts; forward + backward gives 3x that."""
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model, s, S = LlamaForCausalLM(tiny_config()), tiny_shape(), 5
    ids = torch.randint(0, 32, (1, S))
    with FlopCounterMode(display=False) as forward:
        model(input_ids=ids)
    expected = rc.token_flops(s) * S + rc.output_layer_flops(s, S) + rc.attention_flops(s, S * S)
    assert forward.get_total_flops() == expected
    with FlopCounterMode(display=False) as both:
        model(input_ids=ids).logits.sum().backward()
    assert both.get_total_flops() == 3 * expected


def test_group_flops_by_hand():
    """A prompt of 3 tokens, completions of 2 and 4: 3 + 1 + 3 = 7 tokens fed (a completion's
    last never is); keys 1+2+3 (prompt) + 4 (first) + 4+5+6 (second) = 25. Scoring: 6 rows of
    logits, 2 x 1152 x 7 + 64 x 25 + 512 x 6 = 20800; sampling: 1 + 1 + 3 = 5 rows, 20288."""
    s = tiny_shape()
    assert rc.context_sum(0, 3) == 6 and rc.context_sum(3, 3) == 15
    assert rc.scoring_flops(s, 3, [2, 4]) == 16128 + 1600 + 3072 == 20800
    assert rc.sampling_flops(s, 3, [2, 4]) == 16128 + 1600 + 2560 == 20288


def test_decoding_bytes_by_hand():
    """Rows (P 3, T 2) and (P 3, T 4): 4 forwards read 1408 float32 weights (22528 B); cached
    positions read 4 + 15 = 19, each 2 x 2 layers x 1 head x 4 x 4 B = 64 B (1216 B)."""
    s = tiny_shape()
    assert rc.decoding_bytes(s, [3, 3], [2, 4], weight_bytes=4) == 22528 + 1216
    assert rc.decoding_bytes(s, [3, 3], [2, 4], weight_bytes=2) == 11264 + 1216
    with pytest.raises(ValueError, match="one of each per row"):
        rc.decoding_bytes(s, [3], [2, 4], weight_bytes=4)


def test_optimizer_and_weight_pass_bytes_by_hand():
    """AdamW: 7 float32 accesses per weight; the clip 3; a pass reads 1408 weights once."""
    assert rc.adamw_bytes(1000, 4) == 28000
    assert rc.clip_bytes(1000, 4) == 12000
    assert rc.weight_pass_bytes(tiny_shape(), 3, 2) == 1408 * 2 * 3


def test_the_limit_is_the_slower_of_compute_and_memory_and_the_ratio_divides_by_it():
    """1 GFLOP at 10 GFLOP/s is 0.1 s, 1 GB at 2 GB/s 0.5 s: the limit is 0.5 s; 2 s is 4x it."""
    assert rc.limit_seconds(1e9, 1e9, 1e10, 2e9) == pytest.approx(0.5, rel=1e-12)
    assert rc.limit_seconds(1e9, 0, 1e10, 2e9) == pytest.approx(0.1, rel=1e-12)
    assert rc.times_the_limit(2.0, 0.5) == 4.0
    assert math.isnan(rc.times_the_limit(2.0, 0.0))
    with pytest.raises(ValueError, match="peaks must be > 0"):
        rc.limit_seconds(1.0, 1.0, 0.0, 1.0)


def test_models_without_a_gated_mlp_are_refused_by_type():
    from transformers import GPT2Config

    with pytest.raises(ValueError, match="model_type: got 'gpt2'"):
        rc.ModelShape.from_config(GPT2Config())


def test_float32_and_bfloat16_matmul_rates_are_measured_apart():
    """Each dtype's product runs in that dtype, at the shape asked for."""
    peaks = roofline_peaks.measure_peaks(["float32", "bfloat16"], (16, 8, 16), mib=1, repeats=2)
    for dtype in ("float32", "bfloat16"):
        entry = peaks["matmul"][dtype]
        assert entry["computed_dtype"] == dtype and entry["shape"] == [16, 8, 16]
        assert math.isfinite(entry["flops_per_s"]) and entry["flops_per_s"] > 0
    memory = peaks["memory"]
    assert memory["bytes_per_s"] == max(memory["copy_bytes_per_s"], memory["sum_bytes_per_s"]) > 0


def test_phase_rows_divide_each_phase_by_its_own_limit():
    """Sampling: 2 GFLOP at 1 GFLOP/s (bfloat16) and 1 GB at 1 GB/s -> limit 2 s, 4 s measured
    is 2x; the loss: 3 GFLOP at 3 GFLOP/s (float32) -> 1 s, 5 s is 5x; the optimizer: 0.5 GB ->
    0.5 s, 1 s is 2x; the old log-probs never ran: no row; together 10 s over 3.5 s."""
    peaks = {"matmul": {"bfloat16": {"flops_per_s": 1e9}, "float32": {"flops_per_s": 3e9}},
             "memory": {"bytes_per_s": 1e9}}  # fmt: skip
    step = {"phases": {
        "sampling": {"flops": 2e9, "bytes": 1e9, "seconds": 4.0},
        "old_logprobs": {"flops": 0, "bytes": 0, "seconds": 0.0},
        "loss_backward": {"flops": 3e9, "bytes": 1e8, "seconds": 5.0},
        "optimizer": {"flops": None, "bytes": 5e8, "seconds": 1.0},
    }}  # fmt: skip
    dtypes = {"sampling": "bfloat16", "scoring": "float32"}
    rows = {r["phase"]: r for r in roofline.summarise([step, step], peaks, dtypes)}
    assert list(rows) == ["sampling", "loss_backward", "optimizer", "total"]
    assert rows["sampling"]["limit_s"] == pytest.approx(2.0)
    assert rows["sampling"]["x_of_limit"] == pytest.approx(2.0)
    assert rows["loss_backward"]["x_of_limit"] == pytest.approx(5.0)
    assert rows["optimizer"]["compute_s"] == 0
    assert rows["optimizer"]["x_of_limit"] == pytest.approx(2.0)
    assert rows["total"]["x_of_limit"] == pytest.approx(10.0 / 3.5)


def test_two_steps_of_the_demo_make_the_table_and_a_rendered_record(tmp_path, monkeypatch):
    """One untimed and one measured step of configs/demo.yaml, shrunk: every phase that ran has
    a row, the sampled groups are the step's B prompts x G, and the record renders."""
    import records
    import render_results

    monkeypatch.chdir(REPO)
    sets = ["prompts_per_step=2", "grpo.group_size=2", "grpo.batch_size=4", "task.train_size=8",
            "policy.micro_batch_size=4", "run.threads=1"]  # fmt: skip
    argv = ["configs/demo.yaml", *(a for s in sets for a in ("--set", s)), "--warmup", "1",
            "--steps", "1", "--repeats", "1", "--gemm-rows", "8", "--bandwidth-mib", "1",
            "--record", "roofline"]  # fmt: skip
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    try:  # the run seeds and sets threads and deterministic kernels, as `grpo train` does
        results = roofline.main(argv, folder=tmp_path)
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)
    phases = [r["phase"] for r in results["phases"]]
    assert phases == ["sampling", "loss_backward", "optimizer", "total"]  # old log-probs skipped
    assert results["tokens_per_step"]["sampled_groups"] == 2
    assert results["tokens_per_step"]["completions"] == 4
    assert set(results["peaks"]["matmul"]) == {"float32", "bfloat16"}
    sampling = results["phases"][0]
    assert sampling["flops"] > 0 and sampling["bytes"] > 0 and sampling["dtype"] == "float32"
    table = roofline_results.table(results).splitlines()
    assert table[0].startswith("| phase |") and len(table[0].split("|")) == 11
    assert [line.split("|")[1].strip() for line in table[2:6]] == [
        "sampling (decoding)", "loss forward + backward", "optimizer (clip + AdamW)",
        "these phases together",
    ]  # fmt: skip
    record = records.load_records(tmp_path)["roofline"]
    assert record["command"].startswith("python bench/roofline.py configs/demo.yaml")
    block = render_results.render_block("roofline", {"roofline": record})
    assert block.startswith("| phase |") and "Measured by `python bench/roofline.py" in block
    assert render_results.render_block("roofline", {}).startswith("*Not measured yet")
