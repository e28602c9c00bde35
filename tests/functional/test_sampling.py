"""Tests for grpo.functional.sampling: top-k/top-p filtering and token choice.

The reference for filtering is independent: transformers' own logits warpers.
"""

import pytest
import torch
from transformers import TopKLogitsWarper, TopPLogitsWarper

from grpo.functional.sampling import choose_tokens, draw_indices, filter_logits

NEG = float("-inf")


def kept(logits):
    return (logits > NEG).tolist()


def test_filter_logits_by_hand():
    """Probabilities (0.5, 0.3, 0.15, 0.05): top-p keeps the smallest most-likely set reaching p."""
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    assert kept(filter_logits(logits, top_p=0.45)) == [[True, False, False, False]]
    assert kept(filter_logits(logits, top_p=0.6)) == [[True, True, False, False]]
    assert kept(filter_logits(logits, top_p=0.9)) == [[True, True, True, False]]
    assert kept(filter_logits(logits, top_p=1.0)) == [[True] * 4]
    assert kept(filter_logits(logits, top_k=2)) == [[True, True, False, False]]
    assert kept(filter_logits(logits, top_k=3, top_p=0.6)) == [[True, True, False, False]]
    ties = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    assert kept(filter_logits(ties, top_k=2)) == [[True, True, True, False]]  # ties stay
    kept_values = filter_logits(logits, top_k=2)[0, :2]
    assert torch.equal(kept_values, logits[0, :2])  # kept logits are untouched


@pytest.mark.parametrize("top_k,top_p", [(5, 1.0), (0, 0.7), (7, 0.85), (1, 0.3)])
def test_filter_logits_equals_transformers_warpers(top_k, top_p):
    """Same tokens kept as transformers' TopK then TopP warpers, on random rows."""
    torch.manual_seed(0)
    logits = torch.randn(64, 50) * 3
    want = logits
    if top_k:
        want = TopKLogitsWarper(top_k)(None, want)
    if top_p < 1:
        want = TopPLogitsWarper(top_p)(None, want)
    assert kept(filter_logits(logits, top_k, top_p)) == kept(want)


def test_choose_tokens_greedy_and_sampled_frequencies():
    """Greedy is the argmax; sampled frequencies match the filtered, tempered softmax."""
    logits = torch.tensor([[0.0, 2.0, 1.0, -1.0]])
    assert choose_tokens(logits, False, 1.0, 0, 1.0).tolist() == [1]
    torch.manual_seed(0)
    draws = choose_tokens(logits.expand(40000, 4), True, 2.0, 3, 1.0)  # token 3 filtered out
    freq = torch.bincount(draws, minlength=4).double() / draws.numel()
    want = torch.tensor([0.0, 1.0, 0.5, NEG]).softmax(-1).double()
    assert freq[3] == 0 and torch.allclose(freq, want, atol=0.01)


@pytest.mark.parametrize("V", [5000, 5120])  # padded to whole blocks, and whole already
def test_draw_indices_frequencies_match_a_peaked_distribution(V):
    """Each index is drawn at its probability: a large vocabulary, most mass on a few tokens,
    unnormalised rows (the sum is the row's own), chi-square against the exact rates."""
    n = 60000
    logits = torch.full((V,), -30.0)
    logits[[7, 1234, 4999]] = torch.tensor([1.0, 0.0, -1.0])
    probs = logits.softmax(-1) * 3.0  # rows need not sum to one
    draws = draw_indices(probs.expand(n, V), torch.Generator().manual_seed(0))
    want = probs.double() / probs.double().sum()  # (V,)
    counts = torch.bincount(draws, minlength=V).double()
    top = [7, 1234, 4999]
    expected = want[top] * n
    chi2 = float(((counts[top] - expected) ** 2 / expected).sum())
    assert chi2 < 13.8  # 3 cells, 2 degrees of freedom: p = 0.001
    assert counts.sum() - counts[top].sum() < 20  # the rest holds about 3e-9 of the mass


def test_draw_indices_never_draws_a_zero_probability_index(monkeypatch):
    """Zero entries own empty intervals, at both ends of a row and between kept ones, even
    when the uniform times the row's total rounds up to the total itself."""
    probs = torch.tensor([[0.0, 0.2, 0.0, 0.8, 0.0, 0.0]]).expand(20000, 6)
    draws = draw_indices(probs, torch.Generator().manual_seed(1))
    assert set(draws.tolist()) == {1, 3}
    for uniform, want in ((1.0, 3), (0.0, 1)):  # 1.0: the product's rounding at its worst
        monkeypatch.setattr(
            torch, "rand", lambda shape, uniform=uniform, **_: torch.full(shape, uniform).double()
        )
        assert draw_indices(probs[:2]).tolist() == [want, want]


def test_draw_indices_repeats_with_a_seeded_generator():
    """Draws come from the generator given (the masked fill-in policy's own), else the global one."""
    probs = torch.rand(8, 100)
    one = draw_indices(probs, torch.Generator().manual_seed(3))
    two = draw_indices(probs, torch.Generator().manual_seed(3))
    assert torch.equal(one, two)
    torch.manual_seed(4)
    three = draw_indices(probs)
    torch.manual_seed(4)
    assert torch.equal(draw_indices(probs), three)


def test_draw_indices_names_a_row_that_cannot_be_drawn_from():
    """A row of zeros, a nan or an inf is refused with the row's index, not drawn from."""
    for bad in (0.0, float("nan"), float("inf")):
        probs = torch.ones(3, 300)
        probs[1] = 0.0 if bad == 0.0 else probs[1]
        probs[1, 5] = bad
        with pytest.raises(ValueError, match="row 1 sums to"):
            draw_indices(probs)
