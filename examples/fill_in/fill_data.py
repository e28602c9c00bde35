"""Character-level data for the fill-in example: vocabulary, windows, masking.

The text is the opening chapter of Lewis Carroll's "Alice's Adventures in
Wonderland" (1865, public domain), shipped as `alice.txt`. Whitespace is
collapsed to single spaces; the last `held_out_fraction` of the characters
is never seen in training and provides the held-out masked inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

PAD, MASK = 0, 1
SPECIALS = ("<pad>", "<mask>")
TEXT_PATH = Path(__file__).with_name("alice.txt")


@dataclass
class CharVocab:
    """Token ids: 0 = padding, 1 = mask, then one id per character of the text."""

    chars: str

    @classmethod
    def from_text(cls, text: str) -> CharVocab:
        return cls("".join(sorted(set(text))))

    @property
    def size(self) -> int:
        return len(SPECIALS) + len(self.chars)

    def encode(self, text: str) -> Tensor:
        index = {c: i + len(SPECIALS) for i, c in enumerate(self.chars)}
        return torch.tensor([index[c] for c in text], dtype=torch.long)

    def decode(self, ids: Tensor, mask_char: str = "_") -> str:
        """Text of a window; masked positions shown as `mask_char`."""
        out = []
        for i in ids.tolist():
            out.append(
                mask_char if i == MASK else "" if i == PAD else self.chars[i - len(SPECIALS)]
            )
        return "".join(out)


def load_text(path: Path = TEXT_PATH) -> str:
    return " ".join(path.read_text(encoding="utf-8").split())


def split_ids(ids: Tensor, held_out_fraction: float) -> tuple[Tensor, Tensor]:
    """(L,) -> train (L_train,), held-out (L_held,): a contiguous tail is held out."""
    cut = int(len(ids) * (1.0 - held_out_fraction))
    return ids[:cut], ids[cut:]


def sample_windows(ids: Tensor, count: int, window: int, gen: torch.Generator) -> Tensor:
    """`count` random windows of `window` characters: (count, window)."""
    starts = torch.randint(0, len(ids) - window + 1, (count,), generator=gen)  # (count,)
    return ids[starts[:, None] + torch.arange(window)]  # (count, window)


def mask_windows(windows: Tensor, mask_rate: float, gen: torch.Generator) -> Tensor:
    """Replace round(mask_rate * window) random positions of each row by MASK: (n, W) -> (n, W)."""
    n, window = windows.shape
    k = max(1, round(mask_rate * window))
    positions = torch.rand(n, window, generator=gen).argsort(-1)[:, :k]  # (n, k)
    return windows.scatter(1, positions, MASK)
