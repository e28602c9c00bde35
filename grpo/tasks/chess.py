"""Built-in chess task (seed 001): list the legal moves of a position.

The prompt shows a position as a FEN; the expected completion is one line
``M: e2e4 d2d4 ...`` of moves in UCI notation, the output format of seed 001's
model. The reward (all values exact, see `ChessRewardConfig`):

    reward = distinct legal moves listed / legal moves of the position
             - illegal_penalty * illegal / (distinct legal + illegal)

and ``-format_penalty`` when the completion is not one ``M:`` line with at least
one move. Repeating a legal move neither earns nor costs anything. Illegal
moves include malformed ones ("zz", "e2e9").

The prompt (`PROMPTS`, the task option ``prompt``) is the bare ``FEN: ...``
line (``"fen"``, for a model trained on that format), or chat messages for a
chat model read through its chat template: a system instruction saying what
to write (``"instruction"``), optionally followed by one worked example: the
initial position and its 20 moves (``"example"``), or a rook endgame and its 16
moves (``"endgame_example"``), a list that is rarely legal anywhere else, so that
copying the example does not pay (``docs/chess.md``: with the initial position
GRPO learns to copy its list into every position).

Positions come from random legal play from the initial position with a seeded
RNG (a uniform number of plies in [min_plies, max_plies]); games that end
early are discarded. As in `grpo.tasks.arithmetic`, train and held-out
positions are separated by a stable hash of the FEN, not by the seed.

Departures from seed 001: seed 001 used an existing reward function it did not
define; the formula above is this library's, chosen so that an empty or
made-up list never beats listing a few true moves. Seed 001's model had
learnt the ``M:`` format before GRPO; the chat prompts let a general chat
model be asked for it instead.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from grpo.rewards.chess import board_from_fen, check_moves, score_by_position
from grpo.tasks import draw_distinct, hash_split

__all__ = [
    "ChessRewardConfig",
    "ENDGAME_ANSWER",
    "ENDGAME_FEN",
    "INSTRUCTION",
    "PROMPTS",
    "PROMPT_TEMPLATE",
    "START_FEN",
    "breakdown",
    "evaluate",
    "generate_dataset",
    "make_reward",
    "parse_move_list",
    "position_split",
    "reward",
    "score_completion",
]

START_FEN = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"
ENDGAME_FEN = "8/8/8/4k3/8/8/8/R3K3 w Q - 0 1"
PROMPT_TEMPLATE = "FEN: {fen}\n"
SPLITS = ("train", "held_out")
_MOVE_LINE = re.compile(r"M:((?:[ \t]+\S+)+)[ \t]*")

INSTRUCTION = (
    "You are given a chess position in FEN notation. List every legal move of the side to "
    "move in UCI notation (the from-square then the to-square, e.g. e2e4; a promotion adds "
    "the piece, e.g. e7e8q), separated by spaces, on one line that starts with 'M:'. "
    "Write nothing else."
)
EXAMPLE_ANSWER = (
    "M: a2a3 a2a4 b1a3 b1c3 b2b3 b2b4 c2c3 c2c4 d2d3 d2d4 e2e3 e2e4 f2f3 f2f4 g1f3 g1h3 "
    "g2g3 g2g4 h2h3 h2h4"
)  # every legal move of START_FEN (a test checks it)
ENDGAME_ANSWER = (
    "M: a1a2 a1a3 a1a4 a1a5 a1a6 a1a7 a1a8 a1b1 a1c1 a1d1 e1c1 e1d1 e1d2 e1e2 e1f1 e1f2"
)  # every legal move of ENDGAME_FEN, castling queenside included (a test checks it)


def _fen_prompt(fen: str) -> str:
    return PROMPT_TEMPLATE.format(fen=fen)


def _instruction_prompt(fen: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": INSTRUCTION},
        {"role": "user", "content": _fen_prompt(fen).strip()},
    ]


def _worked_example(example_fen: str, answer: str) -> Callable[[str], list[dict[str, str]]]:
    def prompt(fen: str) -> list[dict[str, str]]:
        system, user = _instruction_prompt(fen)
        example = [
            {"role": "user", "content": _fen_prompt(example_fen).strip()},
            {"role": "assistant", "content": answer},
        ]
        return [system, *example, user]

    return prompt


PROMPTS: dict[str, Callable[[str], str | list[dict[str, str]]]] = {
    "fen": _fen_prompt,
    "instruction": _instruction_prompt,
    "example": _worked_example(START_FEN, EXAMPLE_ANSWER),
    "endgame_example": _worked_example(ENDGAME_FEN, ENDGAME_ANSWER),
}
"""The prompt of a position: the bare FEN line; an instruction and the FEN as chat
messages; the same with one worked example (the initial position, or a rook endgame)
before the FEN."""


@dataclass(frozen=True)
class ChessRewardConfig:
    """Weights of the move-listing reward."""

    illegal_penalty: float = 0.5
    """Subtracted in proportion to the share of listed moves that are illegal (>= 0)."""
    format_penalty: float = 1.0
    """Reward is -format_penalty when the completion is not one 'M: move move ...' line (>= 0)."""

    def __post_init__(self) -> None:
        for name in ("illegal_penalty", "format_penalty"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")


def parse_move_list(text: str) -> list[str] | None:
    """The moves of a ``M: m1 m2 ...`` line (surrounding whitespace ignored), None if malformed."""
    match = _MOVE_LINE.fullmatch(text.strip())
    return match.group(1).split() if match else None


def score_completion(fen: str, text: str, config: ChessRewardConfig | None = None) -> float:
    """The reward of one completion for the position `fen` (formula in the module docstring)."""
    config = config or ChessRewardConfig()
    moves = parse_move_list(text)
    if moves is None:
        return -config.format_penalty
    check = check_moves(fen, moves)
    listed = len(check.legal) + len(check.illegal)
    coverage = len(check.legal) / check.num_legal if check.num_legal else 0.0
    return coverage - config.illegal_penalty * len(check.illegal) / listed


def make_reward(config: ChessRewardConfig | None = None) -> Callable[..., list[float]]:
    """The task's reward callable ``reward(prompts, completions, fen, **columns)`` for `config`."""
    config = config or ChessRewardConfig()

    def chess_moves(
        prompts: Sequence[Any], completions: Sequence[Any], fen: Sequence[str], **_: Any
    ) -> list[float]:
        return score_by_position(
            completions, fen, lambda position, text: score_completion(position, text, config)
        )

    return chess_moves


