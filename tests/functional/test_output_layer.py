"""Log-probs and entropy from hidden states equal those from materialised logits, with gradients."""

from __future__ import annotations

import pytest
import torch

from grpo.functional.logprobs import entropy_from_logits, selective_log_softmax
from grpo.functional.output_layer import (
    output_layer_entropy,
    output_layer_logprobs,
    output_layer_logprobs_entropy,
)


def _inputs(dtype=torch.float64, bias=True, seed=0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(3, 5, 8, generator=gen, dtype=dtype, requires_grad=True)  # (N, T, H)
    weight = torch.randn(11, 8, generator=gen, dtype=dtype, requires_grad=True)  # (V, H)
    b = torch.randn(11, generator=gen, dtype=dtype, requires_grad=True) if bias else None
    index = torch.randint(0, 11, (3, 5), generator=gen)  # (N, T)
    return hidden, weight, b, index


@pytest.mark.parametrize("chunk_size", [1, 4, None])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_and_gradients_equal_the_plain_computation(chunk_size, temperature):
    """fp64: values and d/d(hidden, weight, bias) equal log_softmax(h W^T + b) gathered, to 1e-12."""
    hidden, weight, bias, index = _inputs()
    upstream = torch.randn(3, 5, dtype=torch.float64)
    ours = output_layer_logprobs(
        hidden, weight, index, bias=bias, temperature=temperature, chunk_size=chunk_size
    )
    got = torch.autograd.grad((ours * upstream).sum(), (hidden, weight, bias))
    logits = (hidden @ weight.T + bias) / temperature  # (N, T, V)
    plain = logits.log_softmax(-1).gather(-1, index[..., None]).squeeze(-1)
    want = torch.autograd.grad((plain * upstream).sum(), (hidden, weight, bias))
    torch.testing.assert_close(ours, plain, rtol=1e-12, atol=1e-12)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


def test_gradcheck_without_bias():
    """torch.autograd.gradcheck passes for hidden and weight (no bias, two rows per chunk)."""
    hidden, weight, _, index = _inputs(bias=False, seed=1)

    def fn(h, w):
        return output_layer_logprobs(h, w, index, chunk_size=2)

    assert torch.autograd.gradcheck(fn, (hidden, weight))


def test_entropy_equals_entropy_from_logits():
    """Entropy and its gradient equal entropy_from_logits on the materialised logits."""
    hidden, weight, bias, _ = _inputs(seed=2)
    ours = output_layer_entropy(hidden, weight, bias=bias, temperature=1.3, chunk_size=3)
    plain = entropy_from_logits(hidden @ weight.T + bias, temperature=1.3)
    torch.testing.assert_close(ours, plain, rtol=1e-12, atol=1e-12)
    got = torch.autograd.grad(ours.sum(), (hidden, weight))
    want = torch.autograd.grad(plain.sum(), (hidden, weight))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("weights", [(1.0, 0.0), (0.0, 1.0), (0.3, -2.0)])
def test_logprobs_and_entropy_in_one_pass_equal_the_plain_computation(weights):
    """One pass for both: values, and d/d(hidden, weight, bias) of a loss on either or both
    (a weight 0 leaves that output out of the loss), equal the materialised logits' to 1e-10."""
    hidden, weight, bias, index = _inputs(seed=4)
    a, b = weights
    logprobs, entropy = output_layer_logprobs_entropy(
        hidden, weight, index, bias=bias, temperature=0.7, chunk_size=4
    )
    logits = (hidden @ weight.T + bias) / 0.7  # (N, T, V)
    want_logprobs = logits.log_softmax(-1).gather(-1, index[..., None]).squeeze(-1)
    want_entropy = entropy_from_logits(logits)
    torch.testing.assert_close(logprobs, want_logprobs, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(entropy, want_entropy, rtol=1e-12, atol=1e-12)
    upstream = torch.randn(3, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(5))

    def loss(lp, ent):  # an output of weight 0 is not in the graph at all
        terms = [w * (x * upstream).sum() for w, x in ((a, lp), (b, ent)) if w != 0.0]
        return sum(terms)

    got = torch.autograd.grad(loss(logprobs, entropy), (hidden, weight, bias))
    want = torch.autograd.grad(loss(want_logprobs, want_entropy), (hidden, weight, bias))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


def test_where_computes_the_chosen_positions_only():
    """`where`: the plain values there and 0 elsewhere, the plain gradient of a loss on those
    positions; hidden states elsewhere are never used (nan there leaves everything finite)."""
    hidden, weight, bias, index = _inputs(seed=6)
    where = torch.rand(3, 5, generator=torch.Generator().manual_seed(7)) < 0.5  # (N, T)
    poisoned = torch.where(where[..., None], hidden, torch.full_like(hidden, float("nan")))
    logprobs, entropy = output_layer_logprobs_entropy(
        poisoned, weight, index, bias=bias, chunk_size=2, where=where
    )
    alone = output_layer_logprobs(poisoned, weight, index, bias=bias, where=where)
    logits = hidden @ weight.T + bias  # (N, T, V)
    want = logits.log_softmax(-1).gather(-1, index[..., None]).squeeze(-1)
    zero = torch.zeros((), dtype=torch.float64)
    torch.testing.assert_close(logprobs, torch.where(where, want, zero), rtol=1e-12, atol=1e-12)
    # the same values whether chunked or not, to float64 rounding: how a BLAS splits a product
    # of another row count (chunks of 2 against all rows) may round the last bit otherwise
    torch.testing.assert_close(alone, logprobs, rtol=1e-14, atol=1e-14)
    want_entropy = torch.where(where, entropy_from_logits(logits), zero)
    torch.testing.assert_close(entropy, want_entropy, rtol=1e-12, atol=1e-12)
    got = torch.autograd.grad((logprobs + entropy).sum(), (hidden, weight, bias))
    plain = torch.where(where, want + entropy_from_logits(logits), zero).sum()
    expected = torch.autograd.grad(plain, (hidden, weight, bias))
    for g, w in zip(got, expected, strict=True):
        assert g.isfinite().all()
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="where"):
        output_layer_logprobs(hidden, weight, index, where=where.long())


def test_bf16_inputs_are_scored_in_fp32():
    """bf16 hidden and weight: fp32 log-probs equal to the fp32 computation on the same values."""
    hidden, weight, _, index = _inputs(dtype=torch.float32, bias=False, seed=3)
    h16, w16 = hidden.detach().bfloat16(), weight.detach().bfloat16()
    ours = output_layer_logprobs(h16, w16, index)
    assert ours.dtype == torch.float32
    plain = selective_log_softmax(h16.float() @ w16.float().T, index)
    torch.testing.assert_close(ours, plain, rtol=1e-5, atol=1e-5)


def _bf16_matmul_reference(hidden, weight, bias, index, temperature):
    """log_softmax of logits from bfloat16 matrix products, widened to fp32: what autocast's
    bf16-mixed gives a model's own output layer (N, T, H), (V, H) -> (N, T)."""
    logits = (hidden.bfloat16() @ weight.bfloat16().T).float() + bias  # (N, T, V)
    return (logits / temperature).log_softmax(-1).gather(-1, index[..., None]).squeeze(-1)


def test_bfloat16_products_equal_the_plain_computation_with_bfloat16_matmuls():
    """A bfloat16 product_weight over one chunk: log-probs and d/d(hidden, bias) equal those
    of logits = (hidden.bf16 @ weight.bf16^T).float() + bias by autograd, to fp32 rounding,
    and d/d(weight) that of the same logits from the fp32 rows (summed in fp32); they differ
    from the fp32 products' (the products really ran in bf16)."""
    hidden, weight, bias, index = _inputs(dtype=torch.float32, seed=7)
    upstream = torch.randn(3, 5)
    fold = {"bias": bias, "temperature": 0.7}
    low = weight.detach().bfloat16()
    ours = output_layer_logprobs(hidden, weight, index, product_weight=low, **fold)
    got = torch.autograd.grad((ours * upstream).sum(), (hidden, weight, bias))
    plain = _bf16_matmul_reference(hidden, weight, bias, index, 0.7)
    want = torch.autograd.grad((plain * upstream).sum(), (hidden, bias))
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, plain, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[2], want[1], rtol=1e-5, atol=1e-5)
    # the weight's gradient: d/dz of the bf16 logits, times the fp32 rows, summed in fp32
    logits = (hidden.detach().bfloat16() @ low.T).float() + bias.detach()  # (N, T, V)
    logits.requires_grad_()
    chosen = (logits / 0.7).log_softmax(-1).gather(-1, index[..., None]).squeeze(-1)
    (grad_z,) = torch.autograd.grad((chosen * upstream).sum(), (logits,))
    torch.testing.assert_close(got[1], torch.einsum("ntv,nth->vh", grad_z, hidden.detach()),
                               rtol=1e-5, atol=1e-6)  # fmt: skip
    fp32 = output_layer_logprobs(hidden, weight, index, **fold)
    assert (ours - fp32).abs().max() > 1e-4


