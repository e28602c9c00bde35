"""bench/roofline_counts.py and bench/roofline.py: FLOPs and bytes by hand on a tiny Llama and a
tiny Gemma 3 (its own head size, sliding layers, a frozen tied embedding) and against torch's
own FLOP counter, the limit and its ratio, peaks per dtype, and short runs of the demo config
(on the shipped Llama and on a tiny Gemma 3) that yield the table and records their renderers
read."""

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


# hidden 32, 3 layers (sliding, full, sliding: window 4), intermediate 64, vocab 32, 4 heads of
# 16 (not 32 / 4: Gemma 3's head size is its own) over 2 key-value heads; embedding tied
GEMMA_TYPES = ["sliding_attention", "full_attention", "sliding_attention"]
# per layer: q 32x64 = 2048, k 32x32 = 1024, v 1024, o 2048 (6144); gate, up, down 32x64 each
# (6144): 12288; three layers 36864, the output layer 32 x 32 = 1024
GEMMA_LAYER, GEMMA_LAYERS, GEMMA_HEAD = 12288, 36864, 1024


def tiny_gemma_config():
    from tiny_models import gemma3_config

    config = gemma3_config(num_hidden_layers=3, vocab_size=32, head_dim=16, sliding_window=4,
                           layer_types=GEMMA_TYPES, query_pre_attn_scalar=16)  # fmt: skip
    config._attn_implementation = "eager"
    return config


def tiny_gemma_shape() -> rc.ModelShape:
    return rc.ModelShape.from_config(tiny_gemma_config())


def test_the_tiny_gemma_shape_reads_its_head_size_and_sliding_layers():
    """head_dim 16 from the config, not 32 / 4; two of three layers slide over 4 keys; the
    matrix weights are every Linear weight of the model, the tied output layer once."""
    from transformers import Gemma3ForCausalLM

    s = tiny_gemma_shape()
    assert (s.hidden, s.layers, s.heads, s.kv_heads, s.head_dim) == (32, 3, 4, 2, 16)
    assert (s.window, s.window_layers) == (4, 2)
    assert rc.layer_matmul_params(s) == GEMMA_LAYER
    assert rc.matmul_params(s) == GEMMA_LAYERS + GEMMA_HEAD == 37888
    model = Gemma3ForCausalLM(tiny_gemma_config())
    assert model.lm_head.weight is model.model.embed_tokens.weight
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert rc.matmul_params(s) == linear


def test_windows_from_layer_types_or_every_layer_and_none_without_one():
    """Qwen2 with `use_sliding_window` slides on its layers past `max_window_layers`; Mistral
    (no layer types) on all its layers; Llama and a Qwen2 without the window on none."""
    from transformers import MistralConfig, Qwen2Config

    qwen = Qwen2Config(num_hidden_layers=4, use_sliding_window=True, max_window_layers=1,
                       sliding_window=16)  # fmt: skip
    assert rc.ModelShape.from_config(qwen).window_layers == 3
    mistral = rc.ModelShape.from_config(MistralConfig(num_hidden_layers=5, sliding_window=64))
    assert (mistral.window, mistral.window_layers) == (64, 5)
    assert rc.ModelShape.from_config(Qwen2Config(num_hidden_layers=4)).window is None
    assert tiny_shape().window is None and tiny_shape().window_layers == 0


def test_windowed_context_sums_by_hand():
    """Each query attends to at most W keys: 3 tokens after 3 cached, W = 4: 4 + 4 + 4 = 12;
    6 from the start: 1 + 2 + 3 + 4 + 4 + 4 = 18; a window no context reaches changes nothing."""
    assert rc.context_sum(3, 3, window=4) == 12
    assert rc.context_sum(0, 6, window=4) == 18
    assert rc.context_sum(10, 2, window=4) == 8
    assert rc.context_sum(3, 3, window=6) == rc.context_sum(3, 3) == 15
    assert rc.context_sum(3, 0, window=4) == 0


