"""GRPO for a one-step character fill-in model rewarded by a frozen judge (the fill-in plan).

    grpo train examples/fill_in.yaml          # about 2 minutes on 2 CPU cores

`build` is the task factory that config names (`task.name:
examples/fill_in/task.py:build`). It prepares everything the GRPO run needs:
1. pre-trains a tiny bidirectional character transformer on `alice.txt` by
   masked-LM (the generator: it fills every masked position in one step);
2. trains a tiny judge to tell real windows from the generator's fills, then
   freezes it: its P(real) is the reward;
3. returns a `MaskedFillPolicy` around the generator, the judge reward, a pool
   of masked training windows, and an evaluation on held-out windows (mean
   judge score, masked-character accuracy, and the KL to the pre-trained
   generator).
`grpo train` then runs GRPO with warm-up + cosine learning rate, gradient
clipping, periodic evaluation with samples, and checkpoints.

Departures from the fill-in plan: the loss, advantages and KL are those of
`GRPOTrainer` (token-level clipped surrogate with a k3 KL penalty) rather than
the plan's REINFORCE with a sequence-level KL; log-probs use the sampling
temperature. Every phase, GRPO included, computes in `policy.precision`
(fp32; bf16-mixed: bfloat16 autocast; fp16-mixed: float16 autocast with a
gradient scaler).
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fill_data import MASK, PAD, CharVocab, load_text, mask_windows, sample_windows, split_ids  # noqa: E402
from fill_models import CharFillTransformer, CharJudge, Precision, fit, judge_loss, masked_lm_loss  # noqa: E402

from grpo.functional import kl_estimate  # noqa: E402
from grpo.masked_fill.judge import TokenJudgeReward  # noqa: E402
from grpo.masked_fill.policy import MaskedFillConfig, MaskedFillPolicy  # noqa: E402
from grpo.precision import check_precision  # noqa: E402
from grpo.run.config import RunConfig  # noqa: E402
from grpo.run.parts import TaskParts, resolve_device  # noqa: E402
from grpo.run.structured import from_dict  # noqa: E402


@dataclass
class FillInSettings:
    """`task.options` of the fill-in task."""

    window: int = 32
    """Characters per window (the generator's sequence length)."""
    mask_rate: float = 0.25
    """Share of each window's characters that are masked and filled."""
    pretrain_steps: int = 500
    """Masked-LM steps for the generator."""
    judge_steps: int = 600
    """Classifier steps for the judge (real windows vs generator fills)."""
    pool_size: int = 4096
    """Masked training windows drawn once; GRPO steps take prompts_per_step of them."""
    held_out: int = 128
    """Held-out masked windows (from text never trained on), each filled eval_samples times."""
    eval_samples: int = 4
    """Fills per held-out window when evaluating."""
    temperature: float = 1.0
    """Sampling temperature, also used by the log-probabilities."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    batch_size: int = 64
    """Windows per supervised step (pre-training and judge)."""
    precision: str | None = None
    """Older spelling of `policy.precision`, still accepted: auto (bf16-mixed on a GPU, fp32
    on a CPU), fp32, bf16 or fp16; None = policy.precision."""


@torch.no_grad()
def evaluate(policy, reference, judge, vocab, states: list[Tensor], truth: Tensor, samples: int,
             seed: int) -> tuple[dict[str, float], list[dict[str, Any]]]:  # fmt: skip
    """Mean judge score, masked-character accuracy and KL(π‖π_ref) per masked character."""
    policy.generator = torch.Generator(policy.device).manual_seed(seed)  # same draws each time
    actions = [a for group in policy.generate_actions(states, samples) for a in group]
    policy.generator = None
    flat_states = [s for s in states for _ in range(samples)]
    scores = judge.compute_rewards(flat_states, actions)  # (N,)
    stacked, state_ids = torch.stack(actions), torch.stack(flat_states)  # (N, W)
    masked = state_ids == MASK  # (N, W)
    truth = truth.repeat_interleave(samples, dim=0)  # (N, W)
    accuracy = (stacked == truth)[masked].double().mean().item()
    mine = policy.get_token_log_probabilities(flat_states, actions)
    ref = reference.get_token_log_probabilities(flat_states, actions)
    kl = kl_estimate(mine.logprobs, ref.logprobs, "k3")[mine.completion_mask].mean().item()
    metrics = {"eval/judge": scores.mean().item(), "eval/accuracy": accuracy, "eval/kl": kl}
    shown = [
        {"prompt": vocab.decode(flat_states[n]), "completion": vocab.decode(actions[n]),
         "reward": float(scores[n])}
        for n in range(0, min(3 * samples, len(actions)), samples)
    ]  # fmt: skip
    return metrics, shown


def _pretrain(s: FillInSettings, vocab, train_ids, precision: Precision, device, gen):
    """Masked-LM pre-training of the generator (step 1)."""
    generator = CharFillTransformer(vocab.size, s.window).to(device)

    def batches():
        while True:
            windows = sample_windows(train_ids, s.batch_size, s.window, gen)
            yield mask_windows(windows, s.mask_rate, gen).to(device), windows.to(device)

    fit(generator, batches(), masked_lm_loss(generator), s.pretrain_steps, 3e-3, precision)
    return generator


def _train_judge(s: FillInSettings, policy, vocab, train_ids, precision, device, gen):
    """Judge training on real windows (label 1) vs the generator's fills (label 0) (step 2)."""
    judge = CharJudge(vocab.size).to(device)
    half = s.batch_size // 2

    def batches():
        while True:
            real = sample_windows(train_ids, half, s.window, gen)
            masked = mask_windows(sample_windows(train_ids, half, s.window, gen), s.mask_rate, gen)
            fake = policy.fill(list(masked))
            labels = torch.cat([torch.ones(half), torch.zeros(half)])
            yield torch.cat([real, fake]).to(device), labels.to(device)

    fit(judge, batches(), judge_loss(judge), s.judge_steps, 2e-3, precision)
    return judge


def _precision(option: str | None, key: str, device: torch.device) -> str:
    """The run's precision: `policy.precision`, unless the older `task.options.precision`
    is set (auto = bf16-mixed on a GPU, fp32 on a CPU)."""
    if option is None:
        return key
    if option == "auto":
        return "bf16-mixed" if device.type == "cuda" else "fp32"
    return check_precision("task.options.precision", option)


def build(config: RunConfig) -> TaskParts:
    """The fill-in task's policy, judge reward, training windows and held-out evaluation."""
    s = from_dict(FillInSettings, config.task.options, "task.options")
    seed = config.task.seed
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    device = torch.device(resolve_device(config.model.device))
    name = _precision(s.precision, config.policy.precision, device)
    precision = Precision(name, device)
    vocab = CharVocab.from_text(load_text())
    train_ids, held_ids = split_ids(vocab.encode(load_text()), held_out_fraction=0.15)

    generator = _pretrain(s, vocab, train_ids, precision, device, gen)
    fill_config = MaskedFillConfig(
        mask_token_id=MASK, pad_token_id=PAD, temperature=s.temperature, top_p=s.top_p,
        suppress_token_ids=(PAD, MASK), precision=name,
    )  # fmt: skip
    policy = MaskedFillPolicy(generator, fill_config)
    judge = _train_judge(s, policy, vocab, train_ids, precision, device, gen)
    reward = TokenJudgeReward(judge, pad_token_id=PAD)
    reference = policy.make_reference()  # the pre-trained generator, for the KL metric

    pool = list(
        mask_windows(sample_windows(train_ids, s.pool_size, s.window, gen), s.mask_rate, gen)
    )
    held_gen = torch.Generator().manual_seed(seed + 1)
    truth = sample_windows(held_ids, s.held_out, s.window, held_gen)  # (H, W)
    held = list(mask_windows(truth, s.mask_rate, held_gen))

    def run_evaluation():
        return evaluate(policy, reference, reward, vocab, held, truth, s.eval_samples, seed)

    def save(path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        torch.save({"generator": generator.state_dict(), "judge": judge.state_dict(),
                    "chars": vocab.chars, "settings": dataclasses.asdict(s)},
                   path / "fill_in.pt")  # fmt: skip

    scaler = precision.scaler if name == "fp16-mixed" else None
    return TaskParts(policy, reward, pool, run_evaluation, ("eval/judge", "eval/kl"), save, scaler)