@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("trains", [True, False])
def test_bfloat16_products_over_chunks_stay_within_bfloat16_rounding_of_fp64(weight_dtype, trains):
    """Several chunks: log-probs and entropy within 0.05 and gradients within 2 % of the fp64
    computation, for a float32 weight (bf16-mixed's masters) and a bfloat16 one (bf16-copy's,
    multiplied as it is), trained (its gradient summed chunk by chunk in fp32 and returned
    in its own dtype) or frozen (no gradient)."""
    hidden, weight, bias, index = _inputs(dtype=torch.float32, seed=8)
    truth = [t.detach().double().requires_grad_() for t in (hidden, weight, bias)]
    upstream = torch.randn(3, 5)
    lp, ent = output_layer_logprobs_entropy(*truth[:2], index, bias=truth[2])
    want = torch.autograd.grad((lp * upstream + ent).sum(), truth)
    w = weight.detach().to(weight_dtype).requires_grad_(trains)
    low = w.detach().bfloat16()  # bf16-copy's weight is its own product weight
    ours = output_layer_logprobs_entropy(
        hidden, w, index, bias=bias, chunk_size=4, product_weight=low
    )
    torch.testing.assert_close(ours[0].double(), lp, rtol=0, atol=0.05)
    torch.testing.assert_close(ours[1].double(), ent, rtol=0, atol=0.05)
    inputs = (hidden, w, bias) if trains else (hidden, bias)
    got = torch.autograd.grad((ours[0] * upstream + ours[1]).sum(), inputs)
    expected = want if trains else (want[0], want[2])
    for g, e in zip(got, expected, strict=True):
        assert (g.double() - e).norm() / e.norm() < 2e-2
    if trains:
        assert got[1].dtype == weight_dtype