reward = make_reward()


def position_split(fen: str, held_out_fraction: float = 0.1) -> str:
    """``"held_out"`` or ``"train"``: a stable hash of the FEN decides, not a seed."""
    return hash_split(fen, held_out_fraction)


def _random_position(rng: random.Random, plies: int) -> str | None:
    import chess

    board = chess.Board()
    for _ in range(plies):
        moves = sorted(
            board.legal_moves, key=lambda m: m.uci()
        )  # sorted: order-independent seeding
        board.push(rng.choice(moves))
        if board.is_game_over():
            return None
    return board.fen()


def generate_dataset(
    num_positions: int,
    *,
    split: str = "train",
    seed: int = 0,
    min_plies: int = 1,
    max_plies: int = 40,
    held_out_fraction: float = 0.1,
    prompt: str = "fen",
) -> list[dict[str, Any]]:
    """`num_positions` distinct rows ``{"prompt", "fen", "legal_moves"}``, the same for the same
    seed; `prompt` names the prompt's form in `PROMPTS`."""
    if prompt not in PROMPTS:
        raise ValueError(f"prompt must be one of {', '.join(PROMPTS)}, got {prompt!r}")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if not isinstance(num_positions, int) or num_positions < 0:
        raise ValueError(f"num_positions must be a non-negative integer, got {num_positions!r}")
    if not 0 <= min_plies <= max_plies:
        raise ValueError(f"need 0 <= min_plies <= max_plies, got {min_plies} and {max_plies}")
    rng = random.Random(f"chess/{split}/{seed}")  # str seeds hash stably across runs
    fens = draw_distinct(
        num_positions,
        lambda: _random_position(rng, rng.randint(min_plies, max_plies)),
        lambda fen: position_split(fen, held_out_fraction) == split,
        shortfall=lambda found: (
            f"num_positions={num_positions} distinct {split!r} positions could not be drawn "
            f"(found {found}); widen [min_plies, max_plies]"
        ),
    )
    rows = []
    for fen in fens:
        moves = sorted(move.uci() for move in board_from_fen(fen).legal_moves)
        rows.append(
            {"prompt": PROMPTS[prompt](fen), "fen": fen, "legal_moves": " ".join(moves)}
        )
    return rows


def breakdown(rows: Sequence[Mapping[str, Any]], completions: Sequence[str]) -> dict[str, float]:
    """Evaluation metrics of one completion per row (its ``fen`` column), means over completions:
    format_rate (one ``M:`` line), precision (the share of listed moves that are legal) and
    coverage (the share of the legal moves found), an unformatted completion counting 0 in
    both, precision_formatted (precision over the formatted completions alone) and
    distinct_rate (distinct sets of listed moves per formatted completion: 1 when every
    position gets its own list, 1 / n when one list is written everywhere); nan if none is
    formatted."""
    formatted = precision = coverage = 0.0
    lists: set[frozenset[str]] = set()
    for row, completion in zip(rows, completions, strict=True):
        moves = parse_move_list(completion)
        if moves is None:
            continue
        formatted += 1
        lists.add(frozenset(moves))
        check = check_moves(row["fen"], moves)
        precision += len(check.legal) / (len(check.legal) + len(check.illegal))
        coverage += len(check.legal) / check.num_legal
    n = len(rows)
    return {
        "format_rate": formatted / n,
        "precision": precision / n,
        "coverage": coverage / n,
        "precision_formatted": precision / formatted if formatted else float("nan"),
        "distinct_rate": len(lists) / formatted if formatted else float("nan"),
    }


def evaluate(
    generate: Callable[[list[Any]], list[str]],
    rows: Sequence[dict[str, Any]],
    config: ChessRewardConfig | None = None,
) -> dict[str, float]:
    """Run `generate` (prompts -> completions) on `rows`: the mean reward and `breakdown`."""
    prompts = [row["prompt"] for row in rows]
    completions = generate(prompts)
    if len(completions) != len(rows) or not rows:
        raise ValueError(
            f"generate returned {len(completions)} completions for {len(rows)} prompts"
        )
    rewards = make_reward(config)(prompts, completions, [row["fen"] for row in rows])
    return {
        "reward": sum(rewards) / len(rows),
        **breakdown(rows, completions),
        "num_positions": float(len(rows)),
    }
