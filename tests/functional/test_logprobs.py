"""Tests for grpo.functional.logprobs: values, gradients, causal shift, memory."""

import json
import math
import tempfile
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from grpo.functional import completion_logprobs, entropy_from_logits, selective_log_softmax

LN3 = math.log(3.0)


def _naive(logits, index):
    return torch.gather(logits.float().log_softmax(-1), -1, index.unsqueeze(-1)).squeeze(-1)


def test_selective_log_softmax_hand_values():
    """softmax([0, ln 3]) = [1/4, 3/4], so the picked log-probs are ln 0.25 and ln 0.75."""
    logits = torch.tensor([[0.0, LN3], [0.0, LN3], [LN3, 0.0]])
    index = torch.tensor([1, 0, 1])
    out = selective_log_softmax(logits, index)
    expected = torch.tensor([-0.2876820724517809, -1.3862943611198906, -1.3862943611198906])
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=0)


def test_selective_log_softmax_temperature_divides_logits():
    """Temperature 2 on [0, 2 ln 3] gives softmax([0, ln 3]): log 3/4 at index 1."""
    out = selective_log_softmax(torch.tensor([[0.0, 2 * LN3]]), torch.tensor([1]), temperature=2.0)
    torch.testing.assert_close(out, torch.tensor([-0.2876820724517809]), rtol=1e-6, atol=0)


@pytest.mark.parametrize("chunk_size", [1, 3, 7, None])
def test_selective_log_softmax_matches_naive_fp32_with_gradient(chunk_size):
    """Every chunk size gives the naive log_softmax+gather value and gradient in fp32."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 11, generator=gen, requires_grad=True)
    index = torch.randint(0, 11, (2, 5), generator=gen)
    weights = torch.randn(2, 5, generator=gen)
    out = selective_log_softmax(logits, index, chunk_size)
    (grad,) = torch.autograd.grad((out * weights).sum(), logits)
    ref = _naive(logits, index)
    (ref_grad,) = torch.autograd.grad((ref * weights).sum(), logits)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-6, atol=1e-6)


def test_selective_log_softmax_bf16_is_scored_in_fp32():
    """bf16 logits give fp32 log-probs equal to fp32 maths on the same values, gradient too."""
    gen = torch.Generator().manual_seed(1)
    logits = (torch.randn(3, 4, 50, generator=gen) * 4).to(torch.bfloat16).requires_grad_()
    index = torch.randint(0, 50, (3, 4), generator=gen)
    out = selective_log_softmax(logits, index, chunk_size=5)
    (grad,) = torch.autograd.grad(out.sum(), logits)
    ref = _naive(logits, index)
    (ref_grad,) = torch.autograd.grad(ref.sum(), logits)
    assert out.dtype == torch.float32 and grad.dtype == torch.bfloat16
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad.float(), ref_grad.float(), rtol=0, atol=0)


def test_selective_log_softmax_strided_input_value_and_gradient():
    """A non-contiguous slice (as after the causal shift) matches the naive form, gradient too."""
    gen = torch.Generator().manual_seed(2)
    full = torch.randn(3, 9, 13, generator=gen, requires_grad=True)
    index = torch.randint(0, 13, (3, 4), generator=gen)
    weights = torch.randn(3, 4, generator=gen)
    sliced = full[:, 4:8]
    assert not sliced.is_contiguous()
    out = selective_log_softmax(sliced, index, 3, temperature=0.5)
    (grad,) = torch.autograd.grad((out * weights).sum(), full)
    ref = _naive(sliced / 0.5, index)
    (ref_grad,) = torch.autograd.grad((ref * weights).sum(), full)
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-6, atol=1e-6)


def test_completion_logprobs_causal_shift_hand_values():
    """Positions P-1..P+T-2 score the T completion tokens; the last position is ignored."""
    # N=1, P=2, T=2, V=2: position 1 scores token 2, position 2 scores token 3
    logits = torch.tensor([[[9.0, -9.0], [0.0, LN3], [LN3, 0.0], [1e4, -1e4]]])
    ids = torch.tensor([[1, 1]])
    out = completion_logprobs(logits, ids)
    expected = torch.tensor([[-0.2876820724517809, -1.3862943611198906]])
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=0)
    out_t2 = completion_logprobs(logits * 2, ids, temperature=2.0)
    torch.testing.assert_close(out_t2, expected, rtol=1e-6, atol=0)


def test_completion_logprobs_equals_the_shifted_log_softmax_slice():
    """completion_logprobs equals log_softmax(logits[P-1:-1]).gather(targets), the slice written out."""
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 7, 10, generator=gen)
    input_ids = torch.randint(0, 10, (2, 7), generator=gen)
    prompt_length = 3
    expected = _naive(logits[:, prompt_length - 1 : -1] / 0.7, input_ids[:, prompt_length:])
    out = completion_logprobs(logits, input_ids[:, prompt_length:], temperature=0.7)
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)


def test_entropy_hand_values():
    """Uniform over 4 has entropy ln 4; softmax([0, ln 3]) has -(1/4 ln 1/4 + 3/4 ln 3/4)."""
    # -inf logits (tokens masked out) carry no mass and must not turn the entropy into NaN
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, LN3, -math.inf, -math.inf]])
    out = entropy_from_logits(logits, chunk_size=1)
    expected = torch.tensor([1.3862943611198906, 0.5623351446188083])
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=0)
    hot = entropy_from_logits(torch.tensor([[0.0, 2 * LN3]]), temperature=2.0)
    torch.testing.assert_close(hot, expected[1:], rtol=1e-6, atol=0)


def test_entropy_gradient_matches_naive():
    """Chunked entropy has the value and gradient of the naive -Σ p log p (fp64 and bf16)."""
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(2, 3, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(2, 3, generator=gen, dtype=torch.float64)
    for dtype, tol in ((torch.float64, 1e-10), (torch.bfloat16, 1e-5)):
        leaf = logits.detach().to(dtype).requires_grad_()
        out = entropy_from_logits(leaf, 0.8, 2)
        (grad,) = torch.autograd.grad((out * weights).sum(), leaf)
        logp = (leaf.double() / 0.8).log_softmax(-1)
        ref = -(logp.exp() * logp).sum(-1)
        (ref_grad,) = torch.autograd.grad((ref * weights).sum(), leaf)
        torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)
        torch.testing.assert_close(grad.double(), ref_grad.double(), rtol=tol, atol=tol)


def test_entropy_gradient_finite_with_masked_tokens():
    """-inf logits give a finite entropy gradient, 0 on the masked-out tokens."""
    logits = torch.tensor([[0.5, -math.inf, 1.0, -math.inf]], requires_grad=True)
    (grad,) = torch.autograd.grad(entropy_from_logits(logits).sum(), logits)
    assert torch.isfinite(grad).all() and grad[0, 1] == 0 and grad[0, 3] == 0


def _peak_bytes(fn):
    """Peak bytes allocated by torch on the CPU while fn runs, from the profiler's trace."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    # every allocation/free is a "[memory]" event carrying the running total
    with tempfile.TemporaryDirectory() as folder:
        trace = Path(folder) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text())["traceEvents"]
    memory = [e["args"] for e in events if e.get("name") == "[memory]"]
    memory = [m for m in memory if m.get("Device Type", 0) == 0]  # CPU
    start = memory[0]["Total Allocated"] - memory[0]["Bytes"]
    return max(m["Total Allocated"] for m in memory) - start


