"""The scoring tests' rows (groups behind shared prompts, ragged and shuffled) and their
comparison of scores and gradients against the plain forward's."""

from __future__ import annotations

import random
from collections.abc import Callable

import torch

from grpo.lm.completion import Completion
from grpo.lm.scoring import ScoringSettings, score_completions

__all__ = [
    "assert_same_scores",
    "grouped_completions",
    "input_shapes",
    "score_and_grads",
    "scoring_settings",
]

TOLERANCE = {"atol": 1e-5, "rtol": 1e-5}
GRAD_TOLERANCE = {"atol": 1e-5, "rtol": 1e-4}


def grouped_completions(
    vocab: int, eos: int, group_size: int, length: Callable[[int, int], int], seed: int = 0
) -> list[Completion]:
    """Groups of `group_size` rows behind prompts of 4, 9, 1 and 6 tokens, row j of prompt p
    with `length(p, j)` tokens (the second row of every other group cut by an EOS after two
    and followed by two more), and one row with a prompt of its own; shuffled, so a prompt's
    rows are not contiguous."""
    rng = random.Random(seed)
    words = [t for t in range(3, vocab) if t != eos]
    prompts = [rng.choices(words, k=k) for k in (4, 9, 1, 6)]
    out = []
    for p, prompt in enumerate(prompts):
        for j in range(group_size):
            ids = rng.choices(words, k=length(p, j))
            if j == 1 and p % 2:
                ids = [*ids[:2], eos, *rng.choices(words, k=2)]
            out.append(Completion("x", ids, prompt, truncated=False, finished_by_eos=eos in ids))
    out.append(Completion("x", rng.choices(words, k=5), rng.choices(words, k=7), False, False))
    rng.shuffle(out)
    return out


def score_and_grads(model, actions, settings):
    """Token log-probs, mask, entropy and the gradient of a weighted sum w.r.t. every weight."""
    model.zero_grad(set_to_none=True)
    out, _ = score_completions(model, actions, settings)
    weights = torch.linspace(0.5, 1.5, out.logprobs.numel()).view_as(out.logprobs)
    ((out.logprobs * weights).sum() + 0.1 * out.entropy.sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out, grads


def assert_same_scores(got, expected):
    """Masks equal; log-probs and entropy to 1e-5; every weight gradient to 1e-4 relative."""
    (out, grads), (want, want_grads) = got, expected
    assert torch.equal(out.completion_mask, want.completion_mask)
    torch.testing.assert_close(out.logprobs, want.logprobs, **TOLERANCE)
    torch.testing.assert_close(out.entropy, want.entropy, **TOLERANCE)
    assert grads.keys() == want_grads.keys() and grads
    for name, grad in want_grads.items():
        torch.testing.assert_close(grads[name], grad, **GRAD_TOLERANCE, msg=name)


def input_shapes(model) -> list[tuple[int, ...]]:
    """Shapes of the token ids every later forward of `model` (or of its body) embeds, in
    order: the list fills as they run."""
    shapes = []
    model.get_input_embeddings().register_forward_pre_hook(
        lambda module, args: shapes.append(tuple(args[0].shape))
    )
    return shapes


def scoring_settings(share, folded=False, micro_batch_size=64, eos=1, pack=False):
    """The tests' scoring settings: pad id 0, temperature 0.7, entropy on, nothing masked."""
    return ScoringSettings(
        pad_token_id=0, eos_token_ids=(eos,), temperature=0.7,
        micro_batch_size=micro_batch_size, compute_entropy=True, chunked_output_layer=folded,
        mask_truncated_completions=False, share_prompt_prefix=share, pack_completions=pack,
    )  # fmt: skip
