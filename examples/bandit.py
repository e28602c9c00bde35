"""GRPO on a contextual bandit: your own torch model, no language involved.

A context is a feature vector x in R^F; each of A arms pays 1 when it is the
best arm for x and 0 otherwise. The best arm is argmax_a (W x)_a for a hidden
matrix W, so a policy can generalise to contexts it never saw. The policy is
a linear layer followed by a softmax (a categorical distribution over arms),
initialised to zero, i.e. uniform over the arms.

GRPO samples G arms per context, rewards them, and pushes probability towards
the arms that beat their group's mean. Accuracy is measured greedily (argmax
arm) on held-out contexts.

Run:  python examples/bandit.py
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from grpo import GRPOConfig, GRPOTrainer, TokenLogProbs


class BanditPolicy(nn.Module):
    """π(arm | x) = softmax(W_θ x + b_θ): a linear categorical policy over arms."""

    def __init__(self, num_features: int, num_arms: int) -> None:
        super().__init__()
        self.linear = nn.Linear(num_features, num_arms)
        nn.init.zeros_(self.linear.weight)  # zero logits: the uniform policy
        nn.init.zeros_(self.linear.bias)

    def forward(self, states: list[Tensor]) -> Tensor:
        return self.linear(torch.stack(states))  # (N, A) logits

    # --- PolicyModel (the framework API) -------------------------------------------
    def generate_actions(
        self, states: list[Tensor], num_actions_per_state: int, **kwargs: Any
    ) -> list[list[int]]:
        probs = torch.softmax(self(states), dim=-1)  # (B, A)
        arms = torch.multinomial(probs, num_actions_per_state, replacement=True)  # (B, G)
        return arms.tolist()

    def get_log_probabilities(self, states: list[Tensor], actions: list[int]) -> Tensor:
        logprobs = torch.log_softmax(self(states), dim=-1)  # (N, A)
        return logprobs.gather(-1, torch.tensor(actions)[:, None]).squeeze(-1)  # (N,)

    def get_parameters(self) -> dict[str, Tensor]:
        return dict(self.named_parameters())

    # train(), eval() and to() come from nn.Module.

    # --- optional: TokenLevelPolicy ----------------------------------------
    def get_token_log_probabilities(
        self, states: list[Tensor], actions: list[int]
    ) -> TokenLogProbs:
        """One "token" per action, plus the exact entropy of π(· | x) for the bonus."""
        all_logprobs = torch.log_softmax(self(states), dim=-1)  # (N, A)
        logprobs = all_logprobs.gather(-1, torch.tensor(actions)[:, None])  # (N, 1)
        entropy = -(all_logprobs.exp() * all_logprobs).sum(-1, keepdim=True)  # (N, 1)
        mask = torch.ones_like(logprobs, dtype=torch.bool)  # (N, 1)
        return TokenLogProbs(logprobs, mask, entropy)

    @torch.no_grad()
    def greedy_arms(self, states: list[Tensor]) -> Tensor:
        return self(states).argmax(-1)  # (N,)


class BanditReward:
    """Pays 1 for the best arm argmax(W x), 0 for any other: a plain RewardModel."""

    def __init__(self, hidden_weights: Tensor) -> None:
        self.hidden_weights = hidden_weights  # (A, F)

    def best_arms(self, states: list[Tensor]) -> Tensor:
        return (torch.stack(states) @ self.hidden_weights.T).argmax(-1)  # (N,)

    def compute_rewards(self, states: list[Tensor], actions: list[int]) -> Tensor:
        return (torch.tensor(actions) == self.best_arms(states)).float()  # (N,)

    def to(self, device: Any) -> BanditReward:
        return self

    def eval(self) -> BanditReward:
        return self

    def train(self) -> BanditReward:
        return self


@dataclass
class BanditSetup:
    """Sizes of the bandit problem and of the run."""

    num_features: int = 8
    """F: dimension of a context."""
    num_arms: int = 6
    """A: arms to choose from."""
    num_train_contexts: int = 8192
    """Contexts the policy trains on."""
    num_test_contexts: int = 2000
    """Held-out contexts, never seen in training, for the accuracy."""
    states_per_step: int = 64
    """B: contexts per GRPO step (N = B * G = 512 samples)."""
    learning_rate: float = 0.2
    """Adam's initial learning rate, annealed to 0 over the run (cosine)."""
    steps: int = 400
    """GRPO steps."""
    seed: int = 0
    """Seeds the problem, the policy's sampling and the trainer."""


def make_problem(setup: BanditSetup) -> tuple[BanditReward, list[Tensor], list[Tensor]]:
    """Hidden weights and disjoint train / held-out context sets."""
    gen = torch.Generator().manual_seed(setup.seed)
    hidden = torch.randn(setup.num_arms, setup.num_features, generator=gen)  # (A, F)
    contexts = torch.randn(
        setup.num_train_contexts + setup.num_test_contexts, setup.num_features, generator=gen
    )
    train, test = contexts.split([setup.num_train_contexts, setup.num_test_contexts])
    return BanditReward(hidden), list(train), list(test)


def accuracy(policy: BanditPolicy, reward: BanditReward, contexts: list[Tensor]) -> float:
    """Fraction of contexts where the greedy arm is the best arm."""
    return (policy.greedy_arms(contexts) == reward.best_arms(contexts)).float().mean().item()


def run(setup: BanditSetup | None = None) -> tuple[float, float]:
    """Train from the uniform policy; return (held-out accuracy before, after)."""
    setup = setup or BanditSetup()
    torch.manual_seed(setup.seed)  # the policy samples arms from torch's global RNG
    reward, train_contexts, test_contexts = make_problem(setup)
    policy = BanditPolicy(setup.num_features, setup.num_arms)
    config = GRPOConfig(
        group_size=8,
        batch_size=512,  # one mini-batch per epoch: the 2nd epoch is the off-policy, clipped one
        num_epochs_per_update=2,
        kl_coeff=0.0,  # nothing to stay close to: the start is uniform
        entropy_coeff=0.0,  # entropy is still logged as "entropy/mean"
        seed=setup.seed,
    )
    optimizer = torch.optim.Adam(policy.parameters(), lr=setup.learning_rate)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=setup.steps)
    trainer = GRPOTrainer(policy, reward, optimizer, config)
    before = accuracy(policy, reward, test_contexts)
    order = torch.Generator().manual_seed(setup.seed + 1)
    for _ in range(setup.steps):
        pick = torch.randint(len(train_contexts), (setup.states_per_step,), generator=order)
        trainer.train_step([train_contexts[i] for i in pick.tolist()])
        scheduler.step()
    return before, accuracy(policy, reward, test_contexts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=BanditSetup.steps)
    parser.add_argument("--seed", type=int, default=BanditSetup.seed)
    args = parser.parse_args()
    before, after = run(BanditSetup(steps=args.steps, seed=args.seed))
    print(f"held-out greedy accuracy: before {before:.1%}, after {after:.1%}")


if __name__ == "__main__":
    main()
