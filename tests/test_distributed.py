"""grpo.distributed: W = 2 gloo processes on CPU compute what one process computes.

One process group is spawned per test session (`two_process_run`): its ranks run
every scenario in turn and write parameters, metrics and checkpoints to a temp
folder; the tests compare them with single-process runs of the same global
batch and seed. The toy policy samples from a generator seeded by the state id,
so both runs sample the same actions, and it trains in float64 so that the
only differences left are summation orders (about 1e-16).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from torch import Tensor, nn
from toy_models import FunctionReward

from grpo import distributed
from grpo.config import GRPOConfig
from grpo.distributed import DistributedConfig
from grpo.protocols import TokenLogProbs
from grpo.step.advantages import AdvantageEstimator
from grpo.step.trainer import GRPOTrainer

NUM_ROWS, LENGTH, VOCAB, EOS = 8, 4, 5, 0
S, G, STEPS = 4, 3, 3  # global states per step, group size, steps per run
BASE = dict(group_size=G, batch_size=5, num_epochs_per_update=2, gradient_accumulation_steps=2)
BASE.update(learning_rate=0.05, kl_coeff=0.04, entropy_coeff=0.01, seed=3)
# name -> (GRPOConfig fields, strategy); batch_size 5 of N = 12 samples: mini-batches
# straddle the ranks unevenly, and the last window holds a single mini-batch
SCENARIOS = {
    "sequence": ({**BASE, "aggregation": "sequence_mean", "advantage_scale": "batch"}, "ddp"),
    "token": ({**BASE, "aggregation": "token_mean", "loss_type": "gspo"}, "ddp"),
    "fsdp2": ({**BASE, "aggregation": "token_mean"}, "fsdp2"),
    # states 4k and 4k + 1 pay nothing (uninformative), both on rank 0: only a decision
    # over every rank's groups refills and orders them as one process does
    "dynamic": ({**BASE, "dynamic_sampling": True, "dynamic_sampling_max_rounds": 3}, "ddp"),
}


class ShardablePolicy(nn.Module):
    """Token sequences from a (rows, LENGTH, VOCAB) logits table; one forward per call.

    Sampling draws from a generator seeded by the state, so the actions of a state
    do not depend on which process samples them or what it sampled before.
    """

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        table = torch.randn(NUM_ROWS, LENGTH, VOCAB, generator=gen, dtype=torch.float64)
        self.logits = nn.Parameter(0.5 * table)

    def forward(self, states: list[int], T: int) -> Tensor:
        rows = torch.tensor(states, device=self.logits.device) % NUM_ROWS
        return torch.log_softmax(self.logits[rows, :T], dim=-1)

    def generate_actions(self, states: list[int], num_actions_per_state: int, **kwargs: Any):
        probs = self(states, LENGTH).exp().cpu()  # (B, L, V)
        groups = []
        for i, s in enumerate(states):
            gen = torch.Generator().manual_seed(1000 + s)
            group = []
            for _ in range(num_actions_per_state):
                tokens: list[int] = []
                while len(tokens) < LENGTH and (not tokens or tokens[-1] != EOS):
                    tokens.append(int(torch.multinomial(probs[i, len(tokens)], 1, generator=gen)))
                group.append(tuple(tokens))
            groups.append(group)
        return groups

    def get_token_log_probabilities(self, states: list[int], actions: list[Any]) -> TokenLogProbs:
        T = max(len(a) for a in actions)
        tokens = torch.zeros(len(actions), T, dtype=torch.long)
        mask = torch.zeros(len(actions), T, dtype=torch.bool)
        for n, a in enumerate(actions):
            tokens[n, : len(a)], mask[n, : len(a)] = torch.tensor(a), True
        logp_all = self(states, T)  # (N, T, V)
        tokens, mask = tokens.to(logp_all.device), mask.to(logp_all.device)
        logprobs = logp_all.gather(-1, tokens[..., None]).squeeze(-1)  # (N, T)
        entropy = -(logp_all.exp() * logp_all).sum(-1)  # (N, T)
        return TokenLogProbs(logprobs.masked_fill(~mask, 0.0), mask, entropy)

    def get_log_probabilities(self, states: list[int], actions: list[Any]) -> Tensor:
        out = self.get_token_log_probabilities(states, actions)
        return (out.logprobs * out.completion_mask).sum(-1)

    def get_parameters(self) -> dict[str, Tensor]:
        return dict(self.named_parameters())


def reward(state: int, action: tuple[int, ...]) -> float:
    return sum(t == 1 for t in action) - 0.25 * len(action) + 0.1 * (state % 3)


def sparse_reward(state: int, action: tuple[int, ...]) -> float:
    return 0.0 if state % 4 < 2 else reward(state, action)


def make_trainer(name: str, policy_seed: int = 0) -> GRPOTrainer:
    fields, strategy = SCENARIOS[name]
    return GRPOTrainer(
        ShardablePolicy(policy_seed),
        FunctionReward(sparse_reward if name == "dynamic" else reward),
        config=GRPOConfig(**fields),
        distributed_config=DistributedConfig(strategy=strategy),
    )


def run_steps(trainer: GRPOTrainer, start: int, stop: int, ckpt: Path | None = None) -> None:
    """Steps start..stop-1 on their states; checkpoint after step 2 when asked."""
    for step in range(start, stop):
        refills = iter(range(1, 100))  # dynamic sampling's new states: the same on every rank
        refill = lambda: [100 * step + S * next(refills) + i for i in range(S)]  # noqa: E731, B023
        trainer.train_step([step * S + i for i in range(S)], refill=refill)
        if ckpt is not None and step == 1:
            trainer.save_checkpoint(str(ckpt))


def full_params(trainer: GRPOTrainer) -> Tensor:
    """The unsharded parameter table (an all-gather under FSDP2: call on every rank)."""
    logits = trainer.policy.logits
    return (logits.full_tensor() if hasattr(logits, "full_tensor") else logits).detach().clone()


# ------------------------------------------------------------ the 2 ranks
def _join(rank: int, world: int, port: int) -> None:
    """Join the gloo group as torchrun would launch this rank (CPU, even where CUDA exists)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    assert distributed.init_from_env("gloo")


