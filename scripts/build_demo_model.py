"""Build the demo checkpoint `grpo/assets/arith-tiny/` from nothing.

1. Train a character-level WordLevel tokenizer (digits, operators, "=", and
   <pad>/<bos>/<eos>/<unk>) with the `tokenizers` library on generated problems.
2. Build a small Llama causal LM (about 0.8M parameters) from its config class,
   with random weights.
3. Supervised fine-tuning on the training split of the arithmetic task
   (cross-entropy on the answer and the end-of-sequence token only), stopped
   early on purpose: the model has learned the format (digits, then <eos>) but
   only part of the arithmetic, so GRPO has room to improve it.
4. Save model (safetensors) and tokenizer with `save_pretrained`, plus
   `build_info.json` recording how they were made and the held-out accuracy.

Deterministic for a given seed and thread count:
`python scripts/build_demo_model.py` (about a minute on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a plain script from a checkout, installed or not

from grpo.tasks.arithmetic import (  # noqa: E402
    ArithmeticConfig,
    evaluate,
    generate_dataset,
    greedy_completions,
)

SPECIAL_TOKENS = ["<pad>", "<bos>", "<eos>", "<unk>"]
TASK = ArithmeticConfig(num_operands=2, min_digits=1, max_digits=2, operators=("+",))
MODEL = dict(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=4,
    max_position_embeddings=64,
    tie_word_embeddings=True,
)


def build_tokenizer(seed: int) -> PreTrainedTokenizerFast:
    """A one-character-per-token tokenizer that prepends <bos> and decodes without spaces."""
    corpus = [
        row["prompt"] + row["answer"] for row in generate_dataset(2000, seed=seed, config=TASK)
    ]
    corpus.append("0123456789+-*=")  # every symbol the task can produce, whatever the sample
    return word_level_tokenizer(".", corpus, MODEL["max_position_embeddings"])


def word_level_tokenizer(pieces: str, corpus: list[str], max_length: int) -> PreTrainedTokenizerFast:
    """A WordLevel tokenizer whose tokens are the matches of the regex `pieces`, trained on
    `corpus`: <pad>/<bos>/<eos>/<unk>, <bos> prepended, decoding joins the pieces unchanged."""
    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(pieces), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()  # join the pieces back without separators
    trainer = trainers.WordLevelTrainer(special_tokens=SPECIAL_TOKENS, min_frequency=1)
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    bos = tokenizer.token_to_id("<bos>")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", bos)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        padding_side="left",
        model_max_length=max_length,
    )


def build_model(tokenizer: PreTrainedTokenizerFast, shape: dict = MODEL) -> LlamaForCausalLM:
    """A randomly initialised small Llama of `shape` with the tokenizer's special ids."""
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **shape,
    )
    return LlamaForCausalLM(config)


def sft_batch(
    tokenizer, rows: list[dict[str, str]], answer: str = "answer"
) -> dict[str, torch.Tensor]:
    """Right-padded `<bos> prompt answer <eos>`; labels only on `answer <eos>` (the column
    `answer` of each row)."""
    ids, labels = [], []
    for row in rows:
        prompt = tokenizer(row["prompt"])["input_ids"]  # starts with <bos>
        target = tokenizer(row[answer], add_special_tokens=False)["input_ids"]
        target = target + [tokenizer.eos_token_id]
        ids.append(prompt + target)
        labels.append([-100] * len(prompt) + target)
    width = max(len(x) for x in ids)
    pad = tokenizer.pad_token_id
    return {
        "input_ids": torch.tensor([x + [pad] * (width - len(x)) for x in ids]),
        "attention_mask": torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in ids]),
        "labels": torch.tensor([y + [-100] * (width - len(y)) for y in labels]),
    }


def train(model, tokenizer, args: argparse.Namespace) -> list[dict[str, float]]:
    """`args.steps` AdamW steps on random training problems; returns the accuracy log."""
    rows = generate_dataset(args.train_problems, seed=args.seed, config=TASK)
    validation = generate_dataset(256, seed=args.seed + 1, config=TASK)  # train split, not held out
    held_out = generate_dataset(args.eval_problems, split="held_out", seed=0, config=TASK)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98))
    warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 50))
    rng = random.Random(args.seed)
    log = []
    model.train()
    for step in range(1, args.steps + 1):
        loss = model(**sft_batch(tokenizer, rng.sample(rows, args.batch_size))).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # the loss spikes without it
        optimizer.step()
        warmup.step()
        if step % args.eval_every == 0 or step == args.steps:
            entry = {"step": step, "loss": round(loss.item(), 4)}
            for name, data in (("validation", validation), ("held_out", held_out)):
                generate = lambda p: greedy_completions(model, tokenizer, p)  # noqa: E731
                entry[f"{name}_accuracy"] = evaluate(generate, data)["accuracy"]
            log.append(entry)
            print(json.dumps(entry), flush=True)
    return log


def _portable_tokenizer_class(path: Path) -> None:
    """Name the tokenizer class that both transformers 4.x and 5.x resolve from tokenizer.json."""
    config = json.loads(path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(config, indent=2) + "\n")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "grpo" / "assets" / "arith-tiny")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=790, help="SFT steps; few on purpose")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--train-problems", type=int, default=4000)
    parser.add_argument("--eval-problems", type=int, default=500)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--threads", type=int, default=2)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    start = time.time()
    tokenizer = build_tokenizer(args.seed)
    model = build_model(tokenizer)
    log = train(model, tokenizer, args)
    info = {
        "task": {k: v for k, v in vars(TASK).items()},
        "model": {"class": "LlamaForCausalLM", "parameters": model.num_parameters(), **MODEL},
        "sft": {
            k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "out"
        },
        "held_out_accuracy": log[-1]["held_out_accuracy"],
        "validation_accuracy": log[-1]["validation_accuracy"],
        "log": log,
        "build_seconds": round(time.time() - start, 1),
        "torch": torch.__version__,
    }
    save(model, tokenizer, args.out, info)


def save(model, tokenizer, out: Path, info: dict) -> None:
    """The model (safetensors), its tokenizer and `info` as build_info.json in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    _portable_tokenizer_class(out / "tokenizer_config.json")
    (out / "build_info.json").write_text(json.dumps(info, indent=2) + "\n")
    print(f"saved {out} ({model.num_parameters()} parameters)")


if __name__ == "__main__":
    main()