def test_the_weight_as_its_own_product_weight_is_the_default_bit_for_bit():
    """product_weight=weight (what a scorer passes under fp32) is product_weight=None exactly,
    in log-probs, entropy and every gradient, over several chunks."""
    results = []
    for own in (False, True):
        hidden, weight, bias, index = _inputs(dtype=torch.float32, seed=9)
        lp, ent = output_layer_logprobs_entropy(
            hidden, weight, index, bias=bias, chunk_size=4, product_weight=weight if own else None
        )
        grads = torch.autograd.grad((lp + 0.5 * ent).sum(), (hidden, weight, bias))
        results.append([lp, ent, *grads])
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)


def test_bad_shapes_name_the_argument():
    """A weight of the wrong width and an out-of-range id are rejected by name."""
    hidden, weight, _, index = _inputs(bias=False)
    with pytest.raises(ValueError, match=r"^weight: got \(\d+, 4\)"):
        output_layer_logprobs(hidden, weight[:, :4], index)
    with pytest.raises(ValueError, match=r"^index: token ids must lie in \[0, V"):
        output_layer_logprobs(hidden, weight, index + 11)
    for wrong in (weight[:5].bfloat16(), weight.long(), "bfloat16"):
        with pytest.raises(ValueError, match="product_weight"):
            output_layer_logprobs(hidden, weight, index, product_weight=wrong)