def _worker(rank: int, world: int, port: int, out: str) -> None:
    _join(rank, world, port)
    out_dir = Path(out)
    for name in SCENARIOS:
        _run_scenario(name, rank, out_dir)
    _resume_single_checkpoint(rank, out_dir)
    _batch_scale_advantages(rank, out_dir)
    # every trainer is gone by now, as shutdown asks; an error above ends this process, and
    # spawn then stops the other
    distributed.shutdown()


def _run_scenario(name: str, rank: int, out_dir: Path) -> None:
    """STEPS steps of one scenario on this rank; rank 0 saves parameters and history."""
    trainer = make_trainer(name, policy_seed=rank)  # rank 0's weights must win
    run_steps(trainer, 0, STEPS, out_dir / f"{name}.ckpt")
    params = full_params(trainer)
    if rank == 0:
        torch.save({"params": params, "history": trainer.history}, out_dir / f"{name}.pt")


def _resume_single_checkpoint(rank: int, out_dir: Path) -> None:
    """Load the 1-process checkpoint of "token" at step 2 and run step 3 on 2 ranks."""
    trainer = make_trainer("token", policy_seed=7)
    trainer.load_checkpoint(str(out_dir / "single_token.ckpt"))
    run_steps(trainer, 2, STEPS)
    if rank == 0:
        torch.save({"params": full_params(trainer)}, out_dir / "resumed_on_2.pt")


def _batch_scale_advantages(rank: int, out_dir: Path) -> None:
    """Batch-scaled advantages of rewards split over ranks (rank r holds rows of r)."""
    dp = distributed.DataParallel(ShardablePolicy())
    local = BATCH_REWARDS[2 * rank : 2 * rank + 2].flatten()  # (2 * G,) this rank's rewards
    estimator = AdvantageEstimator(scale="batch")
    advantages = estimator.from_rewards(dp.gather(local), G)
    torch.save(advantages, out_dir / f"advantages_rank{rank}.pt")


