"""Multi-turn GRPO glue: episodes sampled and scored by the policy being trained.

- `PolicyAgent` answers conversations with a causal-LM policy (any object with
  `generate_actions(states, G)` returning records with `.text` and
  `.completion_ids`, such as `grpo.lm.policy.CausalLMPolicy`); it
  reports the sampled token ids, so training uses exactly what was sampled.
- `EpisodePolicy` turns such a policy and an environment factory into a policy
  for `GRPOTrainer` whose actions are whole episodes (`EpisodeRollout`): each
  state is a task (``make_env(state)`` builds its environment) and its G
  actions are G episodes of it.
- `EpisodeReward` is the matching reward model: an episode's total reward.

How an episode is scored, by name in `EPISODE_SCORERS`:
- ``"turns"`` (default; a departure from picoRL, which re-tokenises the whole
  conversation once): each assistant turn is scored as its own (prompt,
  completion) pair, the prompt being the conversation before the turn encoded
  exactly as the agent encoded it when sampling and the completion the sampled
  ids. The episode's token log-probs are the turns' tokens laid end to end, so
  every token is scored under the very context it was sampled in, even where a
  chat template's end-of-turn token differs from the model's EOS. The policy's
  own scoring (temperature, EOS masking, micro-batches, entropy) is reused.
- ``"conversation"`` (picoRL): one forward pass over each whole conversation
  (`grpo.envs.scoring`), `micro_batch_size` of them a pass, mask = assistant
  tokens, sampled ids spliced in when known. Cheaper; exact when each turn's
  prompt is a prefix of the final conversation, and the only choice for
  episodes without sampled ids. No entropy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from grpo.envs.base import Env, EpisodeRollout, Message
from grpo.envs.chat_mask import rollout_tokens
from grpo.envs.rollout import AgentOutput, collect_rollouts
from grpo.envs.scoring import conversation_logprobs
from grpo.protocols import TokenLogProbs, hook

__all__ = ["EPISODE_SCORERS", "EpisodePolicy", "EpisodeReward", "PolicyAgent"]


class PolicyAgent:
    """Samples one assistant turn per conversation with `policy`; reports the sampled ids."""

    def __init__(self, policy: Any, **generation_overrides: Any) -> None:
        if not callable(getattr(policy, "generate_actions", None)):
            raise TypeError(f"policy must have generate_actions, got {type(policy).__name__}")
        self.policy = policy
        self.generation_overrides = generation_overrides

    def __call__(self, conversations: list[list[Message]]) -> AgentOutput:
        groups = self.policy.generate_actions(conversations, 1, **self.generation_overrides)
        completions = [group[0] for group in groups]
        return AgentOutput(
            [c.text for c in completions],
            [list(c.completion_ids) for c in completions],
            [bool(c.truncated) for c in completions],
        )


class EpisodePolicy:
    """A token-level policy whose actions are episodes played by `policy` in `make_env(state)`."""

    def __init__(
        self,
        policy: Any,
        make_env: Callable[[Any], Env],
        *,
        max_turns: int = 8,
        parser: Callable[[str], Any] | None = None,
        scoring: str = "turns",
        **generation_overrides: Any,
    ) -> None:
        if scoring not in EPISODE_SCORERS:
            raise ValueError(f"scoring must be one of {sorted(EPISODE_SCORERS)}, got {scoring!r}")
        self.scoring = scoring
        for name in ("generate_actions", "get_token_log_probabilities", "encode_states"):
            if not callable(getattr(policy, name, None)):
                raise TypeError(f"policy must have {name}, got {type(policy).__name__}")
        _check_scored_as_sampled(policy, scoring, generation_overrides)
        self.policy = policy
        self.make_env = make_env
        self.max_turns = max_turns
        self.parser = parser
        self.generation_overrides = generation_overrides

    # ------------------------------------------------------------------- sampling
    def generate_actions(
        self, states: Sequence[Any], num_actions_per_state: int, **overrides: Any
    ) -> list[list[EpisodeRollout]]:
        """G episodes per state -> B groups of G (state-major), played to their end."""
        G = num_actions_per_state
        envs = [self.make_env(state) for state in states for _ in range(G)]
        agent = PolicyAgent(self.policy, **{**self.generation_overrides, **overrides})
        rollouts = collect_rollouts(
            envs, agent, max_turns=self.max_turns,
            group_ids=[i for i in range(len(states)) for _ in range(G)], parser=self.parser,
        )  # fmt: skip
        return [rollouts[i * G : (i + 1) * G] for i in range(len(states))]

    # -------------------------------------------------------------------- scoring
    def turn_completions(
        self, rollout: EpisodeRollout, index: int = 0
    ) -> tuple[list[Any], list[Any]]:
        """(prompts, completions): one pair per assistant turn, prompts encoded as when sampled."""
        from grpo.lm.completion import Completion

        if rollout.action_token_ids is None:
            raise ValueError(
                f"actions[{index}] has no sampled token ids; episodes must be collected "
                "with a PolicyAgent (token-in/token-out) to be trained on"
            )
        prompts, completions = [], []
        turn = 0
        for position, message in enumerate(rollout.messages):
            if message["role"] != "assistant":
                continue
            prompt = list(rollout.messages[:position])
            [prompt_ids] = self.policy.encode_states([prompt])
            ids = rollout.action_token_ids[turn]
            eos = set(getattr(self.policy, "eos_token_ids", ()))
            cut = rollout.action_truncated is not None and rollout.action_truncated[turn]
            completions.append(
                Completion(
                    text=message["content"], completion_ids=ids, prompt_ids=prompt_ids,
                    truncated=cut, finished_by_eos=bool(ids) and ids[-1] in eos,
                )
            )  # fmt: skip
            prompts.append(prompt)
            turn += 1
        return prompts, completions

    def get_token_log_probabilities(
        self, states: Sequence[Any], actions: Sequence[EpisodeRollout]
    ) -> TokenLogProbs:
        """Per-token log-probs (N, T) of the episodes' assistant tokens, by `self.scoring`."""
        if len(states) != len(actions):
            raise ValueError(f"states and actions must align; got {len(states)} and {len(actions)}")
        return EPISODE_SCORERS[self.scoring](self, actions)

    def get_log_probabilities(
        self, states: Sequence[Any], actions: Sequence[EpisodeRollout]
    ) -> Tensor:
        """Sum of each episode's counted token log-probs -> (N,)."""
        return self.get_token_log_probabilities(states, actions).logprobs.sum(-1)

    # --------------------------------------------------------- PolicyModel plumbing
    def get_parameters(self) -> dict[str, Tensor]:
        return self.policy.get_parameters()

    def sampling_state(self) -> Any:
        sampling = hook(self.policy, "sampling_state")
        return sampling() if callable(sampling) else None

    def load_sampling_state(self, state: Any) -> None:
        if state is not None:
            self.policy.load_sampling_state(state)

    def train(self) -> EpisodePolicy:
        self.policy.train()
        return self

    def eval(self) -> EpisodePolicy:
        self.policy.eval()
        return self

    def to(self, device: Any) -> EpisodePolicy:
        self.policy.to(device)
        return self

    def state_dict(self) -> dict[str, Tensor]:
        return self.policy.state_dict()

    def load_state_dict(self, state: dict[str, Tensor]) -> Any:
        return self.policy.load_state_dict(state)

    def make_reference(self) -> EpisodePolicy:
        """The same episode adapter around the policy's frozen reference."""
        return EpisodePolicy(
            self.policy.make_reference(), self.make_env, max_turns=self.max_turns,
            parser=self.parser, scoring=self.scoring, **self.generation_overrides,
        )  # fmt: skip


