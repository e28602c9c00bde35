"""Small concrete policies and reward models for the framework tests.

- `TablePolicy`: a plain class (not an nn.Module) with a (S, A) logits table,
  one log-prob per action: the framework API's minimal contract.
- `SequencePolicy`: an nn.Module whose actions are token sequences ending in
  EOS (token 0); it implements `get_token_log_probabilities` with exact entropy.
- `FunctionReward`: a reward model around a plain `fn(state, action) -> float`.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from grpo.protocols import TokenLogProbs

EOS = 0


def state_index(state: Any, num_states: int) -> int:
    """Row of a state: ints are their own row, anything else is hashed stably."""
    if isinstance(state, int):
        return state % num_states
    return zlib.crc32(str(state).encode()) % num_states


class TablePolicy:
    """π(a | s) = softmax(logits[s]) over `num_actions` arms; states are ints or strings."""

    def __init__(self, num_states: int, num_actions: int, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.logits = (0.5 * torch.randn(num_states, num_actions, generator=gen)).requires_grad_()
        self.training = True

    def generate_actions(self, states: list[Any], num_actions_per_state: int, **kwargs: Any):
        probs = torch.softmax(self.logits[self._rows(states)], dim=-1)  # (B, A)
        return torch.multinomial(probs, num_actions_per_state, replacement=True).tolist()

    def get_log_probabilities(self, states: list[Any], actions: list[Any]) -> Tensor:
        logprobs = torch.log_softmax(self.logits[self._rows(states)], dim=-1)  # (N, A)
        return logprobs.gather(-1, torch.tensor(actions)[:, None]).squeeze(-1)  # (N,)

    def _rows(self, states: list[Any]) -> Tensor:
        return torch.tensor([state_index(s, self.logits.shape[0]) for s in states])

    def get_parameters(self) -> dict[str, Tensor]:
        return {"logits": self.logits}

    def train(self) -> TablePolicy:
        self.training = True
        return self

    def eval(self) -> TablePolicy:
        self.training = False
        return self

    def to(self, device: Any) -> TablePolicy:
        return self


class SequencePolicy(nn.Module):
    """Independent categorical per position: π(x_t | s) = softmax(logits[s, t])."""

    def __init__(self, num_states: int, vocab_size: int, max_length: int, seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.max_length = max_length
        self.logits = nn.Parameter(
            0.5 * torch.randn(num_states, max_length, vocab_size, generator=gen)
        )

    def generate_actions(self, states: list[Any], num_actions_per_state: int, **kwargs: Any):
        groups = []
        for s in states:
            probs = torch.softmax(self.logits[s], dim=-1)  # (L, V)
            group = []
            for _ in range(num_actions_per_state):
                tokens = []
                for t in range(self.max_length):
                    tokens.append(int(torch.multinomial(probs[t], 1)))
                    if tokens[-1] == EOS:
                        break
                group.append(tuple(tokens))
            groups.append(group)
        return groups

    def get_token_log_probabilities(self, states: list[Any], actions: list[Any]) -> TokenLogProbs:
        T = max(len(a) for a in actions)
        tokens = torch.zeros(len(actions), T, dtype=torch.long)
        mask = torch.zeros(len(actions), T, dtype=torch.bool)
        for n, a in enumerate(actions):
            tokens[n, : len(a)] = torch.tensor(a)
            mask[n, : len(a)] = True
        logp_all = torch.log_softmax(self.logits[torch.tensor(states), :T], dim=-1)  # (N, T, V)
        logprobs = logp_all.gather(-1, tokens[..., None]).squeeze(-1)  # (N, T)
        entropy = -(logp_all.exp() * logp_all).sum(-1)  # (N, T)
        return TokenLogProbs(logprobs.masked_fill(~mask, 0.0), mask, entropy)

    def get_log_probabilities(self, states: list[Any], actions: list[Any]) -> Tensor:
        out = self.get_token_log_probabilities(states, actions)
        return (out.logprobs * out.completion_mask).sum(-1)  # (N,)

    def get_parameters(self) -> dict[str, Tensor]:
        return dict(self.named_parameters())


class FunctionReward:
    """Reward model around `fn(state, action) -> float`."""

    def __init__(self, fn: Callable[[Any, Any], float]) -> None:
        self.fn = fn

    def compute_rewards(self, states: list[Any], actions: list[Any]) -> Tensor:
        return torch.tensor([float(self.fn(s, a)) for s, a in zip(states, actions, strict=True)])

    def to(self, device: Any) -> FunctionReward:
        return self

    def eval(self) -> FunctionReward:
        return self

    def train(self) -> FunctionReward:
        return self


def best_arm_reward(num_states: int, num_actions: int) -> FunctionReward:
    """Reward 1 for arm (row of the state mod num_actions), else 0."""
    return FunctionReward(lambda s, a: float(a == state_index(s, num_states) % num_actions))


def token_count_reward(token: int = 1) -> FunctionReward:
    """Reward = number of times `token` occurs in the sequence."""
    return FunctionReward(lambda s, a: float(sum(t == token for t in a)))


def load_bandit_example():
    """Import examples/bandit.py as a module (examples/ is not a package)."""
    import importlib.util
    import sys
    from pathlib import Path

    if "grpo_example_bandit" in sys.modules:
        return sys.modules["grpo_example_bandit"]
    path = Path(__file__).resolve().parents[1] / "examples" / "bandit.py"
    spec = importlib.util.spec_from_file_location("grpo_example_bandit", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module
