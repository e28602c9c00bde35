"""TRL's `GRPOTrainer` set up for a `Workload` exactly as `grpo` is (the `bench` extra).

The mapping (B prompts x G completions = N rows in one optimizer step):
per_device_train_batch_size = N, num_generations = G, gradient accumulation 1,
steps_per_generation 1, num_iterations 1 (μ = 1), max_completion_length = T,
temperature 1 with no top-k/top-p, beta = β with the plain k3 KL
(TRL's `use_bias_correction_kl` off: `grpo` has no such weight), Adam (torch's AdamW with weight
decay 0) at the same learning rate, fp32 on the CPU, no vLLM, no logging,
no evaluation, no checkpoints, and gradient checkpointing as grpo's
(`CausalLMSettings.gradient_checkpointing`, off; TRL 1.16's default is on).
"""

from __future__ import annotations

from pathlib import Path

import torch
from common import Workload, prompts, yes_reward

__all__ = ["make_trl_trainer"]


def make_trl_trainer(model_dir: str | Path, work: Workload, output_dir: str | Path, **overrides):
    """A TRL GRPOTrainer on the model at `model_dir` for `work`; `overrides` go to GRPOConfig."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from grpo.lm.policy import CausalLMSettings

    N = work.prompts * work.group_size
    values = dict(
        output_dir=str(output_dir),
        per_device_train_batch_size=N,
        num_generations=work.group_size,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_iterations=1,
        max_completion_length=work.max_new_tokens,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=work.beta,
        learning_rate=work.learning_rate,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        max_steps=1 + work.steps,
        use_cpu=True,
        bf16=False,
        fp16=False,
        use_vllm=False,
        report_to="none",
        logging_strategy="no",
        save_strategy="no",
        eval_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
        loss_type="grpo",
        scale_rewards="group",
        mask_truncated_completions=False,
        log_completions=False,
        use_bias_correction_kl=False,  # the plain k3 KL, as grpo computes it
        gradient_checkpointing=CausalLMSettings().gradient_checkpointing,  # TRL's default: True
    )
    values.update(overrides)
    config = GRPOConfig(**values)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    # enough prompts for every step; each step draws B of them and repeats each G times
    dataset = Dataset.from_dict({"prompt": prompts(work.prompts * (work.steps + 1))})
    return GRPOTrainer(
        model=model,
        reward_funcs=yes_reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
    )