_SCORED_AS_SAMPLED = ("temperature", "top_k", "top_p", "do_sample")  # scoring would miss them


def _check_scored_as_sampled(policy: Any, scoring: str, overrides: dict[str, Any]) -> None:
    """Refuse episodes that would be scored under another distribution than they were
    sampled from: sampling `overrides` that differ from the policy's own, or a policy whose
    episodes would need importance weights, which episode training does not carry (top-k /
    top-p sampling, truncated importance sampling (`tis_cap`) for an engine that samples
    otherwise than the trainer scores)."""
    settings = getattr(policy, "settings", None)
    generation = getattr(settings, "generation", None)
    reshaped = sorted(
        name for name in set(overrides) & set(_SCORED_AS_SAMPLED)
        if generation is None or overrides[name] != getattr(generation, name)
    )  # fmt: skip
    if reshaped:
        raise ValueError(
            f"EpisodePolicy: {', '.join(reshaped)} would sample the episodes from another "
            "distribution than the one they are scored under; set them in the policy's "
            "settings.generation, which sampling and scoring share"
        )
    if getattr(generation, "truncates", False):
        raise ValueError(
            "EpisodePolicy: the policy samples with top_k or top_p, whose tokens the loss "
            "weighs by importance weights per completion; episodes carry none: set "
            "generation.top_k = 0 and generation.top_p = 1.0"
        )
    engine = getattr(policy, "rollout_engine", None)
    if getattr(engine, "tis_cap", None) is not None:
        raise ValueError(
            "EpisodePolicy: the policy's rollout engine samples from another distribution than "
            "the trainer scores (vLLM, or another rollout.precision) and rollout.tis_cap asks "
            "for importance weights, which episodes do not carry: set rollout.tis_cap to null, "
            "or sample with the scorer (the transformers or lean engine at policy.precision)"
        )
    if getattr(settings, "mask_truncated_completions", False) and scoring != "turns":
        raise ValueError(
            "EpisodePolicy: mask_truncated_completions needs scoring='turns' (the "
            "'conversation' scorer does not know which turns hit the token limit)"
        )


