"""Tests for grpo.lm.engines.weights: name matching, zero-copy sharing, copies and their checks.

The trainer is a tiny transformers Qwen2 model; the engine is an ordinary torch
module laid out as vLLM's transformers backend lays out the same network:
a "model." prefix, q/k/v fused into `qkv_proj`, gate/up into `gate_up_proj`,
vocabulary rows padded to a multiple of 64 and the output head tied to them.
"""

import copy

import pytest
import torch
from tiny_models import load_tiny_causal_lm
from torch import nn

from grpo.lm.engines import weights as W
from grpo.lm.engines.vllm_sharing import choose_sharing
from grpo.lm.loading import LoraSettings, apply_lora


def fused_engine(config, dtype=torch.float32) -> nn.Module:
    """A module with vLLM's parameter layout for `config` (values random)."""
    H, inner = config.hidden_size, config.intermediate_size
    q = H
    kv = config.num_key_value_heads * (H // config.num_attention_heads)
    V = -(-config.vocab_size // 64) * 64  # padded vocabulary

    def layer() -> nn.Module:
        block = nn.Module()
        block.self_attn = nn.Module()
        block.self_attn.qkv_proj = nn.Linear(H, q + 2 * kv)
        block.self_attn.o_proj = nn.Linear(H, H, bias=False)
        block.mlp = nn.Module()
        block.mlp.gate_up_proj = nn.Linear(H, 2 * inner, bias=False)
        block.mlp.down_proj = nn.Linear(inner, H, bias=False)
        block.input_layernorm = nn.LayerNorm(H, bias=False)
        block.post_attention_layernorm = nn.LayerNorm(H, bias=False)
        return block

    engine = nn.Module()
    engine.model = nn.Module()
    engine.model.embed_tokens = nn.Embedding(V, H)
    engine.model.layers = nn.ModuleList(layer() for _ in range(config.num_hidden_layers))
    engine.model.norm = nn.LayerNorm(H, bias=False)
    engine.lm_head = nn.Linear(H, V, bias=False)
    engine.lm_head.weight = engine.model.embed_tokens.weight  # tied, as the config says
    return engine.to(dtype)


@pytest.fixture
def pair(tiny_lm_dir):
    """(trainer model, engine module, trainer weights, mapping) for a tiny Qwen2."""
    model, _ = load_tiny_causal_lm(tiny_lm_dir("qwen2"))
    engine = fused_engine(model.config)
    trainer = W.trainer_weights(model)
    mapping = W.map_parameters(_params(engine), trainer)
    return model, engine, trainer, mapping


def _params(module: nn.Module) -> dict[str, torch.Tensor]:
    return dict(module.named_parameters(remove_duplicate=False))


def _qkv(model, i=0) -> torch.Tensor:
    attn = model.model.layers[i].self_attn
    return torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])


def _train_step(model) -> None:
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    ids = torch.tensor([[3, 5, 7, 9, 11]])
    model(ids, labels=ids).loss.backward()
    optimizer.step()


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("model.layers.0.mlp.up_proj.weight", "layers.0.mlp.up_proj.weight"),
        ("model.model.layers.0.mlp.up_proj.weight", "layers.0.mlp.up_proj.weight"),
        ("base_model.model.model.layers.0.q_proj.base_layer.weight", "layers.0.q_proj.weight"),
        ("language_model.model.norm.weight", "norm.weight"),
        ("lm_head.weight", "lm_head.weight"),
    ],
)
def test_canonical_name_drops_wrappers(name, expected):
    """Wrapper prefixes and PEFT's base_layer go; the network's own names stay."""
    assert W.canonical_name(name) == expected


def test_fused_and_padded_layout_is_matched(pair):
    """qkv_proj -> (q, k, v), gate_up_proj -> (gate, up), tied head -> the embedding, 1:1 otherwise."""
    _, engine, _, mapping = pair
    assert mapping["model.layers.1.self_attn.qkv_proj.bias"] == tuple(
        f"model.layers.1.self_attn.{p}_proj.bias" for p in "qkv"
    )
    assert mapping["model.layers.0.mlp.gate_up_proj.weight"] == (
        "model.layers.0.mlp.gate_proj.weight",
        "model.layers.0.mlp.up_proj.weight",
    )
    assert mapping["model.norm.weight"] == ("model.norm.weight",)
    assert mapping["lm_head.weight"] == ("lm_head.weight",)
    assert set(mapping) == set(_params(engine))


def test_names_match_across_other_prefixes(tiny_lm_dir):
    """An unfused engine whose names carry another prefix maps one to one."""
    model, _ = load_tiny_causal_lm(tiny_lm_dir("llama"))
    engine = nn.Module()
    engine.language_model = copy.deepcopy(model)
    mapping = W.map_parameters(_params(engine), W.trainer_weights(model))
    for name, parts in mapping.items():
        assert parts == (name.removeprefix("language_model."),)


