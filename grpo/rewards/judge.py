"""Judge-model reward: a frozen torch module scores texts (the fill-in plan).

The fill-in plan rewards a masked fill-in generator with a frozen judge classifier.
`JudgeReward` wraps any `torch.nn.Module` and an `encode(texts) -> inputs`
function (a tensor of token ids, or a dict of tensors passed as keyword
arguments, e.g. a tokenizer's output). Scoring runs in batches, under
`torch.no_grad`, with the module in eval mode and its parameters frozen: the
judge is never trained, and `train()` on it is a no-op, so a trainer that
toggles every model's mode cannot unfreeze it.

The module's output (a tensor, or an object with `.logits`) is read by one of
the named readouts in `READOUTS`: the probability or logit of one class of a
classifier, or a single scalar per text; a readout that does not give one score
per text, or a `label` outside the classifier's classes, is an error. A chat prompt
(a list of messages) is read whole: its messages' contents, one after another,
each on its own line. It is both a text reward callable
``judge(prompts, completions, **columns) -> list[float]`` and a framework-API
`RewardModel` (`compute_rewards(states, actions) -> (N,)`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from grpo.rewards.parsers import completion_text

__all__ = ["JudgeReward", "READOUTS"]


def _classes(logits: Tensor, label: int, readout: str, least: int) -> Tensor:
    """(N, C) logits of a classifier, checked: 2-D, at least `least` classes, `label` < C."""
    if logits.dim() != 2 or logits.shape[1] < least:
        raise ValueError(
            f"readout {readout!r} needs (texts, classes) logits with at least {least} classes, "
            f"got shape {tuple(logits.shape)}"
            + ("; for one logit per text use readout 'sigmoid' or 'scalar'" if least > 1 else "")
        )
    if not 0 <= label < logits.shape[1]:
        raise ValueError(f"label={label} is not a class of the judge's {logits.shape[1]}")
    return logits.float()


def _class_probability(logits: Tensor, label: int) -> Tensor:
    return torch.softmax(_classes(logits, label, "probability", 2), dim=-1)[:, label]  # (N,)


def _class_logit(logits: Tensor, label: int) -> Tensor:
    return _classes(logits, label, "logit", 1)[:, label]  # (N, C) -> (N,)


def _scalar(logits: Tensor, label: int) -> Tensor:
    if logits.dim() == 2 and logits.shape[1] != 1:
        raise ValueError(
            f"readout 'scalar' needs one output per text, got shape {tuple(logits.shape)}"
        )
    return logits.float().reshape(-1)  # (N,) or (N, 1) -> (N,)


def _sigmoid(logits: Tensor, label: int) -> Tensor:
    return torch.sigmoid(_scalar(logits, label))  # (N,)


READOUTS: dict[str, Callable[[Tensor, int], Tensor]] = {
    "probability": _class_probability,
    "logit": _class_logit,
    "scalar": _scalar,
    "sigmoid": _sigmoid,
}


class JudgeReward:
    """Scores ``prompt + separator + completion`` (or the completion alone) with a frozen module."""

    def __init__(
        self,
        model: nn.Module,
        encode: Callable[[list[str]], Tensor | dict[str, Tensor]],
        *,
        readout: str = "probability",
        label: int = 1,
        batch_size: int = 32,
        include_prompt: bool = True,
        separator: str = "",
        device: str | torch.device | None = None,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if readout not in READOUTS:
            raise ValueError(f"readout must be one of {sorted(READOUTS)}, got {readout!r}")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        self.model = model
        self.encode = encode
        self.readout = readout
        self.label = label
        self.batch_size = batch_size
        self.include_prompt = include_prompt
        self.separator = separator
        self.model.requires_grad_(False)
        self.model.eval()
        self.device = torch.device(device) if device is not None else _module_device(model)
        self.model.to(self.device)

    # -- scoring -----------------------------------------------------------------------
    @torch.no_grad()
    def score_texts(self, texts: Sequence[str]) -> Tensor:
        """One score per text: (N,) float32 on the CPU."""
        self.model.eval()  # dropout off, whatever the caller did to the module since
        scores = []
        for start in range(0, len(texts), self.batch_size):
            batch_texts = list(texts[start : start + self.batch_size])
            inputs = self.encode(batch_texts)
            output = self._forward(inputs)
            logits = getattr(output, "logits", output)
            if not isinstance(logits, Tensor):
                raise TypeError(
                    f"the judge model returned {type(output).__name__}; expected a tensor "
                    "or an object with a .logits tensor"
                )
            batch = READOUTS[self.readout](logits, self.label).cpu()
            expected = len(batch_texts)
            if batch.shape != (expected,):
                raise ValueError(
                    f"readout {self.readout!r} of the judge's output (shape {tuple(logits.shape)}) "
                    f"gave shape {tuple(batch.shape)} for a batch of {expected} texts: expected "
                    "one score per text"
                )
            scores.append(batch)
        return torch.cat(scores) if scores else torch.zeros(0)

    def _forward(self, inputs: Tensor | dict[str, Tensor]) -> Any:
        if isinstance(inputs, Tensor):
            return self.model(inputs.to(self.device))
        if isinstance(inputs, dict) or hasattr(inputs, "items"):
            return self.model(**{k: v.to(self.device) for k, v in inputs.items()})
        raise TypeError(
            f"encode must return a tensor or a dict of tensors, got {type(inputs).__name__}"
        )

    def texts(self, prompts: Sequence[Any], completions: Sequence[Any]) -> list[str]:
        """The strings the judge reads, one per completion."""
        if len(prompts) != len(completions):
            raise ValueError(
                f"prompts and completions must have the same length, got "
                f"{len(prompts)} and {len(completions)}"
            )
        bodies = [completion_text(c, i) for i, c in enumerate(completions)]
        if not self.include_prompt:
            return bodies
        return [
            _prompt_text(p, i) + self.separator + b
            for i, (p, b) in enumerate(zip(prompts, bodies, strict=True))
        ]

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **_: Any) -> list[float]:
        return self.score_texts(self.texts(prompts, completions)).tolist()

    # -- the framework API's RewardModel -------------------------------------------------------
    def compute_rewards(self, states: list[Any], actions: list[Any]) -> Tensor:
        """(N,) judge scores of aligned states and actions."""
        return self.score_texts(self.texts(states, actions))

    def to(self, device: str | torch.device) -> JudgeReward:
        self.device = torch.device(device)
        self.model.to(self.device)
        return self

    def eval(self) -> JudgeReward:
        self.model.eval()
        return self

    def train(self, mode: bool = True) -> JudgeReward:
        """No-op: the judge stays in eval mode and frozen."""
        return self


def _prompt_text(prompt: Any, index: int) -> str:
    """A prompt as the judge reads it: a string, or a chat's messages' contents line by line."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, dict) and isinstance(prompt.get("content"), str):
        return prompt["content"]  # one message
    if isinstance(prompt, Sequence) and all(
        isinstance(m, dict) and isinstance(m.get("content"), str) for m in prompt
    ):
        return "\n".join(m["content"] for m in prompt)
    raise TypeError(
        f"prompts[{index}] must be a str or a list of chat messages ({{'role', 'content'}} "
        f"dicts), got {type(prompt).__name__}"
    )


def _module_device(model: nn.Module) -> torch.device:
    for tensor in model.parameters():
        return tensor.device
    return torch.device("cpu")
