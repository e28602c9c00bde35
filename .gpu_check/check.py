import sys, time, random
sys.path.insert(0, "tests")
import torch
from tiny_models import ARCHS, build_tiny_causal_lm, random_words
from grpo.policies.causal_lm import CausalLMPolicy, CausalLMSettings
from grpo.policies.completion import Completion
from grpo.policies.loading import LoraSettings
from grpo.policies.sampling import GenerationSettings
from grpo.lm_training import TextGRPOConfig, TextGRPOTrainer, ScheduleConfig, EvalConfig
from grpo.config import GRPOConfig
print(torch.__version__, torch.cuda.get_device_name(0))
for arch in ARCHS:
    path = build_tiny_causal_lm(f"/tmp/tiny-{arch}", arch)
    for dtype in ("float32", "bfloat16"):
        pol = CausalLMPolicy.from_pretrained(str(path), CausalLMSettings(GenerationSettings(max_new_tokens=8), micro_batch_size=3), dtype=dtype, device="cuda")
        groups = pol.generate_actions(["say a", [{"role": "user", "content": "write b c d e f"}]], 4)
        flat = [c for g in groups for c in g]
        with torch.no_grad():
            out = pol.get_token_log_probabilities([None] * 8, flat)
            alone = torch.cat([torch.nn.functional.pad(pol.get_token_log_probabilities([None], [c]).logprobs, (0, out.logprobs.shape[1] - c.num_tokens)) for c in flat])
        diff = (out.logprobs - alone).abs().max().item()
        print(arch, dtype, out.logprobs.device, out.logprobs.dtype, "finite", bool(out.logprobs.isfinite().all()), "pad-vs-alone maxdiff", f"{diff:.2e}", "entropy", f"{float(out.entropy[out.completion_mask].mean()):.3f}")
rng = random.Random(0)
prompts = [{"prompt": "say " + random_words(rng, 1, 3)} for _ in range(16)]
cfg = TextGRPOConfig(prompts_per_step=4, grpo=GRPOConfig(group_size=4, batch_size=8, num_epochs_per_update=2, kl_coeff=0.05, ref_update_frequency=0, entropy_coeff=0.0),
    policy=CausalLMSettings(GenerationSettings(max_new_tokens=8), gradient_checkpointing=True), schedule=ScheduleConfig(num_steps=3, learning_rate=1e-3, lr_scheduler="cosine", warmup_steps=1),
    evaluation=EvalConfig(modes=("greedy", "sampled")), lora=LoraSettings(r=4), model_path="/tmp/tiny-qwen2", dtype="bfloat16", device="cuda", output_dir="/tmp/out", save_merged=True)
t = TextGRPOTrainer(cfg, lambda prompts, completions: [c.count("e") / 5 for c in completions], prompts, prompts[:4])
t0 = time.time(); hist = t.train()
print("lora bf16 cuda GRPO", f"{time.time()-t0:.1f}s", [(round(h["reward/mean"], 3), round(h["kl/mean"], 5), round(h["lr"], 6)) for h in hist])
print(t.evaluations[-1]["eval/samples"][:1])
import os; print(sorted(os.listdir("/tmp/out")), sorted(os.listdir("/tmp/out/merged")))
