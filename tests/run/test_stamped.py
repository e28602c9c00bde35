"""grpo.run.stamped: a batch sampled with older weights is corrected against the sampler's
own log-probs, so its expected gradient is the on-policy one (enumerated exactly).

The policy is a tiny Llama whose completions are one token long, so the expectation over
a sampler's draws is a finite sum over the tokens it can draw: every kept token o, with
its probability q(o) under the sampler, goes through the real path (the sampler's
recorded log-probs, the trainer's π_old pass, the loss) as a batch of its own, and the
expected gradient is Σ_o q(o) ∇L(o). Truncated sampling draws from q = p / Z on the
kept set K; the update the loss stands for is that of samples of p, so the target is
Σ_{o in K} p_θ(o) ∇L_p(o), L_p(o) = -A(o) log p_θ(o) at ratio 1.
"""

from __future__ import annotations

import copy

import pytest
import torch
from tiny_models import load_tiny_causal_lm
from toy_models import FunctionReward

from grpo.functional.sampling import filter_logits
from grpo.lm.completion import Completion
from grpo.lm.policy import CausalLMPolicy, CausalLMSettings
from grpo.lm.sampling import GenerationSettings
from grpo.records import Rollout
from grpo.run.stamped import stale_sampler_logprobs
from grpo.step.collect import sample_rollout, score_old_logprobs
from grpo.step.objective import GRPOObjective

STATE = {"prompt": "count a b"}
ZERO = FunctionReward(lambda state, action: 0.0)


def _policy(path, **generation) -> CausalLMPolicy:
    """A tiny Llama sampling one token, its next-token distribution sharpened (logits x 40) so
    that a handful of tokens carry the mass."""
    model, tokenizer = load_tiny_causal_lm(path)
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)
    settings = GenerationSettings(max_new_tokens=1, seed=0, **generation)
    return CausalLMPolicy(model, tokenizer, CausalLMSettings(settings))


def _next_token(policy: CausalLMPolicy) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """(prompt ids, last hidden state (H,), log p of the next token (V,)) at the policy's weights."""
    prompt = policy.encode_states([STATE])[0]
    out = policy.model(input_ids=torch.tensor([prompt]), output_hidden_states=True)
    return prompt, out.hidden_states[-1][0, -1], out.logits[0, -1].float().log_softmax(-1)


def _kept(policy: CausalLMPolicy) -> dict[int, float]:
    """{token: log q(token)} of every token the policy's top-k / top-p sampler can draw."""
    g = policy.settings.generation
    with torch.no_grad():
        _, _, logp = _next_token(policy)
    logq = filter_logits(logp.double(), g.top_k, g.top_p).log_softmax(-1)  # (V,)
    return {t: logq[t].item() for t in torch.nonzero(logq > float("-inf")).flatten().tolist()}


def _action(policy: CausalLMPolicy, token: int, logq: float) -> Completion:
    """The one-token completion `token`, carrying log q as its engine recorded it."""
    prompt = tuple(policy.encode_states([STATE])[0])
    eos = token in policy.eos_token_ids
    return Completion(policy.tokenizer.decode([token]), (token,), prompt, truncated=not eos,
                      finished_by_eos=eos, engine_logprobs=(logq,))  # fmt: skip


def _advantage(token: int) -> float:
    """A fixed advantage per token, varied in sign and size."""
    return [1.5, -1.0, 0.5, -2.0, 1.0][token % 5]


def _expected_gradient(sampler, trainer, cap, stale: bool = True) -> torch.Tensor:
    """Σ_o q(o) ∇L(o) over the tokens `sampler` can draw, each a batch of its own through the
    real path: the sampler's stale log-probs (when `stale`), π_old scored by `trainer`, the
    loss; -> the gradient over the trainer's parameters, flat."""
    objective = GRPOObjective(kl_coeff=0.0, entropy_coeff=0.0, tis_cap=cap)
    trainer.model.zero_grad()
    for token, logq in _kept(sampler).items():
        rollout = Rollout([STATE], [_action(sampler, token, logq)], torch.zeros(1))
        if stale:
            logprobs, scored = stale_sampler_logprobs(sampler, rollout)
            assert not scored  # the engine's recorded log q: no scoring pass
            rollout = rollout._replace(sampler_logprobs=logprobs)
        rollout = score_old_logprobs(trainer, rollout)._replace(
            advantages=torch.tensor([_advantage(token)])
        )
        loss = objective.loss(trainer, None, rollout)["total_loss"]
        (torch.tensor(logq).exp() * loss).backward()  # q(o) L(o), summed over o
    return torch.cat([p.grad.flatten() for p in trainer.model.parameters()])