def test_gemma_group_flops_by_hand():
    """P 3, completions of 2 and 4: 7 tokens fed; keys 6 + 4 + 15 = 25 on the full layer,
    6 + 4 + (4 + 4 + 4) = 22 on each sliding one: 25 + 2 x 22 = 69 pairs at 4 x 4 heads x 16
    = 256 FLOPs, 17664. Layers 2 x 36864 x 7 = 516096; logits 2 x 32 x 32 = 2048 a row:
    scoring 6 rows (12288), sampling 5 (10240)."""
    s = tiny_gemma_shape()
    assert rc.layer_keys(s, 25, 22) == 69
    assert rc.attention_flops(s, 25, 22) == 17664
    assert rc.token_flops(s) * 7 == 516096
    assert rc.scoring_flops(s, 3, [2, 4]) == 516096 + 17664 + 12288 == 546048
    assert rc.sampling_flops(s, 3, [2, 4]) == 516096 + 17664 + 10240 == 544000


def test_backward_flops_by_hand_trained_and_with_the_tied_embedding_frozen():
    """Full fine-tuning: twice the forward, 1092096. The embedding frozen (so the tied output
    layer): the input gradients 516096 + 12288 + 2 x 17664 = 563712 and the layers' weight
    gradients 2 x 36864 x 7 = 516096, the output layer's 12288 gone: 1079808."""
    s = tiny_gemma_shape()
    everything, frozen = rc.Trainable.everything(s), rc.Trainable(GEMMA_LAYERS, False)
    assert everything == rc.Trainable(GEMMA_LAYERS, True)
    assert rc.backward_flops(s, everything, 3, [2, 4]) == 2 * 546048 == 1092096
    assert rc.backward_flops(s, frozen, 3, [2, 4]) == 563712 + 516096 == 1079808
    assert rc.backward_flops(s, rc.Trainable(0, False), 3, [2, 4]) == 563712
    assert (everything.weights(s), frozen.weights(s)) == (37888, 36864)


def test_loss_and_decoding_bytes_by_hand_on_the_tiny_gemma():
    """A loss pass reads the 37888 weights twice and writes the trained ones' gradients: 3 x
    37888 trained, 2 x 37888 + 36864 frozen (x 2 passes x 4 B). Decoding (P 3, T 2), (P 3, T 4):
    4 forwards x 37888 x 4 B = 606208; cached positions 4 + 15 = 19 on the full layer, 4 + 12
    = 16 on each sliding one, 51 in all at 2 x 2 heads x 16 x 4 B = 256 B: 13056."""
    s = tiny_gemma_shape()
    assert rc.loss_pass_bytes(s, rc.Trainable.everything(s), 2, 4) == 3 * 37888 * 8
    assert rc.loss_pass_bytes(s, rc.Trainable(GEMMA_LAYERS, False), 2, 4) == 112640 * 8
    assert rc.decoding_bytes(s, [3, 3], [2, 4], weight_bytes=4) == 606208 + 13056


