"""Scratch: write the core of GRPO in raw PyTorch, one function at a time, and test it here.

    python workshop/scratch.py            # run the checks of every function written so far
    python workshop/scratch.py --answers  # the answers to the checkpoint questions

This is the bottom layer of picoRL's workshop: the simplest form of each
idea, no abstractions, every line explicit. Fill in the functions marked
YOUR CODE from the top; each has an inline check against a tiny model or a
hand-computed value, and checkpoint questions to answer before looking at the
answers. Then carry what you wrote into workshop/stubs/ (the library-grade
versions, checked by `python -m workshop.check`).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a clone

# --------------------------------------------------------------- 1. the causal shift
# Q1. The model returns logits of shape (B, L, V) for input_ids (B, L).
#     What does logits[:, -1] predict?
# Q2. Which position of `logits` scores input_ids[:, 3]?
# Q3. How many log-probs does a sequence of L tokens have, and why not L?


def get_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """log p(input_ids[:, t+1] | input_ids[:, :t+1]) for every t: (B, L, V), (B, L) -> (B, L-1).

    YOUR CODE: shift the logits and the labels by one, log_softmax, gather.
    """
    raise NotImplementedError("get_logprobs")


def check_get_logprobs(fn=None) -> None:
    """Each log-prob equals the one from running the model on the prefix alone."""
    fn = fn or get_logprobs
    from workshop.train import build_model, build_tokenizer

    tokenizer = build_tokenizer()
    model = build_model(tokenizer, seed=0).eval()
    ids = torch.tensor([tokenizer("say red the blue")["input_ids"]])  # (1, 4)
    with torch.no_grad():
        out = fn(model(ids).logits, ids)  # (1, 3)
        for t in range(ids.shape[1] - 1):
            # the last position of the prefix ids[:, :t+1] predicts token t+1
            prefix = model(ids[:, : t + 1]).logits[0, -1].log_softmax(-1)
            expected = prefix[ids[0, t + 1]]
            assert torch.allclose(out[0, t], expected, atol=1e-5), f"log-prob of token {t + 1}"
    assert out.shape == (1, 3), f"shape {tuple(out.shape)}, expected (1, 3)"


# --------------------------------------------------------------- 2. advantages
# Q4. Rewards of one group are [1, 1, 1, 1]. What are the advantages, and what
#     does this group teach the model?
# Q5. PPO learns a value network as its baseline. What does GRPO use instead?


def compute_advantages(rewards: torch.Tensor, group_size: int, normalize: bool = True):
    """Advantage of each sample against its group: (N,) -> (N,), groups of G consecutive samples.

    YOUR CODE: r - mean(group); with `normalize`, divide by std(group) + 1e-4.
    """
    raise NotImplementedError("compute_advantages")


def check_compute_advantages(fn=None) -> None:
    """[0, 1, 2, 3] in one group centres to [-1.5, -0.5, 0.5, 1.5]; groups stay apart."""
    fn = fn or compute_advantages
    rewards = torch.tensor([0.0, 1.0, 2.0, 3.0, 5.0, 5.0])
    out = fn(rewards[:4], 4, normalize=False)
    assert torch.allclose(out, torch.tensor([-1.5, -0.5, 0.5, 1.5])), f"got {out.tolist()}"
    std = torch.tensor([0.0, 1.0, 2.0, 3.0]).std() + 1e-4  # unbiased, as torch.std
    out = fn(rewards[:4], 4)
    assert torch.allclose(out, torch.tensor([-1.5, -0.5, 0.5, 1.5]) / std), f"got {out.tolist()}"
    out = fn(torch.tensor([0.0, 1.0, 5.0, 5.0]), 2, normalize=False)
    assert torch.allclose(out, torch.tensor([-0.5, 0.5, 0.0, 0.0])), f"groups: {out.tolist()}"


# --------------------------------------------------------------- 3. the loss
# Q6. Why is there a minus sign in the loss?
# Q7. The mask marks assistant tokens in input_ids (B, L); the log-probs are (B, L-1).
#     Is the mask to use mask[:, 1:] or mask[:, :-1]?
# Q8. An advantage of 0 for every sample: what is the gradient?


def grpo_loss(logprobs: torch.Tensor, mask: torch.Tensor, advantages: torch.Tensor):
    """picoRL's loss: -(advantage * sum of the masked log-probs).mean(): (B, T), (B, T), (B,) -> ().

    YOUR CODE: mask (mask is bool), sum over T, weight by the advantage, mean, negate.
    """
    raise NotImplementedError("grpo_loss")


def check_grpo_loss(fn=None) -> None:
    """Hand value, and one gradient step makes the positive-advantage action more likely."""
    fn = fn or grpo_loss
    logprobs = torch.tensor([[-1.0, -2.0], [-3.0, -4.0]])
    mask = torch.tensor([[True, True], [True, False]])
    value = fn(logprobs, mask, torch.tensor([1.0, 0.5]))
    # masked sums [-3, -3]: -(1 * -3 + 0.5 * -3) / 2
    assert torch.isclose(value, torch.tensor(2.25)), f"got {value.item()}, expected 2.25"
    # a 3-armed bandit: sample arm 0 with advantage +1, arm 1 with -1
    z = torch.zeros(3, requires_grad=True)
    picked = z.log_softmax(-1)[torch.tensor([0, 1])][:, None]  # (2, 1)
    fn(picked, torch.ones(2, 1, dtype=torch.bool), torch.tensor([1.0, -1.0])).backward()
    with torch.no_grad():
        p = (z - 0.5 * z.grad).softmax(-1)  # one step of gradient descent
    assert p[0] > 1 / 3 > p[1], f"probabilities after one step: {p.tolist()}"


# --------------------------------------------------------------- 4. the assistant mask
# Q9. Why encode messages[:1], messages[:2], ... instead of searching for role tokens?
# Q10. A template drops the content of past assistant turns. What goes wrong?


def assistant_mask(tokenizer, messages: list[dict[str, str]]) -> tuple[list[int], list[bool]]:
    """(ids, mask) of the conversation; mask True on the tokens each assistant message adds.

    YOUR CODE: prev = 0; for i, message: ids = tokenizer.apply_chat_template(
    messages[:i+1], tokenize=True, return_dict=False); assistant -> mark ids[prev:len(ids)].
    """
    raise NotImplementedError("assistant_mask")


def check_assistant_mask(fn=None) -> None:
    """On a two-turn chat, exactly the assistant's words and end tokens are marked."""
    fn = fn or assistant_mask
    from workshop.train import build_tokenizer

    tokenizer = build_tokenizer()
    chat = [
        {"role": "user", "content": "say red"},
        {"role": "assistant", "content": "blue"},
        {"role": "user", "content": "say red green blue or yellow"},
        {"role": "assistant", "content": "red"},
    ]
    ids, mask = fn(tokenizer, chat)
    marked = tokenizer.convert_ids_to_tokens([i for i, m in zip(ids, mask, strict=True) if m])
    # this is picoRL's plain version: the role header of each turn is marked too
    assert marked == ["<|assistant|>", "blue", "<|end|>", "<|assistant|>", "red", "<|end|>"]
    assert ids == tokenizer.apply_chat_template(chat, tokenize=True, return_dict=False)


