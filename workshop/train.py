"""A full GRPO run on a tiny model, with your own functions from the six parts.

    python workshop/train.py --use solutions   # the library's functions
    python workshop/train.py                   # yours, from workshop/stubs/

The task: the user says "say red" (or green, blue, yellow) and the assistant
must answer that colour. A reply that is not a colour gets a penalty and the
user's feedback "say red green blue or yellow", then a second try, so the
episodes are multi-turn. The model is a Llama with random weights (about 20k
parameters) built here, with a word-level tokenizer and a chat template:
nothing is downloaded. Every piece of the loop is yours:

    collect_rollouts (part 4) plays the episodes, through compose_parsers (part 6)
    tokenize_with_assistant_mask (part 5) marks the tokens the model sampled
    completion_logprobs (part 1) scores them, with the causal shift
    group_advantages (part 2) compares each episode with its group
    reinforce + an aggregation (part 3) turn them into the loss

The loop is picoRL's: sample in eval mode, advantages, one gradient step.
With a stub still raising NotImplementedError, the script says which part to
write first and stops before training.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a clone

from grpo.envs.agent import PolicyAgent  # noqa: E402
from grpo.functional.losses import Clip  # noqa: E402
from grpo.lm.policy import CausalLMPolicy, CausalLMSettings  # noqa: E402
from grpo.lm.sampling import GenerationSettings  # noqa: E402
from grpo.rewards.parsers import ParseResult  # noqa: E402
from workshop.check import PARTS, as_token_loss  # noqa: E402

COLOURS = ("red", "green", "blue", "yellow")
WORDS = ("<pad>", "<unk>", "<|user|>", "<|assistant|>", "<|end|>", "say", "or", "one", "word",
         "the", "a", *COLOURS)  # fmt: skip
# append-only: a longer conversation renders as the shorter one plus its new messages
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}"
)
FEEDBACK = "say red green blue or yellow"


# ---------------------------------------------------------------- task and model
class SayColourEnv:
    """One episode: reward 1 when the (parsed) answer is the colour asked for."""

    def __init__(self, colour: str) -> None:
        self.colour = colour

    def reset(self) -> str:
        self.answer = None
        return f"say {self.colour}"

    def step(self, action: str) -> tuple[None, bool]:
        self.answer = action
        return None, True

    def reward(self) -> float:
        return 1.0 if self.answer == self.colour else 0.0


def first_word(text: str) -> ParseResult:
    """The first word; -0.2 when more words follow, a failure when there is none."""
    words = text.split()
    if not words:
        return ParseResult(None, -0.5, FEEDBACK)
    return ParseResult(words[0], 0.0 if len(words) == 1 else -0.2)


def a_colour(word: str) -> ParseResult:
    """Passes a colour on; anything else fails with the feedback shown to the model."""
    return ParseResult(word) if word in COLOURS else ParseResult(None, -0.5, FEEDBACK)


def build_tokenizer():
    """A word-level tokenizer over `WORDS` with the chat template; <|end|> is its EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", unk_token="<unk>", eos_token="<|end|>",
        additional_special_tokens=["<|user|>", "<|assistant|>"],
    )  # fmt: skip
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_model(tokenizer, seed: int):
    """A two-layer Llama (hidden size 32) with random weights drawn from `seed`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(WORDS), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


# ---------------------------------------------------------------- your functions
def load_parts(package: str) -> dict[int, object]:
    """The module of each part in `package` ("workshop.stubs", "workshop.solutions", ...)."""
    return {p.number: importlib.import_module(f"{package}.{p.module}") for p in PARTS}


def _probes(parts, tokenizer):
    """(part, function, one tiny call) in part order; a stub answers with NotImplementedError."""
    lp = torch.zeros(1, 2, requires_grad=True)
    mask = torch.ones(1, 2, dtype=torch.bool)
    chat = [{"role": "user", "content": "say red"}, {"role": "assistant", "content": "red"}]
    ids = torch.zeros(1, 2).long()
    yield 1, "completion_logprobs", lambda: parts[1].completion_logprobs(torch.zeros(1, 3, 4), ids)
    yield 2, "group_advantages", lambda: parts[2].group_advantages(torch.tensor([0.0, 1.0]), 2)
    yield 3, "reinforce", lambda: parts[3].reinforce(lp, lp.detach(), torch.ones(1, 1), mask, None)
    for name in ("sequence_mean", "token_mean", "constant_length", "sequence_sum"):
        yield 3, name, lambda name=name: getattr(parts[3], name)(lp, mask, 2)
    envs = [SayColourEnv("red")]
    yield 4, "collect_rollouts", lambda: parts[4].collect_rollouts(envs, lambda c: ["red"] * len(c))
    yield (
        5,
        "tokenize_with_assistant_mask",
        lambda: parts[5].tokenize_with_assistant_mask(tokenizer, chat),
    )
    yield 6, "compose_parsers", lambda: parts[6].compose_parsers(first_word)("red")


def first_unwritten(parts, tokenizer) -> str | None:
    """A message naming the first part whose function still raises NotImplementedError."""
    for number, function, probe in _probes(parts, tokenizer):
        try:
            probe()
        except NotImplementedError:
            part = PARTS[number - 1]
            return (
                f"part {number} ({part.title}) is not written yet: write {function} in "
                f"workshop/stubs/{part.module}.py first,\nthen check it with "
                f"`python -m workshop.check --part {number}` and run this script again."
            )
    return None


# ---------------------------------------------------------------- the GRPO step
def episode_batch(parts, tokenizer, rollouts):
    """Right-padded ids (N, L), their attention mask (N, L) and assistant mask (N, L)."""
    rows = [
        parts[5].tokenize_with_assistant_mask(
            tokenizer, r.messages, action_token_ids=r.action_token_ids,
            action_truncated=r.action_truncated
        )
        for r in rollouts
    ]
    width = max(len(r.input_ids) for r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)  # (N, L)
    attention = torch.zeros(len(rows), width, dtype=torch.bool)  # (N, L)
    assistant = torch.zeros(len(rows), width, dtype=torch.bool)  # (N, L)
    for n, row in enumerate(rows):
        ids[n, : len(row.input_ids)] = torch.tensor(row.input_ids)
        attention[n, : len(row.input_ids)] = True
        assistant[n, : len(row.input_ids)] = torch.tensor(row.assistant_mask, dtype=torch.bool)
    return ids, attention, assistant


def grpo_step(parts, args, model, tokenizer, agent, optimizer, step: int) -> dict[str, float]:
    """Collect B x G episodes, score them, one gradient step; detached metrics."""
    colours = [COLOURS[(step * args.prompts + b) % len(COLOURS)] for b in range(args.prompts)]
    envs = [SayColourEnv(c) for c in colours for _ in range(args.group_size)]  # groups contiguous
    groups = [b for b in range(args.prompts) for _ in range(args.group_size)]
    parse = parts[6].compose_parsers(first_word, a_colour)
    model.eval()  # sampling: no dropout, no gradient (the agent runs under no_grad)
    rollouts = parts[4].collect_rollouts(envs, agent, max_turns=2, group_ids=groups, parser=parse)

    rewards = torch.tensor([r.total_reward for r in rollouts])  # (N,)
    advantages = parts[2].group_advantages(rewards, args.group_size)  # (N,)
    ids, attention, assistant = episode_batch(parts, tokenizer, rollouts)  # (N, L) each

    model.train()
    logits = model(input_ids=ids, attention_mask=attention.long()).logits  # (N, L, V)
    # every token but the first is scored by the position before it: the causal shift,
    # so the mask is shifted too (mask[:, 1:], not mask[:, :-1])
    logprobs = parts[1].completion_logprobs(logits, ids[:, 1:])  # (N, L-1)
    mask = assistant[:, 1:] & attention[:, 1:]  # (N, L-1) True = a sampled token
    token_loss = as_token_loss(parts[3].reinforce)
    per_token = token_loss(logprobs, logprobs.detach(), advantages[:, None], mask, Clip(0.8, 1.2))
    values = torch.where(mask, per_token.loss, torch.zeros_like(per_token.loss))  # (N, L-1)
    loss = getattr(parts[3], args.aggregation)(values, mask, values.shape[1])

    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    correct = sum(
        r.actions[-1].split()[:1] == [e.colour] for r, e in zip(rollouts, envs, strict=True)
    )
    return {"reward": rewards.mean().item(), "correct": correct / len(envs), "loss": loss.item()}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--use", default="stubs", help="stubs, solutions, or a package path")
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--prompts", type=int, default=8, help="B prompts per step")
    parser.add_argument("--group-size", type=int, default=8, help="G episodes per prompt")
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--aggregation", default="sequence_mean",
        choices=("sequence_mean", "token_mean", "constant_length", "sequence_sum"),
    )  # fmt: skip
    return parser.parse_args(argv)


def train(args: argparse.Namespace, log=print) -> list[dict[str, float]] | None:
    """Run `args.steps` GRPO steps; the metrics of each, or None when a part is unwritten."""
    package = f"workshop.{args.use}" if args.use in ("stubs", "solutions") else args.use
    parts = load_parts(package)
    tokenizer = build_tokenizer()
    missing = first_unwritten(parts, tokenizer)
    if missing is not None:
        log(missing)
        return None

    model = build_model(tokenizer, args.seed)
    generation = GenerationSettings(max_new_tokens=3, seed=args.seed)
    policy = CausalLMPolicy(model, tokenizer, CausalLMSettings(generation=generation))
    agent = PolicyAgent(policy)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    log(f"GRPO with {package}: {args.steps} steps of {args.prompts} x {args.group_size} episodes")
    start, history = time.perf_counter(), []
    for step in range(args.steps):
        metrics = grpo_step(parts, args, model, tokenizer, agent, optimizer, step)
        history.append(metrics)
        log(
            f"step {step:3d}  reward {metrics['reward']:+.3f}  "
            f"correct {metrics['correct']:.2f}  loss {metrics['loss']:+.4f}"
        )
    window = max(1, args.steps // 4)
    first = sum(m["correct"] for m in history[:window]) / window
    last = sum(m["correct"] for m in history[-window:]) / window
    log(
        f"correct answers: {first:.2f} in the first {window} steps, {last:.2f} in the last "
        f"{window} ({time.perf_counter() - start:.1f} s)"
    )
    return history


def main(argv: list[str] | None = None) -> int:
    return 0 if train(parse_args(argv)) is not None else 2


if __name__ == "__main__":
    sys.exit(main())