def test_an_engine_parameter_without_counterpart_is_named(pair):
    """An engine parameter the trainer lacks raises a ValueError naming it."""
    _, engine, trainer, _ = pair
    engine.model.layers[0].self_attn.register_parameter("sinks", nn.Parameter(torch.zeros(4)))
    with pytest.raises(ValueError, match=r"model\.layers\.0\.self_attn\.sinks has no trainer"):
        W.map_parameters(_params(engine), trainer)


def test_a_trainer_tensor_the_engine_lacks_is_named(pair):
    """A trainer tensor no engine parameter holds raises a ValueError naming it."""
    _, engine, trainer, _ = pair
    del engine.model.layers[1].mlp.down_proj
    with pytest.raises(
        ValueError, match=r"trainer tensor model\.layers\.1\.mlp\.down_proj\.weight"
    ):
        W.map_parameters(_params(engine), trainer)


def test_sharing_keeps_the_trainer_values_and_the_model_output(pair):
    """After sharing, engine tensors hold the trainer's values, padding rows are 0, logits unchanged."""
    model, engine, trainer, mapping = pair
    ids = torch.tensor([[1, 4, 9, 16]])
    with torch.no_grad():
        before = model(ids).logits
        params_before = {n: p.clone() for n, p in model.named_parameters()}
    parameters = {id(p) for p in model.parameters()}
    W.share_parameters(_params(engine), trainer, mapping)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, before, rtol=0, atol=0)
    assert {id(p) for p in model.parameters()} == parameters  # same Parameter objects
    for name, p in model.named_parameters():
        torch.testing.assert_close(p, params_before[name], rtol=0, atol=0)
    torch.testing.assert_close(engine.model.layers[0].self_attn.qkv_proj.weight, _qkv(model))
    V = model.config.vocab_size
    embed = engine.model.embed_tokens.weight
    torch.testing.assert_close(embed[:V], model.model.embed_tokens.weight, rtol=0, atol=0)
    assert embed.shape[0] % 64 == 0 and bool((embed[V:] == 0).all())
    assert engine.lm_head.weight.data_ptr() == model.lm_head.weight.data_ptr()


def test_storage_check_passes_after_an_in_place_optimizer_step(pair):
    """Adam steps the trainer in place: the engine sees the new values and the storage check passes."""
    model, engine, trainer, mapping = pair
    W.share_parameters(_params(engine), trainer, mapping)
    old = _qkv(model).detach().clone()
    _train_step(model)
    assert W.storage_problems(W.parameter_layout(engine), trainer, mapping) == []
    new = _qkv(model)
    assert not torch.equal(new, old)
    torch.testing.assert_close(
        engine.model.layers[0].self_attn.qkv_proj.weight, new, rtol=0, atol=0
    )


def test_storage_check_catches_a_tensor_moved_away(pair):
    """A trainer part given new storage, or an engine tensor replaced, is reported by name."""
    model, engine, trainer, mapping = pair
    W.share_parameters(_params(engine), trainer, mapping)
    k_proj = model.model.layers[1].self_attn.k_proj.weight
    k_proj.data = k_proj.data.clone()  # what a .to(...) of the model would do
    engine.model.layers[0].mlp.down_proj.weight.data = torch.zeros_like(
        engine.model.layers[0].mlp.down_proj.weight
    )
    problems = W.storage_problems(W.parameter_layout(engine), trainer, mapping)
    assert any("layers.1.self_attn.qkv_proj.weight" in p and "k_proj" in p for p in problems)
    assert any("layers.0.mlp.down_proj.weight" in p for p in problems)
    assert len(problems) == 2


def test_sharing_twice_reuses_the_stacked_buffers(pair):
    """A second share finds the trainer's parts already stacked and allocates nothing new."""
    model, engine, trainer, mapping = pair
    W.share_parameters(_params(engine), trainer, mapping)
    first = W.parameter_layout(engine)
    second_engine = fused_engine(model.config)
    W.share_parameters(_params(second_engine), trainer, mapping)
    assert W.parameter_layout(second_engine) == first


def test_a_dtype_mismatch_forces_the_copy_fallback(pair):
    """A bfloat16 engine cannot use float32 storage: auto copies, shared is refused by name."""
    model, _, trainer, _ = pair
    engine = fused_engine(model.config, dtype=torch.bfloat16)
    mapping = W.map_parameters(_params(engine), trainer)
    problems = W.sharing_problems(_params(engine), trainer, mapping)
    assert len(problems) == len(mapping)
    assert "dtype torch.bfloat16 in the engine, torch.float32 in the trainer" in problems[0]
    assert choose_sharing("auto", lora=False, problems=problems) is False
    with pytest.raises(ValueError, match="vllm.weight_sync: got 'shared'"):
        choose_sharing("shared", lora=False, problems=problems)
    with pytest.raises(ValueError, match="cannot share weights"):
        W.share_parameters(_params(engine), trainer, mapping)