CHECKS = {
    "get_logprobs": check_get_logprobs,
    "compute_advantages": check_compute_advantages,
    "grpo_loss": check_grpo_loss,
    "assistant_mask": check_assistant_mask,
}

ANSWERS = """
Q1. The token after the sequence: it is not in input_ids, so no log-prob uses it
    (at sampling time it is exactly what generates the next token).
Q2. logits[:, 2]: position t predicts token t+1.
Q3. L-1: the first token has no position before it to predict it.
Q4. All zero: a group where every sample did equally well carries no signal
    (nothing to prefer), so it adds nothing to the gradient.
Q5. The mean reward of the G samples of the same prompt: a baseline per prompt,
    estimated from the samples themselves, so no value network is trained or stored.
Q6. Optimisers minimise; we want to maximise advantage-weighted log-likelihood.
Q7. mask[:, 1:]: log-prob t belongs to token t+1, so the mask of token t+1 goes with it.
Q8. Zero: REINFORCE moves the policy only in proportion to the advantages.
Q9. It works with any chat template: the template decides where a message's tokens
    go, and the difference in length between two renderings shows it.
Q10. The longer rendering no longer starts with the shorter one, so the lengths
    point at the wrong tokens and the mask is silently shifted. The library
    checks that each rendering is a prefix of the next (part 5) and raises.
"""


def main(argv: list[str]) -> int:
    if "--answers" in argv:
        print(ANSWERS)
        return 0
    failures = 0
    for name, check in CHECKS.items():
        try:
            check()
        except NotImplementedError:
            print(f"{name:20s} not written yet")
        except AssertionError as error:
            failures += 1
            print(f"{name:20s} wrong: {(check.__doc__ or '').strip()} ({error})")
        else:
            print(f"{name:20s} ok")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
