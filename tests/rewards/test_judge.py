"""Tests for grpo.rewards.judge: a frozen module scoring texts, batched, under no_grad."""

import math

import pytest
import torch
from torch import nn

from grpo.rewards.judge import JudgeReward


class LengthJudge(nn.Module):
    """logits = [0, w * len(text)] behind a dropout layer that only eval mode disables."""

    def __init__(self, w: float = 0.5) -> None:
        super().__init__()
        self.dropout = nn.Dropout(p=0.9)
        self.linear = nn.Linear(1, 2, bias=False)
        with torch.no_grad():
            self.linear.weight.copy_(torch.tensor([[0.0], [w]]))

    def forward(self, lengths):  # (N, 1) -> (N, 2)
        return self.linear(self.dropout(lengths))


def encode(texts):
    return torch.tensor([[float(len(t))] for t in texts])  # (N, 1)


def sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


def test_probability_readout_exact_values():
    """Class-1 probability of softmax([0, 0.5 * len]) = sigmoid(0.5 * len), prompt + completion read."""
    judge = JudgeReward(LengthJudge(), encode, batch_size=2)
    scores = judge(["ab", "", "x"], ["c", "", "yyy"])
    assert scores == pytest.approx([sigmoid(1.5), sigmoid(0.0), sigmoid(2.0)], rel=1e-6)


def test_logit_and_completion_only_readouts():
    """The logit readout gives w * len; include_prompt=False reads the completion alone."""
    judge = JudgeReward(LengthJudge(), encode, readout="logit", include_prompt=False)
    assert judge(["ignored prompt", "p"], ["abcd", ""]) == [2.0, 0.0]


def test_batched_equals_one_by_one_and_no_graph():
    """Scores do not depend on batch size; the output carries no autograd graph."""
    texts = ["a" * k for k in range(7)]
    one = JudgeReward(LengthJudge(), encode, batch_size=1).score_texts(texts)
    many = JudgeReward(LengthJudge(), encode, batch_size=4).score_texts(texts)
    assert torch.equal(one, many)
    assert not many.requires_grad and many.shape == (7,)


def test_judge_stays_frozen_and_in_eval_mode():
    """Parameters are frozen; train() is a no-op; a module switched to train mode is re-evaluated."""
    model = LengthJudge()
    judge = JudgeReward(model, encode)
    assert all(not p.requires_grad for p in model.parameters())
    judge.train()
    assert not model.training
    model.train()  # someone toggles the module itself: dropout must still be off when scoring
    scores = judge.compute_rewards(["aaaa"] * 50, [""] * 50)
    assert torch.allclose(scores, torch.full((50,), sigmoid(2.0)), rtol=1e-6)


def test_dict_encoder_and_scalar_readout():
    """encode may return a dict of keyword tensors; the scalar readout needs one output per text."""

    class Scalar(nn.Module):
        def forward(self, input_ids, scale):
            return input_ids.float().sum(dim=1, keepdim=True) * scale  # (N, 1)

    def encode_dict(texts):
        return {"input_ids": torch.tensor([[len(t), 1] for t in texts]), "scale": torch.tensor(2.0)}

    judge = JudgeReward(Scalar(), encode_dict, readout="scalar", include_prompt=False)
    assert judge(["", ""], ["abc", ""]) == [8.0, 2.0]
    with pytest.raises(ValueError, match="one output per text"):
        JudgeReward(LengthJudge(), encode, readout="scalar")([""], ["a"])


def test_bad_arguments():
    """Unknown readouts, non-modules and bad batch sizes are rejected by name."""
    with pytest.raises(ValueError, match="readout"):
        JudgeReward(LengthJudge(), encode, readout="best")
    with pytest.raises(TypeError, match="nn.Module"):
        JudgeReward(object(), encode)
    with pytest.raises(ValueError, match="batch_size"):
        JudgeReward(LengthJudge(), encode, batch_size=0)


class FixedOutput(nn.Module):
    """Returns the same tensor whatever it reads (a judge of the wrong shape)."""

    def __init__(self, output):
        super().__init__()
        self.output = output

    def forward(self, lengths):
        return self.output


def test_outputs_that_do_not_give_one_score_per_text_are_refused():
    """A readout must give one score per text; the label must be a class of the judge; the
    probability of a single logit (always 1) is refused and points to the sigmoid readout."""
    with pytest.raises(ValueError, match=r"shape \(\)\) gave shape \(1,\) for a batch of 2 texts"):
        JudgeReward(FixedOutput(torch.tensor(1.0)), encode, readout="scalar")(["", ""], ["a", "b"])
    with pytest.raises(ValueError, match=r"gave shape \(1,\) for a batch of 2"):
        JudgeReward(FixedOutput(torch.zeros(1, 2)), encode)(["", ""], ["a", "b"])
    with pytest.raises(ValueError, match="label=2 is not a class of the judge's 2"):
        JudgeReward(LengthJudge(), encode, label=2)([""], ["a"])
    with pytest.raises(ValueError, match="at least 2 classes.*'sigmoid'"):
        JudgeReward(FixedOutput(torch.zeros(1, 1)), encode, label=0)([""], ["a"])


def test_a_chat_prompt_is_read_whole():
    """Every message of a chat prompt reaches the judge (not only the last), one per line;
    a prompt of the wrong type is named as a prompt."""
    judge = JudgeReward(LengthJudge(), encode, separator="|")
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}]
    assert judge.texts([chat], ["4"]) == ["be brief\n2+2?|4"]
    with pytest.raises(TypeError, match=r"prompts\[0\] must be"):
        judge.texts([3], ["4"])