def test_gemma_forward_and_backward_flops_equal_torchs_flop_counter_frozen_or_not():
    """Eager attention computes every layer's full S x S scores (the window is a mask): the
    forward is the counts at S^2 pairs, forward + backward 3x it. With the embedding (and so
    the output layer) frozen, torch does less by exactly the output layer's weight gradient,
    as the counts do (the first layer's input norm still trains, so even its q, k and v pass
    their input gradients down)."""
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import Gemma3ForCausalLM

    from grpo.lm.loading import freeze_parameters

    torch.manual_seed(0)
    s, S = tiny_gemma_shape(), 5
    ids = torch.randint(0, 32, (1, S))

    def counted(freeze: tuple[str, ...]) -> tuple[int, int, rc.Trainable]:
        torch.manual_seed(0)
        model = Gemma3ForCausalLM(tiny_gemma_config())
        freeze_parameters(model, freeze, "model.freeze")
        with FlopCounterMode(display=False) as forward:
            model(input_ids=ids)
        with FlopCounterMode(display=False) as both:
            model(input_ids=ids).logits.sum().backward()
        return forward.get_total_flops(), both.get_total_flops(), roofline.trainable_matmuls(model)

    expected = rc.token_flops(s) * S + rc.output_layer_flops(s, S) + rc.attention_flops(s, S * S)
    forward, both, trained = counted(())
    assert trained == rc.Trainable.everything(s)
    assert forward == expected and both == 3 * expected
    forward, frozen_both, frozen = counted(("model.embed_tokens.*",))
    assert frozen == rc.Trainable(GEMMA_LAYERS, False)
    dropped = rc.backward_flops(s, trained, 1, [S]) - rc.backward_flops(s, frozen, 1, [S])
    assert dropped == rc.output_layer_flops(s, S)  # a prompt of 1 + S - 1 fed: S rows
    assert forward == expected and both - frozen_both == dropped


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


def test_the_limit_takes_the_fastest_of_each_peak_over_the_samples_independently():
    """Three samples where a different one is fastest for each: bfloat16 from the second,
    float32 from the third, memory from the first; every sample's product rate is kept in
    order, and no sample is refused."""

    def sample(bf16: float, fp32: float, memory: float) -> dict:
        return {"threads": 2, "memory": {"bytes_per_s": memory, "mib": 1},
                "matmul": {"bfloat16": {"flops_per_s": bf16}, "float32": {"flops_per_s": fp32}}}

    peaks = roofline_peaks.best_peaks([sample(1e12, 2e11, 3e10), sample(2e12, 1e11, 2e10),
                                       sample(1.5e12, 3e11, 1e10)])  # fmt: skip
    assert peaks["matmul"]["bfloat16"]["flops_per_s"] == 2e12
    assert peaks["matmul"]["float32"]["flops_per_s"] == 3e11
    assert peaks["memory"]["bytes_per_s"] == 3e10
    assert peaks["matmul_rates"] == {"bfloat16": [1e12, 2e12, 1.5e12],
                                     "float32": [2e11, 1e11, 3e11]}  # fmt: skip
    assert (peaks["samples"], peaks["threads"]) == (3, 2)
    with pytest.raises(ValueError, match="best_peaks: got no samples"):
        roofline_peaks.best_peaks([])