def _score_turns(episodes: EpisodePolicy, actions: Sequence[EpisodeRollout]) -> TokenLogProbs:
    """Every turn of every episode in one policy call, then each episode's tokens end to end."""
    prompts, completions, owners = [], [], []
    for n, rollout in enumerate(actions):
        turn_prompts, turn_completions = episodes.turn_completions(rollout, n)
        prompts += turn_prompts
        completions += turn_completions
        owners += [n] * len(turn_completions)
    scored = episodes.policy.get_token_log_probabilities(prompts, completions)  # (M, T_turn)
    return _pack(scored, completions, owners, len(actions))


def _score_conversations(
    episodes: EpisodePolicy, actions: Sequence[EpisodeRollout]
) -> TokenLogProbs:
    """One pass per whole conversation -> (N, L-1), mask = assistant tokens."""
    policy = episodes.policy
    if not actions:
        raise ValueError("actions must hold at least one episode to score")
    tokens = [rollout_tokens(policy.tokenizer, rollout) for rollout in actions]
    rows = max(1, int(policy.settings.micro_batch_size))  # conversations a forward pass
    parts = [
        conversation_logprobs(
            policy.compute_model(), tokens[start : start + rows],
            pad_token_id=policy.tokenizer.pad_token_id,
            temperature=policy.settings.generation.temperature,
            chunked_output_layer=policy.settings.chunked_output_layer,
            precision=policy.settings.precision,
        )  # fmt: skip
        for start in range(0, len(tokens), rows)
    ]
    width = max(part.logprobs.shape[1] for part in parts)  # L-1 of the longest conversation
    return TokenLogProbs(
        torch.cat([F.pad(part.logprobs, (0, width - part.logprobs.shape[1])) for part in parts]),
        torch.cat([F.pad(part.completion_mask, (0, width - part.completion_mask.shape[1]))
                   for part in parts]),  # fmt: skip
    )


def _pack(
    scored: TokenLogProbs, completions: Sequence[Any], owners: Sequence[int], N: int
) -> TokenLogProbs:
    """Lay each episode's turns end to end -> (N, T) with T the longest episode."""
    lengths = [c.num_tokens for c in completions]
    totals = [0] * N
    for n, length in zip(owners, lengths, strict=True):
        totals[n] += length
    T = max(totals + [1])
    logprobs = scored.logprobs.new_zeros((N, T))  # (N, T) 0 where nothing is counted
    mask = torch.zeros((N, T), dtype=torch.bool, device=logprobs.device)  # (N, T)
    entropy = None if scored.entropy is None else scored.entropy.new_zeros((N, T))
    # Index copies (not in-place writes into a leaf) keep the graph to every turn's scores.
    rows, cols, src_rows, src_cols = [], [], [], []
    offset = [0] * N
    for m, (n, length) in enumerate(zip(owners, lengths, strict=True)):
        rows += [n] * length
        cols += range(offset[n], offset[n] + length)
        src_rows += [m] * length
        src_cols += range(length)
        offset[n] += length
    index = (
        torch.tensor(rows, dtype=torch.long, device=logprobs.device),
        torch.tensor(cols, dtype=torch.long, device=logprobs.device),
    )
    source = (
        torch.tensor(src_rows, dtype=torch.long, device=logprobs.device),
        torch.tensor(src_cols, dtype=torch.long, device=logprobs.device),
    )
    logprobs = logprobs.index_put(index, scored.logprobs[source])
    mask = mask.index_put(index, scored.completion_mask[source])
    if entropy is not None:
        entropy = entropy.index_put(index, scored.entropy[source])
    return TokenLogProbs(logprobs, mask, entropy)


EPISODE_SCORERS: dict[str, Callable[[EpisodePolicy, Sequence[EpisodeRollout]], TokenLogProbs]] = {
    "turns": _score_turns,
    "conversation": _score_conversations,
}


class EpisodeReward:
    """Reward model for `EpisodePolicy`: an episode's total reward (sum over its turns)."""

    def compute_rewards(self, states: list[Any], actions: list[EpisodeRollout]) -> Tensor:
        return torch.tensor([float(rollout.total_reward) for rollout in actions])  # (N,)

    def to(self, device: Any) -> EpisodeReward:
        return self

    def eval(self) -> EpisodeReward:
        return self

    def train(self) -> EpisodeReward:
        return self
