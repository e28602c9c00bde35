"""`CausalLMSettings`: how a causal-LM policy samples and scores (`grpo.lm.policy`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from grpo.lm.folding import check_folding_mode
from grpo.lm.sampling import GenerationSettings
from grpo.precision import check_precision

__all__ = ["CausalLMSettings"]


@dataclass
class CausalLMSettings:
    """How a causal-LM policy samples and scores completions."""

    generation: GenerationSettings = field(default_factory=GenerationSettings)
    """Sampling settings; its temperature is also the one log-probs are scored at."""
    micro_batch_size: int = 8
    """Rows per forward pass when scoring log-probs. This bounds the memory of the no-grad
    passes (old and reference log-probs); with gradients, every micro-batch's activations
    live until backward, so bound those with the trainer's batch_size and accumulation."""
    mask_truncated_completions: bool = False
    """Give completions that hit max_new_tokens without EOS an all-False mask."""
    compute_entropy: bool = True
    """Also return the per-token entropy (for an entropy bonus, and the entropy metric)."""
    chunked_output_layer: bool | str = "auto"
    """Score from the last hidden states and the output layer in row chunks, so no (n, T, V)
    logits tensor exists (backward recomputes each chunk's logits). true: always (an error
    when the model cannot be folded); false: never; auto: when the vocabulary has at least
    32768 tokens and the model can be folded (else the logits, the reason logged once). Folding
    needs a plain linear output layer (no LoRA on it), logits without soft-capping or scaling
    (checked on first use), and no FSDP2. Its matrix products run in the dtype the model's
    own output layer would multiply in (bfloat16 under bf16-mixed and bf16-copy; under fp32
    the weight's own dtype), its softmax in float32."""
    share_prompt_prefix: bool = True
    """Score the rows of a micro-batch that continue the same prompt (the G samples of a
    group) with one forward over that prompt, its KV cache shared by the rows, instead of
    one full forward per row: equal to float rounding, in log-probs and gradients. It applies
    to Llama, Mistral, Qwen2, Qwen3, GPT-2 and Gemma 3 models (LoRA included), not in the gradient
    pass with gradient_checkpointing, nor with FSDP2; elsewhere the plain forward runs and
    says why once in the log ("grpo.lm.prefix")."""
    pack_completions: bool = False
    """Where prompts are shared (share_prompt_prefix), run a micro-batch's completions laid end
    to end in one row under a block mask instead of right-padded to the longest one, so no
    work is spent on padding: equal to float rounding, in log-probs and gradients
    (`grpo.lm.packing`). It needs attention that takes a 4D mask (sdpa or eager) and, for a
    model with a sliding window, rows inside the window; elsewhere the padded rows score and
    the reason is logged once ("grpo.lm.packing"). Off by default: it moves a run's numbers
    by bfloat16 rounding, and short completions (the demo's, chess moves) leave little padding
    to save; the real-model configs turn it on (docs/performance.md)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass instead of storing them."""
    disable_dropout: bool = True
    """Set every dropout probability in the model to 0 (see the module docstring)."""
    precision: str = "fp32"
    """What the model's forward and backward compute in: fp32 (the weights' own dtype), or
    bf16-mixed (bfloat16 autocast over float32 weights, gradients and optimizer state; log-probs,
    loss, advantages and KL stay float32), on a CPU or a GPU; fp16-mixed the same in float16
    (needs a gradient scaler), or auto: bf16-mixed where bfloat16 matrix products beat float32
    on the model's device (a GPU with native bfloat16, a CPU measured when the policy is
    built), else fp32; the run's config.yaml records the choice. bf16-mixed set by hand where
    bfloat16 is slower (emulated: CPUs without native bfloat16 instructions) warns.
    bf16-copy: the same float32 weights, gradients and optimizer state, the forward and
    backward on a bfloat16 copy of the model re-cast once per optimizer step (norms,
    residual stream and attention in bfloat16 too; `grpo.lm.compute_copy`); one process
    only, not with FSDP2 or DDP. Sampling computes in it too unless rollout.precision says
    otherwise. Keep model.dtype float32 (or auto for a float32 checkpoint) with it: weights
    stored in bfloat16 lose updates smaller than their spacing (docs/performance.md)."""

    def __post_init__(self) -> None:
        if not isinstance(self.generation, GenerationSettings):
            raise TypeError(
                f"generation: got {type(self.generation).__name__}; allowed: GenerationSettings"
            )
        self.precision = check_precision("policy.precision", self.precision, auto=True)
        mb = self.micro_batch_size
        if isinstance(mb, bool) or not isinstance(mb, int) or mb < 1:
            raise ValueError(f"micro_batch_size: got {mb!r}; allowed: an integer >= 1")
        check_folding_mode(self.chunked_output_layer)