def test_phase_rows_divide_each_phase_by_its_own_limit():
    """Sampling: 2 GFLOP at 1 GFLOP/s (bfloat16) and 1 GB at 1 GB/s -> limit 2 s, 4 s measured
    is 2x; the loss: 3 GFLOP at 3 GFLOP/s (float32) -> 1 s, 5 s is 5x; the optimizer: 0.5 GB ->
    0.5 s, 1 s is 2x; the old log-probs never ran: no row; together 10 s over 3.5 s. A phase's
    peak RSS is its largest over the steps that measured it, the total's the largest of all; a
    phase no step measured has none."""
    peaks = {"matmul": {"bfloat16": {"flops_per_s": 1e9}, "float32": {"flops_per_s": 3e9}},
             "memory": {"bytes_per_s": 1e9}}  # fmt: skip

    def step(rss: list[int | None]) -> dict:
        return {"phases": {
            "sampling": {"flops": 2e9, "bytes": 1e9, "seconds": 4.0, "peak_rss_bytes": rss[0]},
            "old_logprobs": {"flops": 0, "bytes": 0, "seconds": 0.0, "peak_rss_bytes": None},
            "loss_backward": {"flops": 3e9, "bytes": 1e8, "seconds": 5.0, "peak_rss_bytes": rss[1]},
            "optimizer": {"flops": None, "bytes": 5e8, "seconds": 1.0, "peak_rss_bytes": rss[2]},
        }}  # fmt: skip

    dtypes = {"sampling": "bfloat16", "scoring": "float32"}
    steps = [step([10, 30, 20]), step([40, 25, 20])]
    rows = {r["phase"]: r for r in roofline.summarise(steps, peaks, dtypes)}
    assert list(rows) == ["sampling", "loss_backward", "optimizer", "total"]
    assert rows["sampling"]["limit_s"] == pytest.approx(2.0)
    assert rows["sampling"]["x_of_limit"] == pytest.approx(2.0)
    assert rows["loss_backward"]["x_of_limit"] == pytest.approx(5.0)
    assert rows["optimizer"]["compute_s"] == 0
    assert rows["optimizer"]["x_of_limit"] == pytest.approx(2.0)
    assert rows["total"]["x_of_limit"] == pytest.approx(10.0 / 3.5)
    peaks_by_phase = {p: r["peak_rss_bytes"] for p, r in rows.items()}
    assert peaks_by_phase == {"sampling": 40, "loss_backward": 30, "optimizer": 20, "total": 40}
    partly = roofline.summarise([step([10, 30, 20]), step([None, 25, 20])], peaks, dtypes)
    assert partly[0]["peak_rss_bytes"] == 10 and partly[-1]["peak_rss_bytes"] == 30
    unmeasured = roofline.summarise([step([None, 30, 20]), step([None, 25, 20])], peaks, dtypes)
    assert unmeasured[0]["peak_rss_bytes"] is None and unmeasured[-1]["peak_rss_bytes"] == 30


SHRUNK = ["prompts_per_step=2", "grpo.group_size=2", "grpo.batch_size=4", "task.train_size=8",
          "policy.micro_batch_size=4", "run.threads=1"]  # fmt: skip


def run_roofline(folder: Path, record: str, sets: list[str]) -> dict:
    """One untimed and one measured step of configs/demo.yaml with `sets`, written to
    `folder`/`record`.json; the thread count and deterministic kernels, which the run sets as
    `grpo train` does, are put back."""
    argv = ["configs/demo.yaml", *(a for s in sets for a in ("--set", s)), "--warmup", "1",
            "--steps", "1", "--repeats", "1", "--gemm-rows", "8", "--bandwidth-mib", "1",
            "--record", record]  # fmt: skip
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    try:
        return roofline.main(argv, folder=folder)
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)


def test_two_steps_of_the_demo_make_the_table_and_a_rendered_record(tmp_path, monkeypatch):
    """One untimed and one measured step of configs/demo.yaml, shrunk: every phase that ran has
    a row and a peak RSS, the sampled groups are the step's B prompts x G, and the record
    renders."""
    import records
    import render_results

    monkeypatch.chdir(REPO)
    results = run_roofline(tmp_path, "roofline", SHRUNK)
    phases = [r["phase"] for r in results["phases"]]
    assert phases == ["sampling", "loss_backward", "optimizer", "total"]  # old log-probs skipped
    assert results["tokens_per_step"]["sampled_groups"] == 2
    assert results["tokens_per_step"]["completions"] == 4
    assert results["batch"] == {"prompts": 2, "group_size": 2, "max_new_tokens": 5,
                                "micro_batch_size": 4}  # fmt: skip
    assert set(results["peaks"]["matmul"]) == {"float32", "bfloat16"}
    assert results["peaks"]["samples"] == 2  # before the steps and after the measured one
    assert len(results["peaks"]["matmul_rates"]["bfloat16"]) == 2
    sampling = results["phases"][0]
    assert sampling["flops"] > 0 and sampling["bytes"] > 0 and sampling["dtype"] == "float32"
    text = roofline_results.table(results)
    # the rate's range is given for the dtype the phases multiply in, float32 here
    low, high = (f"{f(results['peaks']['matmul_rates']['float32']) / 1e9:.0f}" for f in (min, max))
    assert f"The float32 product measured between {low} and {high} GFLOP/s" in text
    assert "The bfloat16 product measured" not in text
    table = text.splitlines()
    assert table[0].startswith("| phase |") and len(table[0].split("|")) == 12
    assert [line.split("|")[1].strip() for line in table[2:6]] == [
        "sampling (decoding)", "loss forward + backward", "optimizer (clip + AdamW)",
        "these phases together",
    ]  # fmt: skip
    assert all(line.endswith(" GiB |") for line in table[2:6])
    record = records.load_records(tmp_path)["roofline"]
    assert record["command"].startswith("python bench/roofline.py configs/demo.yaml")
    assert "bench/roofline_memory.py" in record["depends_on_paths"]
    block = render_results.render_block("roofline", {"roofline": record})
    assert block.startswith("| phase |") and "Measured by `python bench/roofline.py" in block
    assert render_results.render_block("roofline", {}).startswith("*Not measured yet")