BATCH_REWARDS = torch.tensor([[0.0, 1.0, 3.0], [2.0, 2.0, 5.0], [1.0, 0.0, 0.0], [4.0, 1.0, 1.0]])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Single-process runs (in this process), then one 2-process run of every scenario."""
    out = tmp_path_factory.mktemp("distributed")
    single = {}
    for name in SCENARIOS:
        trainer = make_trainer(name)
        run_steps(trainer, 0, STEPS, out / f"single_{name}.ckpt")
        single[name] = trainer
    mp.spawn(_worker, args=(2, _free_port(), str(out)), nprocs=2, join=True)
    return {"single": single, "out": out}


# ------------------------------------------------------------------ tests
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_two_processes_reach_the_single_process_parameters(runs, name):
    """After 3 steps, 2 ranks (DDP or FSDP2) hold the 1-process parameters to 1e-6."""
    two = torch.load(runs["out"] / f"{name}.pt", weights_only=True)
    single = runs["single"][name].policy.logits.detach()
    assert not torch.equal(single, ShardablePolicy(0).logits.detach())  # it did train
    torch.testing.assert_close(two["params"], single, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_two_processes_log_the_single_process_metrics(runs, name):
    """Reward statistics and loss metrics on rank 0 equal the single-process ones."""
    two = torch.load(runs["out"] / f"{name}.pt", weights_only=True)["history"]
    single = runs["single"][name].history
    keys = ("reward/mean", "reward/std", "advantage_std", "step_loss", "grad_norm")
    keys += ("total_samples", "epoch_1_policy_loss", "epoch_1_kl_penalty")
    if name == "dynamic":
        keys += ("dynamic/rounds", "dynamic/informative_frac", "dynamic/sampled_zero_std_frac")
    for two_step, one_step in zip(two, single, strict=True):
        for key in keys:
            assert two_step[key] == pytest.approx(one_step[key], rel=1e-9, abs=1e-12), key


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_two_process_checkpoint_resumes_in_one_process(runs, name):
    """A checkpoint written by 2 ranks at step 2 continues in 1 process like an uninterrupted run."""
    trainer = make_trainer(name, policy_seed=7)
    trainer.load_checkpoint(str(runs["out"] / f"{name}.ckpt"))
    assert trainer.step_count == 2
    run_steps(trainer, 2, STEPS)
    uninterrupted = runs["single"][name]
    torch.testing.assert_close(
        trainer.policy.logits.detach(), uninterrupted.policy.logits.detach(), rtol=0, atol=1e-6
    )
    state = trainer.optimizer.state_dict()["state"][0]
    expected = uninterrupted.optimizer.state_dict()["state"][0]
    torch.testing.assert_close(state["exp_avg_sq"], expected["exp_avg_sq"], rtol=0, atol=1e-9)


def test_one_process_checkpoint_resumes_on_two(runs):
    """A 1-process checkpoint at step 2 continues on 2 ranks like the uninterrupted 1-process run."""
    two = torch.load(runs["out"] / "resumed_on_2.pt", weights_only=True)["params"]
    single = runs["single"]["token"].policy.logits.detach()
    torch.testing.assert_close(two, single, rtol=0, atol=1e-6)


def test_batch_scaled_advantages_span_ranks(runs):
    """Every rank's batch-scaled advantages equal the single-process value, not a per-rank one."""
    estimator = AdvantageEstimator(scale="batch")
    expected = estimator.from_rewards(BATCH_REWARDS.flatten(), G)  # (N,) = (4 * G,)
    own_only = estimator.from_rewards(BATCH_REWARDS[:2].flatten(), G)
    assert not torch.allclose(own_only, expected[: 2 * G], atol=1e-3)  # the std must span ranks
    for rank in range(2):
        got = torch.load(runs["out"] / f"advantages_rank{rank}.pt", weights_only=True)
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=0)


def _lm_worker(rank: int, world: int, port: int, model_dir: str, out: str) -> None:
    """2 DDP steps of a tiny causal LM (each rank samples with its own seed)."""
    _join(rank, world, port)
    params = _lm_steps(rank, model_dir)  # the trainer and its DDP wrapper are gone after it
    torch.save(params, Path(out) / f"lm_rank{rank}.pt")
    distributed.shutdown()


def _lm_steps(rank: int, model_dir: str) -> dict[str, Tensor]:
    from tiny_models import load_tiny_causal_lm

    from grpo.lm.policy import CausalLMPolicy, CausalLMSettings
    from grpo.lm.sampling import GenerationSettings

    model, tokenizer = load_tiny_causal_lm(model_dir)
    generation = GenerationSettings(max_new_tokens=4, seed=100 * rank)
    # micro-batches of 2: several forward passes per mini-batch on one rank
    policy = CausalLMPolicy(model, tokenizer, CausalLMSettings(generation, micro_batch_size=2))
    config = GRPOConfig(group_size=2, batch_size=3, num_epochs_per_update=1, learning_rate=1e-2)
    trainer = GRPOTrainer(policy, FunctionReward(lambda s, a: float(len(a.text))), config=config)
    for _ in range(2):
        trainer.train_step(["a b", "say yes", "count c", "red blue"])
    return {k: v.detach().clone() for k, v in policy.get_parameters().items()}