@pytest.mark.parametrize(
    ("weight_sync", "lora", "problems", "shared"),
    [
        ("auto", False, [], True),
        ("shared", False, [], True),
        ("load_weights", False, [], False),
        ("auto", True, [], False),
        ("load_weights", True, [], False),
    ],
)
def test_choose_sharing_table(weight_sync, lora, problems, shared):
    """Share only when allowed, possible, and not LoRA (whose engine weights are W + BA)."""
    assert choose_sharing(weight_sync, lora, problems) is shared


def test_shared_is_refused_for_lora():
    """weight_sync='shared' with a LoRA model is a ValueError naming the field."""
    with pytest.raises(ValueError, match="vllm.weight_sync: got 'shared' with a LoRA model"):
        choose_sharing("shared", lora=True, problems=[])


@torch.no_grad()
def _load_like_an_engine(engine, trainer, mapping) -> None:
    """What vLLM's load_weights does: copy (cast) each stacked trainer tensor into the engine's rows."""
    params = _params(engine)
    for name, parts in mapping.items():
        stacked = torch.cat([trainer[n] for n in parts])
        params[name][: stacked.shape[0]].copy_(stacked)


def test_fingerprints_detect_a_stale_copy(pair):
    """A bfloat16 copy checks equal; after an optimizer step it is stale; copying again fixes it."""
    model, _, trainer, _ = pair
    engine = fused_engine(model.config, dtype=torch.bfloat16)
    mapping = W.map_parameters(_params(engine), trainer)
    rows = W.expected_rows(trainer, mapping)

    def problems():
        fingerprints = W.parameter_fingerprints(engine, rows)
        return W.copy_problems(fingerprints, trainer, mapping, torch.bfloat16)

    with torch.no_grad():
        for p in engine.parameters():
            p.normal_(generator=torch.Generator().manual_seed(p.numel()))
    assert len(problems()) == len(mapping)  # random engine values: nothing matches yet
    _load_like_an_engine(engine, trainer, mapping)
    assert problems() == []
    _train_step(model)
    stale = problems()
    assert any("layers.0.self_attn.qkv_proj.weight" in p for p in stale)
    assert len(stale) > len(mapping) // 2
    _load_like_an_engine(engine, trainer, mapping)
    assert problems() == []


def test_fingerprint_hand_value_and_sensitivity():
    """Σ bits_i·(2i+1) mod 2^64; any one changed element or a swap changes it; layout does not."""
    t = torch.tensor([0.0, 1.0], dtype=torch.float32)  # bits 0 and 0x3F800000
    assert W.fingerprint(t) == 0x3F800000 * 3
    x = torch.randn(7, 5, generator=torch.Generator().manual_seed(0))
    base = W.fingerprint(x)
    assert W.fingerprint(x.t().contiguous().t()) == base  # same values, other memory layout
    for i in range(x.numel()):
        y = x.clone().view(-1)
        y[i] = torch.nextafter(y[i], torch.tensor(float("inf")))  # one ulp
        assert W.fingerprint(y) != base
    swapped = x.clone().view(-1)
    swapped[[0, 1]] = swapped[[1, 0]]
    assert W.fingerprint(swapped) != base
    for dtype in (torch.bfloat16, torch.float16, torch.float64):
        assert W.fingerprint(x.to(dtype)) == W.fingerprint(x.to(dtype).clone())


def test_fingerprint_is_the_same_chunked(monkeypatch):
    """Chunking (bounded temporaries) does not change the value."""
    x = torch.randn(1000, generator=torch.Generator().manual_seed(1))
    whole = W.fingerprint(x)
    monkeypatch.setattr(W, "_CHUNK", 7)
    assert W.fingerprint(x) == whole


def test_a_shared_model_still_saves_and_reloads(pair, tmp_path):
    """Parameters that are row blocks of a shared buffer save and load back unchanged."""
    from transformers import AutoModelForCausalLM

    model, engine, trainer, mapping = pair
    W.share_parameters(_params(engine), trainer, mapping)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    for (name, p), q in zip(model.state_dict().items(), loaded.state_dict().values(), strict=True):
        torch.testing.assert_close(q, p, rtol=0, atol=0, msg=name)


def test_lora_weights_are_merged_like_peft(tiny_lm_dir):
    """W + ΔW for every adapted layer equals PEFT's own merge_and_unload, by checkpoint name."""
    model, _ = load_tiny_causal_lm(tiny_lm_dir("qwen2"))
    lora = apply_lora(model, LoraSettings(r=4, alpha=8.0))
    with torch.no_grad():  # B starts at 0; make the adapters do something
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(generator=torch.Generator().manual_seed(len(name)))
    merged = W.trainer_weights(lora)
    reference = copy.deepcopy(lora).merge_and_unload()
    expected = dict(reference.named_parameters(remove_duplicate=False))
    assert set(merged) == set(expected)
    for name, tensor in expected.items():
        torch.testing.assert_close(merged[name], tensor, rtol=1e-5, atol=1e-7, msg=name)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(
        merged[q], model.get_submodule("model.layers.0.self_attn.q_proj.base_layer").weight
    )
