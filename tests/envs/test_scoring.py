"""Tests for grpo.envs.scoring: whole-conversation log-probs with the assistant mask, shifted."""

import pytest
import torch
from tiny_models import load_tiny_causal_lm, spans

from grpo.envs.chat_mask import tokenize_with_assistant_mask
from grpo.envs.scoring import conversation_logprobs
from grpo.functional.logprobs import completion_logprobs

CONVERSATIONS = [
    [
        {"role": "user", "content": "say a b"},
        {"role": "assistant", "content": "a b"},
        {"role": "user", "content": "count"},
        {"role": "assistant", "content": "c d e"},
    ],
    [
        {"role": "system", "content": "the answer"},
        {"role": "user", "content": "red"},
        {"role": "assistant", "content": "blue green yes"},
    ],
]


@pytest.fixture(scope="module")
def tiny(tiny_lm_dir):
    model, tokenizer = load_tiny_causal_lm(tiny_lm_dir("llama"))
    return model.eval(), tokenizer


@torch.no_grad()
def test_one_pass_equals_scoring_each_turn_separately(tiny):
    """Each assistant span's log-probs equal a forward on its own prefix (causal attention, shift by one)."""
    model, tokenizer = tiny
    tokens = [tokenize_with_assistant_mask(tokenizer, c) for c in CONVERSATIONS]
    out = conversation_logprobs(model, tokens, pad_token_id=tokenizer.pad_token_id, temperature=0.7)
    for n, conversation in enumerate(tokens):
        ids = torch.tensor([conversation.input_ids])
        expected_mask = conversation.assistant_mask[1:] + [False] * (
            out.logprobs.shape[1] - len(ids[0]) + 1
        )
        assert out.completion_mask[n].tolist() == expected_mask
        for start, end in spans(conversation.assistant_mask):
            logits = model(input_ids=ids[:, :end]).logits  # (1, end, V): the prefix alone
            turn = completion_logprobs(logits, ids[:, start:end], 0.7)[0]  # (end - start,)
            torch.testing.assert_close(
                out.logprobs[n, start - 1 : end - 1], turn, rtol=1e-5, atol=1e-5
            )
    assert (out.logprobs[~out.completion_mask] == 0).all()


@torch.no_grad()
def test_padding_does_not_change_scores(tiny):
    """A conversation scored in a right-padded batch gets the same log-probs as scored alone."""
    model, tokenizer = tiny
    tokens = [tokenize_with_assistant_mask(tokenizer, c) for c in CONVERSATIONS]
    batch = conversation_logprobs(model, tokens, pad_token_id=tokenizer.pad_token_id)
    for n, conversation in enumerate(tokens):
        alone = conversation_logprobs(model, [conversation], pad_token_id=tokenizer.pad_token_id)
        width = alone.logprobs.shape[1]
        torch.testing.assert_close(
            batch.logprobs[n, :width], alone.logprobs[0], rtol=1e-5, atol=1e-5
        )


def test_gradient_reaches_only_through_assistant_tokens(tiny):
    """The gradient of the summed log-probs is that of the assistant spans' own log-probs,
    each scored on its prefix alone (1e-5): nothing flows from other positions."""
    model, tokenizer = tiny
    tokens = [tokenize_with_assistant_mask(tokenizer, CONVERSATIONS[0])]
    out = conversation_logprobs(model, tokens, pad_token_id=tokenizer.pad_token_id)
    assert int(out.completion_mask.sum()) == sum(tokens[0].assistant_mask)
    got = torch.autograd.grad(out.logprobs.sum(), list(model.parameters()), allow_unused=True)
    ids = torch.tensor([tokens[0].input_ids])
    spans_sum = sum(
        completion_logprobs(model(input_ids=ids[:, :end]).logits, ids[:, start:end], 1.0).sum()
        for start, end in spans(tokens[0].assistant_mask)
    )
    want = torch.autograd.grad(spans_sum, list(model.parameters()), allow_unused=True)
    assert any(g is not None and g.abs().sum() > 0 for g in want)
    for g, w in zip(got, want, strict=True):
        if w is None:
            assert g is None or not g.any()
        else:
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="at least one"):
        conversation_logprobs(model, [], pad_token_id=0)
