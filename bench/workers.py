"""One timed run of one trainer on one `Workload`, in the calling process.

Each worker loads the saved model, takes one warm-up optimizer step, then
`work.steps` timed ones, and returns per-step wall times, generated tokens per
step, decoding steps per step (the longest completion: a batch keeps decoding
all its rows until its last one ends, so this sets the generation and scoring
work), the resident memory after setup and the peak resident memory.

- "grpo": `GRPOTrainer.train_step` with a `CausalLMPolicy` and a `TextReward`.
- "grpo_lean": the same with the lean rollout engine (`grpo.lm.engines.lean`).
- "trl": TRL's `GRPOTrainer.train()`; a step is the time between two
  `on_step_end` callbacks (generation, scoring, loss, backward, optimizer).
- "bare": the model compute alone for the same tokens: a plain KV-cache
  sampling loop of exactly T new tokens, one forward and backward of the
  policy-gradient loss on them, one optimizer step. No rewards, no masks, no
  checks: the floor that framework overhead is measured against.
- "bare_lean": the same, sampling through `grpo.lm.engines.lean.LeanDecoder.decode`
  alone (the lean loop's model compute, with no policy around it): the floor
  for "grpo_lean".
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import psutil
import torch
from common import Workload, peak_rss_mib, prompts, yes_reward

__all__ = ["WORKERS"]


def _rss_mib() -> float:
    return psutil.Process().memory_info().rss / 2**20


def run_grpo(model_dir: Path, work: Workload, engine: str = "transformers") -> dict:
    from grpo import GRPOConfig, GRPOTrainer
    from grpo.lm.engines import RolloutSettings
    from grpo.lm.policy import CausalLMPolicy, CausalLMSettings
    from grpo.lm.sampling import GenerationSettings
    from grpo.rewards.combine import TextReward

    N = work.prompts * work.group_size
    generation = GenerationSettings(max_new_tokens=work.max_new_tokens, temperature=1.0, seed=0)
    settings = CausalLMSettings(generation=generation, micro_batch_size=N, compute_entropy=False,
                                precision=work.precision)  # fmt: skip
    rollout = RolloutSettings(engine=engine)
    policy = CausalLMPolicy.from_pretrained(
        str(model_dir), settings, dtype="float32", rollout=rollout
    )
    config = GRPOConfig(
        group_size=work.group_size,
        batch_size=N,
        num_epochs_per_update=1,
        kl_coeff=work.beta,
        entropy_coeff=0.0,
        ref_update_frequency=0,
        max_grad_norm=1.0,
    )
    optimizer = torch.optim.AdamW(
        policy.model.parameters(), lr=work.learning_rate, weight_decay=0.0
    )
    trainer = GRPOTrainer(policy, TextReward(yes_reward), optimizer=optimizer, config=config)
    texts = prompts(work.prompts * (work.steps + 1))
    setup_rss = _rss_mib()
    times, tokens, decode, cpu = [], [], [], []
    for step in range(work.steps + 1):
        states = [{"prompt": p} for p in texts[step * work.prompts : (step + 1) * work.prompts]]
        start, start_cpu = time.perf_counter(), time.process_time()
        trainer.train_step(states)
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
        tokens.append(policy.rollout_metrics["completion/length_mean"] * N)
        decode.append(policy.rollout_metrics["completion/length_max"])
    return _record(times, tokens, decode, setup_rss, cpu)


def run_trl(model_dir: Path, work: Workload) -> dict:
    from transformers import TrainerCallback
    from trl_side import make_trl_trainer

    ends: list[float] = []
    cpu_ends: list[float] = []  # process CPU time at the same moments
    lengths: list[float] = []  # mean completion length of each step's generation
    longest: list[float] = []
    N = work.prompts * work.group_size

    class StepClock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            ends.append(time.perf_counter())
            cpu_ends.append(time.process_time())

        def on_step_end(self, args, state, control, **kwargs):
            ends.append(time.perf_counter())
            cpu_ends.append(time.process_time())
            lengths.append(trainer._metrics["train"]["completions/mean_length"][-1])
            longest.append(trainer._metrics["train"]["completions/max_length"][-1])

    with tempfile.TemporaryDirectory() as out:
        # bf16=True: TRL's mixed precision (float32 weights, bfloat16 autocast), as bf16-mixed
        trainer = make_trl_trainer(model_dir, work, out, bf16=work.precision == "bf16-mixed")
        trainer.add_callback(StepClock())
        setup_rss = _rss_mib()
        trainer.train()
    times = [b - a for a, b in zip(ends[:-1], ends[1:], strict=True)]
    cpu = [b - a for a, b in zip(cpu_ends[:-1], cpu_ends[1:], strict=True)]
    return _record(times, [length * N for length in lengths], longest, setup_rss, cpu)


def run_bare(model_dir: Path, work: Workload, lean: bool = False) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    optimizer = torch.optim.AdamW(model.parameters(), lr=work.learning_rate, weight_decay=0.0)
    G, T = work.group_size, work.max_new_tokens
    texts = prompts(work.prompts * (work.steps + 1))
    setup_rss = _rss_mib()
    times, tokens, decode, cpu = [], [], [], []
    for step in range(work.steps + 1):
        batch = [
            t for t in texts[step * work.prompts : (step + 1) * work.prompts] for _ in range(G)
        ]
        tokenizer.padding_side = "left"
        enc = tokenizer(batch, return_tensors="pt", padding=True)
        start, start_cpu = time.perf_counter(), time.process_time()
        model.eval()
        with torch.no_grad():
            if lean:  # sampling: the lean loop alone, exactly T tokens (no EOS)
                completion = torch.tensor(_lean_sample(model, enc, T))  # (N, T)
            else:  # sampling: T steps of one token each, cached keys and values
                cache, ids, mask = DynamicCache(), enc["input_ids"], enc["attention_mask"]
                position = (mask.cumsum(-1) - 1).clamp(min=0)
                new = []
                for _ in range(T):
                    out = model(
                        input_ids=ids, attention_mask=mask, position_ids=position,
                        past_key_values=cache, use_cache=True, logits_to_keep=1,
                    )  # fmt: skip
                    ids = torch.multinomial(out.logits[:, -1].softmax(-1), 1)  # (N, 1)
                    new.append(ids)
                    mask = torch.cat([mask, torch.ones_like(ids)], 1)
                    position = position[:, -1:] + 1
                completion = torch.cat(new, 1)  # (N, T)
        model.train()
        full = torch.cat([enc["input_ids"], completion], 1)  # (N, P+T)
        full_mask = torch.cat([enc["attention_mask"], torch.ones_like(completion)], 1)
        logits = model(input_ids=full, attention_mask=full_mask, logits_to_keep=T + 1).logits
        logprobs = logits[:, :-1].log_softmax(-1).gather(-1, completion[..., None])  # (N, T, 1)
        rewards = torch.tensor(yes_reward(batch, tokenizer.batch_decode(completion)))
        loss = -(rewards[:, None, None] * logprobs).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
        tokens.append(float(completion.numel()))
        decode.append(float(T))
    return _record(times, tokens, decode, setup_rss, cpu)


def _lean_sample(model, enc, T: int) -> list[list[int]]:
    from grpo.lm.engines.lean import LeanDecoder
    from grpo.lm.sampling import GenerationSettings

    settings = GenerationSettings(max_new_tokens=T, temperature=1.0)
    return LeanDecoder(model).decode(enc["input_ids"], enc["attention_mask"], settings, ())


def _record(
    times: list[float], tokens: list[float], decode: list[float], setup_rss: float, cpu: list[float]
) -> dict:
    """Drops the warm-up step (the first); the rest are the timed steps. `cpu`: the process's
    CPU seconds over each step (every thread), beside its wall seconds `times`."""
    return {
        "step_s": times[1:],
        "cpu_s": cpu[1:],
        "threads": torch.get_num_threads(),
        "tokens": tokens[1:],
        "decode_steps": decode[1:],
        "setup_rss_mib": setup_rss,
        "peak_rss_mib": max(peak_rss_mib(), _rss_mib()),  # ru_maxrss can lag the current RSS
    }


WORKERS = {
    "grpo": run_grpo,
    "grpo_lean": lambda model_dir, work: run_grpo(model_dir, work, engine="lean"),
    "trl": run_trl,
    "bare": run_bare,
    "bare_lean": lambda model_dir, work: run_bare(model_dir, work, lean=True),
}