def test_a_frozen_weight_gets_no_gradient_and_the_hidden_gradient_is_unchanged():
    """With the weight and bias frozen (requires_grad False), d/d(hidden) is bit for bit the
    one computed with them trainable, and no gradient is made for them (their .grad stays
    None); a bfloat16 weight gives the same log-probs as its float32 value."""
    hidden, weight, bias, index = _inputs(dtype=torch.float32)
    upstream = torch.randn(3, 5)
    trained = output_layer_logprobs_entropy(hidden, weight, index, bias=bias, chunk_size=4)
    (want,) = torch.autograd.grad((trained[0] * upstream).sum(), (hidden,))
    frozen_w, frozen_b = weight.detach(), bias.detach()
    ours = output_layer_logprobs_entropy(hidden, frozen_w, index, bias=frozen_b, chunk_size=4)
    (ours[0] * upstream).sum().backward()
    assert torch.equal(hidden.grad, want)
    assert frozen_w.grad is None and frozen_b.grad is None
    low = weight.detach().to(torch.bfloat16)
    got = output_layer_logprobs(hidden.detach(), low, index, chunk_size=4)
    plain = output_layer_logprobs(hidden.detach(), low.float(), index, chunk_size=4)
    assert torch.equal(got, plain)


def _default_and_one_block(V: int, rows: int) -> tuple[list, list, int]:
    """Log-probs, entropy and the hidden, weight and bias gradients with the default chunk and
    with chunk_size = one block (about DEFAULT_CHUNK_ELEMENTS logits), and the block's rows."""
    from grpo.functional.logprobs import DEFAULT_CHUNK_ELEMENTS

    H, block = 16, DEFAULT_CHUNK_ELEMENTS // V
    gen = torch.Generator().manual_seed(5)
    results = []
    for chunk_size in (None, block):
        hidden = torch.randn(rows, H, generator=gen.manual_seed(5), requires_grad=True)
        weight = (torch.randn(V, H, generator=gen) * 0.1).requires_grad_()
        bias = torch.randn(V, generator=gen).requires_grad_()
        index = torch.randint(0, V, (rows,), generator=gen)
        lp, ent = output_layer_logprobs_entropy(
            hidden, weight, index, bias=bias, temperature=0.7, chunk_size=chunk_size
        )
        (lp.sum() + 0.5 * ent.sum()).backward()
        results.append([lp, ent, hidden.grad, weight.grad, bias.grad])
    return results[0], results[1], block


def test_the_default_chunk_gives_the_results_of_one_block_per_chunk():
    """Over a large vocabulary (a block of 32 rows at V = 2**17) the default chunk holds
    CHUNK_ROWS // 32 blocks and returns what chunk_size = one block returns to float rounding:
    the rows of a chunk are independent. (Not always bit for bit: a matrix-product kernel may
    round a row differently inside a larger product, and the weight's gradient sums per
    chunk.)"""
    from grpo.functional.output_layer import CHUNK_ROWS

    rows = 2 * CHUNK_ROWS + 5  # two chunks of several blocks, and a short tail
    ours, one_block, block = _default_and_one_block(2**17, rows)
    assert 1 < block <= CHUNK_ROWS // 2  # several blocks a chunk
    for got, want in zip(ours, one_block, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


def test_a_block_over_half_the_chunk_rows_is_a_chunk_bit_for_bit():
    """Where two blocks do not fit in CHUNK_ROWS rows (85 rows over SmolLM2's 49,152 tokens)
    the default chunk is one block, so every result equals chunk_size = one block bit for
    bit: runs recorded with one block a chunk replay exactly."""
    from grpo.functional.output_layer import CHUNK_ROWS

    ours, one_block, block = _default_and_one_block(49_152, 7 * 85 + 5)
    assert CHUNK_ROWS // 2 < block <= CHUNK_ROWS
    for got, want in zip(ours, one_block, strict=True):
        assert torch.equal(got, want)