def test_a_tiny_gemma_with_its_embedding_frozen_and_trained(tmp_path, monkeypatch, tiny_lm_dir):
    """The demo's task on a tiny Gemma 3 (sliding layers, tied embedding), its embedding frozen
    and not: frozen, V x H fewer parameters train (the output layer's with them), AdamW keeps
    2 x 4 B fewer for each and one step count less (4 B); every phase has a peak RSS, the
    total's the largest; the two records render side by side, phase by phase."""
    import records
    import render_results

    monkeypatch.chdir(REPO)
    # a random model's rewards are all 0: without skip_zero_advantage=false no group trains
    gemma = [*SHRUNK, f"model.path={tiny_lm_dir('gemma3')}", "rollout.engine=transformers",
             "grpo.skip_zero_advantage=false"]  # fmt: skip
    frozen = run_roofline(tmp_path, "roofline_gemma",
                          [*gemma, "model.freeze=[model.embed_tokens.*]"])  # fmt: skip
    trained = run_roofline(tmp_path, "roofline_gemma_unfrozen", gemma)
    model, V, H = frozen["model"], frozen["model"]["vocab"], frozen["model"]["hidden"]
    assert model["model_type"] == "gemma3_text" and model["window_layers"] == 2
    assert model["frozen"] == ["model.embed_tokens.*"] and trained["model"]["frozen"] == []
    assert trained["model"]["trainable_params"] - model["trainable_params"] == V * H
    assert model["trainable_matmul_params"] == model["matmul_params"] - V * H
    assert trained["model"]["trainable_matmul_params"] == model["matmul_params"]
    adam = trained["model"]["optimizer_state_bytes"] - model["optimizer_state_bytes"]
    assert adam == 2 * 4 * V * H + 4
    for results in (frozen, trained):
        rows = {r["phase"]: r for r in results["phases"]}
        peaks = [r["peak_rss_bytes"] for p, r in rows.items() if p != "total"]
        assert all(p > 0 for p in peaks) and rows["total"]["peak_rss_bytes"] == max(peaks)
    block = render_results.render_block("roofline-freeze", records.load_records(tmp_path))
    lines = block.splitlines()
    assert lines[0] == "| phase | run | measured s/step | limit s | x of the limit | peak RSS |"
    assert [line.split("|")[2].strip() for line in lines[2:10]] == [
        "embedding frozen", "embedding trained"] * 4  # fmt: skip
    assert "Every run samples B x G x T = 2 x 2 x 5 per step" in block
    assert block.count("Measured by `python bench/roofline.py configs/demo.yaml") == 2


def test_a_phase_peak_is_the_largest_measured_over_the_steps_that_ran_it():
    """A step whose groups all scored alike runs no loss, so its loss phase has no peak: the
    phase's peak is the largest of the other steps', and missing only when none measured it."""
    assert roofline._largest([5, None, 7]) == 7
    assert roofline._largest([None, None]) is None
    assert roofline._largest([]) is None
