"""Tiny causal language models with random weights, built and saved locally for tests.

Nothing is downloaded: a byte-level BPE tokenizer is trained here with `tokenizers`
over a small generated corpus, a transformers config class gets random weights,
and both are written with `save_pretrained` so that tests load them back through
`from_pretrained`, exactly as a user's model would be loaded.

    path = build_tiny_causal_lm(tmp_dir / "qwen2", arch="qwen2")
    model, tokenizer = load_tiny_causal_lm(path)

Vocabulary: `WORDS` (plain words), the special tokens `PAD`, `EOS`, `UNK` and
the chat-role tokens `<|system|>`, `<|user|>`, `<|assistant|>`, `<|end|>`.
Text is words separated by single spaces; every word (with or without its leading
space) is one byte-level BPE token. The chat template renders `<|role|>content<|end|>` per message and ends with
`<|assistant|>` when `add_generation_prompt=True`.

`BASE_ARCHS` are built as base models, the way Gemma 3 270M ships: no chat
template, and a `BOS` token the tokenizer puts before every text. "gemma3" is a
Gemma3ForCausalLM whose layers alternate sliding-window and full attention, its
window (`SLIDING_WINDOW`) shorter than most prompts.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    Gemma3TextConfig,
    GPT2Config,
    LlamaConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

__all__ = [
    "ARCHS",
    "BASE_ARCHS",
    "BOS",
    "CHAT_TEMPLATE",
    "EOS",
    "PAD",
    "ROLE_TOKENS",
    "SLIDING_WINDOW",
    "PLAIN_REPLIES",
    "UNK",
    "WORDS",
    "build_tiny_causal_lm",
    "build_tokenizer",
    "gemma3_config",
    "load_tiny_causal_lm",
    "random_words",
    "supervised_warm_start",
    "teach_plain_replies",
]

PAD, EOS, UNK, BOS = "<pad>", "<eos>", "<unk>", "<bos>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
WORDS = tuple("abcdefghijklmnop") + (
    "say",
    "write",
    "count",
    "yes",
    "no",
    "red",
    "blue",
    "green",
    "the",
    "answer",
    ":",
)
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}<|end|>"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
ARCHS = ("qwen2", "llama", "gpt2")
BASE_ARCHS = ("gemma3",)
"""Built without a chat template and with a BOS token (see the module docstring)."""
SLIDING_WINDOW = 8


def random_words(rng: random.Random, low: int, high: int, words: tuple[str, ...] = WORDS) -> str:
    """Between `low` and `high` (inclusive) words drawn uniformly, space-separated."""
    return " ".join(rng.choice(words) for _ in range(rng.randint(low, high)))


def build_tokenizer(
    *, with_pad: bool = True, seed: int = 0, base: bool = False
) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on a generated corpus, with a chat template.

    `with_pad=False` leaves the pad token unset (as many base models ship); `base=True`
    builds a base model's instead: no chat template, `BOS` put before every text.
    """
    rng = random.Random(seed)
    corpus = [random_words(rng, 3, 12) for _ in range(300)] + [" ".join(WORDS)] * 5
    specials = [PAD, EOS, UNK, *ROLE_TOKENS, *([BOS] if base else [])]
    # byte-level BPE, the layout of GPT-2 and Qwen2 tokenizers (transformers rebuilds a
    # Qwen2 tokenizer from vocab + merges, so the pipeline must be the one it expects)
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=256 + len(specials) + 120,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(corpus, trainer)
    if base:
        bos = [(BOS, core.token_to_id(BOS))]
        core.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=bos)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token=EOS,
        unk_token=UNK,
        pad_token=PAD if with_pad else None,
        bos_token=BOS if base else None,
        additional_special_tokens=list(ROLE_TOKENS),
    )
    if not base:
        tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def gemma3_config(**values) -> Gemma3TextConfig:
    """The tests' tiny Gemma 3 shape (hidden 32, MLP 64, 4 query heads over 2 key-value heads
    of 8), `values` setting the rest: the "gemma3" model here and the lean engine's tests'.
    (tests/lm/tiny_gemma.py's GGUF model has its own shape: quantization blocks of 32.)"""
    shape = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 8}  # fmt: skip
    return Gemma3TextConfig(**{**shape, **values})