def test_ddp_keeps_causal_lm_replicas_identical(tiny_lm_dir, tmp_path):
    """After 2 DDP steps of a tiny causal LM both ranks hold the same, trained weights."""
    model_dir = tiny_lm_dir("qwen2")
    mp.spawn(_lm_worker, args=(2, _free_port(), str(model_dir), str(tmp_path)), nprocs=2)
    ranks = [torch.load(tmp_path / f"lm_rank{r}.pt", weights_only=True) for r in range(2)]
    from tiny_models import load_tiny_causal_lm

    start = dict(load_tiny_causal_lm(model_dir)[0].named_parameters())
    assert ranks[0].keys() == ranks[1].keys()
    for name, value in ranks[0].items():
        assert torch.equal(value, ranks[1][name]), name
    assert any(not torch.allclose(v, start[k]) for k, v in ranks[0].items())


def test_shard_bounds_split_states_into_equal_blocks():
    """shard_bounds gives contiguous equal blocks and rejects a count not divisible by W."""
    assert [distributed.shard_bounds(6, r, 3) for r in range(3)] == [(0, 2), (2, 4), (4, 6)]
    with pytest.raises(ValueError, match="got 5 states for 2 processes"):
        distributed.shard_bounds(5, 0, 2)


def test_single_process_helpers_need_no_process_group():
    """Without torchrun: rank 0 of 1, main process, barrier a no-op, init_from_env False."""
    assert (distributed.rank(), distributed.world_size(), distributed.is_main_process()) == (
        0,
        1,
        True,
    )
    distributed.barrier()
    env = {k: os.environ.pop(k) for k in ("RANK", "WORLD_SIZE") if k in os.environ}
    try:
        assert distributed.init_from_env() is False
    finally:
        os.environ.update(env)


def test_distributed_config_rejects_unknown_strategy():
    """DistributedConfig names the field, the value and the allowed strategies."""
    with pytest.raises(ValueError, match="strategy must be one of ddp, fsdp2; got 'zero'"):
        DistributedConfig(strategy="zero")


def test_policy_module_rejects_parameters_outside_the_module():
    """A policy whose trainable tensors are not module parameters cannot be synchronised."""

    class Loose(ShardablePolicy):
        def get_parameters(self):
            return {"stray": torch.zeros(2, requires_grad=True)}

    with pytest.raises(TypeError, match=r"parameters \['stray'\] are not parameters"):
        distributed.policy_module(Loose())


@pytest.mark.parametrize(
    "aggregation", ["sequence_mean", "token_mean", "constant_length", "sequence_sum"]
)
def test_loss_shares_of_a_split_batch_sum_to_the_whole_batch_loss(aggregation):
    """policy_loss with GlobalCounts on two parts of a batch sums to the loss of the whole batch."""
    from grpo.functional.losses import GlobalCounts, policy_loss

    gen = torch.Generator().manual_seed(0)
    logprobs = -torch.rand(5, 4, generator=gen, dtype=torch.float64)  # (N, T)
    old = logprobs + 0.1 * torch.randn(5, 4, generator=gen, dtype=torch.float64)
    advantages = torch.randn(5, generator=gen, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 0]])
    mask = mask.bool()
    options = dict(aggregation=aggregation, max_completion_length=6)
    whole, _ = policy_loss(logprobs, old, advantages, mask, **options)
    counts = GlobalCounts(num_sequences=5, num_tokens=int(mask.sum()))
    parts = [slice(0, 2), slice(2, 5)]
    shares = [
        policy_loss(logprobs[p], old[p], advantages[p], mask[p], global_counts=counts, **options)[0]
        for p in parts
    ]
    torch.testing.assert_close(shares[0] + shares[1], whole, rtol=1e-12, atol=0)
    local, _ = policy_loss(logprobs[:2], old[:2], advantages[:2], mask[:2], **options)
    assert not torch.allclose(shares[0], local)  # a share is not the part's own mean
