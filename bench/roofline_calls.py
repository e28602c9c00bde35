"""What the policy sampled and scored during a step, recorded around its own methods: the groups
(prompt length, completion lengths) `bench/roofline.py` counts the work of each phase from."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["CallLog"]


def _groups(actions: Sequence[Any]) -> list[tuple[int, list[int]]]:
    """Actions grouped by identical prompt, in order of first appearance -> (P, [T_j])."""
    found: dict[tuple[int, ...], list[int]] = {}
    for a in actions:
        found.setdefault(a.prompt_ids, []).append(a.num_tokens)
    return [(len(prompt), lengths) for prompt, lengths in found.items()]


class CallLog:
    """The groups (prompt length, completion lengths) the policy sampled and scored since
    `clear()`, by phase, recorded around its own methods; "reference": the reference's."""

    def __init__(self, policy: Any) -> None:
        settings = policy.settings
        self.micro_batch = settings.micro_batch_size
        self.decode_batch = settings.generation.generation_batch_size
        self.references: list[Any] = []  # kept alive, so that no id is reused
        self.clear()
        _after(policy, "generate_actions", self._sampled)
        _after(policy, "get_token_log_probabilities", self._scored("old_logprobs"))

    def watch(self, reference: Any) -> None:
        """Record `reference`'s scoring too (the trainer makes a new one every
        `ref_update_frequency` steps; None: no KL term)."""
        if reference is not None and all(r is not reference for r in self.references):
            self.references.append(reference)
            _after(reference, "get_token_log_probabilities", self._scored("reference"))

    def clear(self) -> None:
        self.groups: dict[str, list[tuple[int, list[int]]]] = {
            k: [] for k in ("sampling", "old_logprobs", "loss_backward", "reference")}  # fmt: skip
        self.passes = dict.fromkeys(self.groups, 0)  # forwards over a micro-batch
        self.decoding: list[tuple[list[int], list[int]]] = []  # per decoded batch: (P_n, T_n)

    def _sampled(self, args: tuple, out: list[list[Any]]) -> None:
        rows = [a for group in out for a in group]
        self.groups["sampling"] += [g for group in out for g in _groups(group)]
        step = self.decode_batch or len(rows)
        for s in range(0, len(rows), step):
            chunk = rows[s : s + step]
            self.decoding.append(
                ([len(a.prompt_ids) for a in chunk], [a.num_tokens for a in chunk])
            )

    def _scored(self, no_grad_phase: str) -> Callable[[tuple, Any], None]:
        import torch

        def note(args: tuple, out: Any) -> None:
            phase = "loss_backward" if torch.is_grad_enabled() else no_grad_phase
            actions = args[1]
            for s in range(0, len(actions), self.micro_batch):  # as scoring cuts them
                self.groups[phase] += _groups(actions[s : s + self.micro_batch])
                self.passes[phase] += 1

        return note


def _after(obj: Any, name: str, note: Callable[[tuple, Any], None]) -> None:
    """Make `obj.name(...)` call `note(args, result)` after it (this instance only)."""
    method = getattr(obj, name)

    def recorded(*args: Any, **kwargs: Any) -> Any:
        out = method(*args, **kwargs)
        note(args, out)
        return out

    setattr(obj, name, recorded)
