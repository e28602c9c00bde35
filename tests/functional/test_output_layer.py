"""Log-probs and entropy from hidden states equal those from materialised logits, with gradients."""

from __future__ import annotations

import pytest
import torch

from grpo.functional.logprobs import entropy_from_logits, selective_log_softmax
from grpo.functional.output_layer import output_layer_entropy, output_layer_logprobs


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


def test_bf16_inputs_are_scored_in_fp32():
    """bf16 hidden and weight: fp32 log-probs equal to the fp32 computation on the same values."""
    hidden, weight, _, index = _inputs(dtype=torch.float32, bias=False, seed=3)
    h16, w16 = hidden.detach().bfloat16(), weight.detach().bfloat16()
    ours = output_layer_logprobs(h16, w16, index)
    assert ours.dtype == torch.float32
    plain = selective_log_softmax(h16.float() @ w16.float().T, index)
    torch.testing.assert_close(ours, plain, rtol=1e-5, atol=1e-5)


def test_bad_shapes_name_the_argument():
    """A weight of the wrong width and an out-of-range id are rejected by name."""
    hidden, weight, _, index = _inputs(bias=False)
    with pytest.raises(ValueError, match="weight"):
        output_layer_logprobs(hidden, weight[:, :4], index)
    with pytest.raises(ValueError, match="index"):
        output_layer_logprobs(hidden, weight, index + 11)
