"""Tests for grpo.functional.sampling: top-k/top-p filtering and token choice.

The reference for filtering is independent: transformers' own logits warpers.
"""

import pytest
import torch
from transformers import TopKLogitsWarper, TopPLogitsWarper

from grpo.functional.sampling import choose_tokens, filter_logits

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