def test_selective_log_softmax_peak_memory_far_below_naive():
    """On 8 x 512 x 32000 bf16 logits the chunked peak is < 1/4 of the naive fp32 peak."""
    # allocation sizes do not depend on the values, and zeros are cheap to make
    logits = torch.zeros(8, 512, 32000, dtype=torch.bfloat16)
    index = torch.arange(8 * 512).reshape(8, 512) % 32000
    with torch.no_grad():
        naive = _peak_bytes(lambda: _naive(logits, index))
        chunked = _peak_bytes(lambda: selective_log_softmax(logits, index))
    assert naive >= 8 * 512 * 32000 * 4  # at least one full fp32 (N, T, V) tensor
    assert chunked < naive / 4, (chunked, naive)


def test_selective_log_softmax_backward_peak_memory_below_naive():
    """With gradients, chunks are recomputed in backward: peak < 1/4 of the naive fwd+bwd."""
    logits = torch.zeros(8, 512, 32000, dtype=torch.bfloat16, requires_grad=True)
    index = torch.arange(8 * 512).reshape(8, 512) % 32000

    def forward_backward(fn):
        def run():
            fn(logits, index).sum().backward()
            logits.grad = None

        return run

    naive = _peak_bytes(forward_backward(_naive))
    chunked = _peak_bytes(forward_backward(selective_log_softmax))
    assert chunked < naive / 4, (chunked, naive)


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda: selective_log_softmax(torch.zeros(2, 3), torch.zeros(2, 2).long()), "index"),
        (lambda: selective_log_softmax(torch.zeros(2, 3), torch.tensor([0, 3])), "index"),
        (lambda: selective_log_softmax(torch.zeros(2, 3), torch.zeros(2)), "index"),
        (lambda: selective_log_softmax(torch.zeros(2, 3).long(), torch.zeros(2).long()), "logits"),
        (lambda: selective_log_softmax(torch.zeros(2, 3), torch.zeros(2).long(), 0), "chunk_size"),
        (
            lambda: completion_logprobs(torch.zeros(1, 3, 4), torch.zeros(1, 1).long(), 0.0),
            "temperature",
        ),
        (
            lambda: completion_logprobs(torch.zeros(1, 3, 4), torch.zeros(1, 1).long(), -1.0),
            "temperature",
        ),
        (
            lambda: completion_logprobs(torch.zeros(1, 3, 4), torch.zeros(1, 3).long()),
            "completion_ids",
        ),
        (
            lambda: completion_logprobs(torch.zeros(2, 3, 4), torch.zeros(1, 2).long()),
            "completion_ids",
        ),
        (lambda: completion_logprobs(torch.zeros(3, 4), torch.zeros(1, 2).long()), "logits"),
        (lambda: entropy_from_logits(torch.zeros(2, 3), float("nan")), "temperature"),
    ],
)
def test_bad_input_names_the_argument(call, argument):
    """Bad shapes, dtypes, token ids and temperatures raise ValueError naming the argument."""
    with pytest.raises(ValueError, match=f"^{argument}:"):
        call()