def _on_policy_gradient(trainer, tokens, weights=None) -> torch.Tensor:
    """Σ_{o in tokens} p(o) w(o) ∇(-A(o) log p(o)) at the trainer's weights (w = 1: samples of p)."""
    trainer.model.zero_grad()
    _, _, logp = _next_token(trainer)
    target = sum(
        logp[t].exp().detach() * (1.0 if weights is None else weights[t]) * -_advantage(t) * logp[t]
        for t in tokens
    )
    target.backward()
    return torch.cat([p.grad.flatten() for p in trainer.model.parameters()])


def _update_after_sampling(sampler: CausalLMPolicy, kept: dict[int, float]) -> CausalLMPolicy:
    """The trainer k versions later: the sampler's weights with the logit of each kept token
    raised by a different amount (0, 0.3, 0.6, ...), every other logit as it was, so that the
    top-k set is unchanged and some tokens became likelier than the sampler's q."""
    trainer = copy.deepcopy(sampler)
    with torch.no_grad():
        _, hidden, _ = _next_token(sampler)
        for rank, token in enumerate(sorted(kept)):
            trainer.model.lm_head.weight[token] += 0.3 * rank * hidden / hidden.dot(hidden)
    return trainer


@pytest.mark.parametrize(("generation", "cap"), [({"top_k": 6}, None), ({"top_p": 0.9}, 4.0)])
def test_a_stale_truncated_batch_has_the_on_policy_expected_gradient(tiny_lm_dir, generation, cap):
    """Sampled with older weights by top-k / top-p and trained later, the batch's expected
    gradient (exact, by enumeration) is the on-policy one for samples of p at the trainer's
    weights, to float rounding; capping the correction at 1 (right only for the sampler's own
    weights, where p / q = Z <= 1) would be off by far more, as some π_old / q exceed 1."""
    sampler = _policy(tiny_lm_dir("llama"), **generation)
    kept = _kept(sampler)
    trainer = _update_after_sampling(sampler, kept)
    assert 3 <= len(kept) <= 40
    with torch.no_grad():
        _, _, logp = _next_token(trainer)
    ratios = {t: (logp[t].double() - lq).exp().item() for t, lq in kept.items()}
    assert max(ratios.values()) > 1.2 and (cap is None or max(ratios.values()) < cap)
    stale = _expected_gradient(sampler, trainer, cap)
    target = _on_policy_gradient(trainer, kept)
    scale = target.abs().max().item()
    assert scale > 0
    torch.testing.assert_close(stale, target, rtol=0, atol=2e-5 * scale)
    capped = _on_policy_gradient(trainer, kept, {t: min(1.0, 1.0 / r) for t, r in ratios.items()})
    assert (capped - target).abs().max().item() > 0.01 * scale  # the old cap: biased
    if "top_k" in generation:  # the kept set is the trainer's too: the synchronous step's update
        assert _kept(trainer).keys() == kept.keys()
        synchronous = _expected_gradient(trainer, trainer, cap, stale=False)
        torch.testing.assert_close(stale, synchronous, rtol=0, atol=2e-5 * scale)


def test_a_sampler_that_records_its_log_probs_is_not_scored_again(tiny_lm_dir):
    """A stale batch of a top-p sampler carries the log q its engine recorded; one of a plain
    sampler (nothing recorded) is scored by the sampler's weights."""
    truncated = _policy(tiny_lm_dir("llama"), top_p=0.9)
    rollout = sample_rollout(truncated, ZERO, [STATE], 4)
    logprobs, scored = stale_sampler_logprobs(truncated, rollout)
    assert not scored
    recorded = [a.engine_logprobs[0] for a in rollout.actions]
    torch.testing.assert_close(logprobs[:, 0], torch.tensor(recorded), rtol=0, atol=0)
    plain = _policy(tiny_lm_dir("llama"))
    rollout = sample_rollout(plain, ZERO, [STATE], 4)
    logprobs, scored = stale_sampler_logprobs(plain, rollout)
    assert scored
    assert torch.equal(logprobs, score_old_logprobs(plain, rollout).old_logprobs)