def _config(
    arch: str,
    vocab_size: int,
    pad_id: int | None,
    eos_id: int,
    bos_id: int,
    max_positions: int,
    window: int = SLIDING_WINDOW,
):
    special = {"pad_token_id": pad_id, "eos_token_id": eos_id, "bos_token_id": bos_id}
    if arch == "gemma3":  # Gemma 3's own head_dim and query scaling, two window layers per full
        return gemma3_config(
            vocab_size=vocab_size, num_hidden_layers=3, query_pre_attn_scalar=8,
            sliding_window=window, max_position_embeddings=max_positions,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"], **special,
        )  # fmt: skip
    if arch == "gpt2":
        return GPT2Config(
            vocab_size=vocab_size,
            n_positions=max_positions,
            n_embd=32,
            n_layer=2,
            n_head=4,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            **special,
        )
    config_class = {"qwen2": Qwen2Config, "llama": LlamaConfig}.get(arch)
    if config_class is None:
        raise ValueError(f"arch: got {arch!r}; allowed: {', '.join(ARCHS + BASE_ARCHS)}")
    return config_class(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        tie_word_embeddings=arch == "qwen2",
        **special,
    )


def build_tiny_causal_lm(
    path: str | Path,
    arch: str = "qwen2",
    *,
    seed: int = 0,
    with_pad: bool = True,
    max_positions: int = 64,
    vocab_size: int | None = None,
    sliding_window: int = SLIDING_WINDOW,
) -> Path:
    """Save a random-init `arch` model (hidden 32, 2 layers; gemma3: 3) and its tokenizer to
    `path`. `vocab_size`: the model's (default: the tokenizer's); ids past the tokenizer's
    decode to ''. `sliding_window`: gemma3's sliding layers' window."""
    path = Path(path)
    tokenizer = build_tokenizer(with_pad=with_pad, base=arch in BASE_ARCHS)
    pad_id = tokenizer.pad_token_id if with_pad else None
    eos_id = tokenizer.eos_token_id
    bos_id = eos_id if tokenizer.bos_token_id is None else tokenizer.bos_token_id
    V = len(tokenizer) if vocab_size is None else vocab_size
    config = _config(arch, V, pad_id, eos_id, bos_id, max_positions, sliding_window)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config.pad_token_id = pad_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def load_tiny_causal_lm(path: str | Path) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """Load what `build_tiny_causal_lm` saved, in fp32, through `from_pretrained`."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(path)
    return model, tokenizer


def supervised_warm_start(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    pairs: list[tuple[str, str]],
    *,
    steps: int = 40,
    batch_size: int = 16,
    lr: float = 3e-3,
    seed: int = 0,
) -> list[float]:
    """A few steps of SFT on (prompt, completion) pairs: loss on completion tokens + EOS.

    Makes a random-init model emit the words a task rewards some of the time,
    so that a short GRPO run has signal. Returns the loss per step.
    """
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for prompt, completion in pairs:
        p = tokenizer(prompt)["input_ids"]
        c = tokenizer(completion)["input_ids"] + [tokenizer.eos_token_id]
        rows.append((p + c, [-100] * len(p) + c))
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    losses = []
    for _ in range(steps):
        picks = torch.randint(len(rows), (batch_size,), generator=gen).tolist()
        width = max(len(rows[i][0]) for i in picks)
        pad = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        )
        ids = torch.tensor([rows[i][0] + [pad] * (width - len(rows[i][0])) for i in picks])
        labels = torch.tensor([rows[i][1] + [-100] * (width - len(rows[i][1])) for i in picks])
        mask = torch.tensor(
            [[1] * len(rows[i][0]) + [0] * (width - len(rows[i][0])) for i in picks]
        )
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    model.eval()
    return losses


PLAIN_REPLIES = (" Answer: 7", " I do not know.")
"""What `teach_plain_replies` teaches a base model to answer, each followed by the plain stop."""


def teach_plain_replies(source: str | Path, path: str | Path) -> Path:
    """The base model saved at `source` taught (80 steps of `supervised_warm_start` on short plain
    questions, which is cheap) to answer one of `PLAIN_REPLIES` and go on to the next question
    (`grpo.lm.prompt_forms.PLAIN_STOP`), saved to `path`: with a sliding window shorter than a
    word problem, its samples on word problems end at the plain stop too, and their format
    reward differs within a group."""
    from grpo.lm.prompt_forms import PLAIN_STOP, plain_text

    model, tokenizer = load_tiny_causal_lm(source)
    rng = random.Random(0)
    pairs = [(plain_text([{"role": "user", "content": random_words(rng, 2, 8)}]),
              PLAIN_REPLIES[i % 2] + PLAIN_STOP) for i in range(64)]  # fmt: skip
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: more threads only wait on each other
    try:
        supervised_warm_start(model, tokenizer, pairs, steps=80, lr=1e-2)
    finally:
        torch.set_num_threads(threads)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return Path(path)


def spans(mask):
    """Contiguous runs of True in a 0/1 or bool sequence, as (start, end) pairs."""
    runs, start = [], None
    for i, flag in enumerate([*mask, False]):
        if flag and start is None:
            start = i
        if not flag and start is not None:
            runs.append((start, i))
            start = None
    return runs
