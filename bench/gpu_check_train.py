"""The training parts of `gpu_check.py`: whole runs and an exactness check on one CUDA GPU.

- `train/demo`: `grpo train configs/demo.yaml` on the GPU (the same config as `make demo`,
  fewer steps): held-out greedy accuracy before and after, seconds per step;
- `train/demo-overlap`: the same with `run.max_staleness: 1` (sampling in a thread while the
  trainer updates);
- `exact/scoring`: a model of SmolLM2-135M's shape scores the same completions in float32 on
  the CPU and on the GPU; the log-probs and the gradient of their sum must agree to float32
  rounding of the GPU's kernels (failed otherwise, with the largest differences).
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
DEMO_STEPS = 300
LOGPROB_TOLERANCE = 1e-3  # float32 sums over 576-wide rows in another order: about 1e-5 seen
GRADIENT_TOLERANCE = 1e-3  # relative, on the whole gradient's norm


def _accuracy(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["eval/greedy/accuracy"] for r in rows if "eval/greedy/accuracy" in r}


def demo_run(*overrides: str) -> Callable[[], dict]:
    def run() -> dict:
        from grpo.cli import main

        with tempfile.TemporaryDirectory() as folder:
            run_dir = Path(folder) / "run"
            args = ["train", str(REPO / "configs" / "demo.yaml"), "--set", "model.device=cuda",
                    "--set", f"model.path={REPO / 'grpo' / 'assets' / 'arith-tiny'}",
                    "--set", f"schedule.num_steps={DEMO_STEPS}", "--set", "evaluation.every=100",
                    "--set", f"run.dir={run_dir}"]  # fmt: skip
            args += [a for o in overrides for a in ("--set", o)]
            start = time.perf_counter()
            code = main(args)
            wall = time.perf_counter() - start
            if code != 0:
                return {"status": "failed", "reason": f"grpo train exited {code}"}
            accuracy = _accuracy(run_dir)
            rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
            steps = [r["time/step"] for r in rows if "time/step" in r]
        first, last = min(accuracy), max(accuracy)
        status = "ok" if accuracy[last] > accuracy[first] else "failed"
        return {
            "status": status,
            "summary": f"held-out accuracy {accuracy[first]:.3f} -> {accuracy[last]:.3f} "
                       f"after {last} steps",
            "accuracy": {str(k): v for k, v in accuracy.items()},
            "s_per_step": sum(steps) / len(steps),
            "wall_seconds": wall,
            "overrides": list(overrides),
        }  # fmt: skip

    return run


def scoring_cpu_vs_cuda() -> dict:
    """Log-probs and gradients of one set of completions, CPU float32 against GPU float32."""
    from gpu_check import prompts, smollm2_shape

    from grpo.lm.policy import CausalLMPolicy, CausalLMSettings
    from grpo.lm.sampling import GenerationSettings

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model, tokenizer = smollm2_shape(torch.float32)
    settings = CausalLMSettings(GenerationSettings(max_new_tokens=32, seed=0), micro_batch_size=64)
    gpu = CausalLMPolicy(model, tokenizer, settings)
    states = prompts("smollm2-135m", 8)
    with torch.no_grad():
        actions = [a for group in gpu.generate_actions(states, 4) for a in group]
    states = [s for s in states for _ in range(4)]
    cpu = CausalLMPolicy(model.to("cpu"), tokenizer, settings)  # the same weights, moved
    results = {}
    for name, policy in (("cpu", cpu), ("cuda", None)):
        if policy is None:
            policy = CausalLMPolicy(model.to("cuda"), tokenizer, settings)
        policy.model.zero_grad()
        out = policy.get_token_log_probabilities(states, actions)
        out.logprobs[out.completion_mask].sum().backward()
        grad = torch.cat([p.grad.flatten().cpu() for p in policy.model.parameters()])
        results[name] = (out.logprobs.detach().cpu(), out.completion_mask.cpu(), grad)
    (lp_c, mask_c, g_c), (lp_g, mask_g, g_g) = results["cpu"], results["cuda"]
    if not torch.equal(mask_c, mask_g):
        return {"status": "failed", "reason": "the completion masks differ"}
    logprob_gap = (lp_c - lp_g)[mask_c].abs().max().item()
    gradient_gap = ((g_c - g_g).norm() / g_c.norm()).item()
    ok = logprob_gap < LOGPROB_TOLERANCE and gradient_gap < GRADIENT_TOLERANCE
    return {
        "status": "ok" if ok else "failed",
        "summary": f"max |log-prob gap| {logprob_gap:.2e}, gradient gap {gradient_gap:.2e} "
                   f"(relative) over {int(mask_c.sum())} tokens",
        "logprob_gap": logprob_gap,
        "gradient_gap": gradient_gap,
    }  # fmt: skip


TRAIN_PARTS: dict[str, Callable[[], dict]] = {
    "train/demo": demo_run(),
    "train/demo-overlap": demo_run("run.max_staleness=1"),
    "exact/scoring": scoring_cpu_vs_cuda,
}
