"""Built-in chess task (the chess loop): list the legal moves of a position.

The prompt shows a position as a FEN; the expected completion is one line
``M: e2e4 d2d4 ...`` of moves in UCI notation, the output format of the chess loop's
model. The reward (all values exact, see `ChessRewardConfig`):

    reward = distinct legal moves listed / legal moves of the position
             - illegal_penalty * illegal / (distinct legal + illegal)

plus, when ``square_weight`` is set, ``square_weight`` times the share of distinct
listed moves that start on a square of a piece asked for (`own_square_share`),
plus, when ``reach_weight`` is set, ``reach_weight`` times the share of distinct listed
moves that start on such a square and end on one their piece reaches on an empty board
(`reach_share`),
plus, when ``wellformed_weight`` is set, ``wellformed_weight`` times the share of
distinct listed entries that are well-formed moves (`wellformed_share`),
and ``-format_penalty`` when the completion is not one ``M:`` line with at least
one move. Repeating a legal move neither earns nor costs anything. Illegal
moves include malformed ones ("zz", "e2e9").

The prompt (`PROMPTS`, the task option ``prompt``, in `grpo.tasks.chess_prompts` and
re-exported here) is the bare ``FEN: ...``
line (``"fen"``, for a model trained on that format), or chat messages for a
chat model read through its chat template: a system instruction saying what
to write (``"instruction"``), optionally followed by one worked example: the
initial position and its 20 moves (``"example"``), or a rook endgame and its 16
moves (``"endgame_example"``), a list that is rarely legal anywhere else, so that
copying the example does not pay (``docs/experiments/2026-11-chess-smollm2.md``:
with the initial position GRPO learns to copy its list into every position).
``"pieces_example"`` also tells each position piece by piece (`piece_list`) so that from-squares can be copied
from the prompt, ``"pawns_example"`` asks for the shorter list of the pawns'
moves alone and ``"king_example"`` for the king's (`PROMPT_PIECE`): every reward
and metric then counts only that kind of piece's moves as legal;
``"king_square_example"`` adds a last line naming the king's square, the from-square
of every move asked for.

Positions come from random legal play from the initial position with a seeded
RNG (a uniform number of plies in [min_plies, max_plies]); games that end
early are discarded. As in `grpo.tasks.arithmetic`, train and held-out
positions are separated by a stable hash of the FEN, not by the seed; with
``supervised_fraction`` a third hash range, the split ``"supervised"``, holds the
positions a model is taught from by supervised learning (the shipped chess model,
`scripts/build_chess_model.py`), and the ``"train"`` split for GRPO no longer
contains them.

Departures from the chess loop: the chess loop used an existing reward function it did not
define; the formula above is this library's, chosen so that an empty or
made-up list never beats listing a few true moves. The chess loop's model had
learnt the ``M:`` format before GRPO, as the shipped chess model
(``grpo/assets/chess-tiny``) has; the chat prompts let a general chat model be
asked for it instead.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from grpo.rewards.chess import (
    check_moves,
    legal_moves,
    own_squares,
    piece_types,
    reach,
    score_by_position,
)
from grpo.tasks import draw_distinct, hash_split
from grpo.tasks.chess_prompts import (
    ENDGAME_ANSWER,
    ENDGAME_FEN,
    EXAMPLE_ANSWER,
    INSTRUCTION,
    KING_ANSWER,
    KING_FEN,
    KING_INSTRUCTION,
    PAWNS_ANSWER,
    PAWNS_FEN,
    PAWNS_INSTRUCTION,
    PIECES_ANSWER,
    PIECES_FEN,
    PROMPT_PIECE,
    PROMPT_TEMPLATE,
    PROMPTS,
    START_FEN,
    piece_list,
)

__all__ = [
    "ChessRewardConfig",
    "ENDGAME_ANSWER",
    "ENDGAME_FEN",
    "EXAMPLE_ANSWER",
    "INSTRUCTION",
    "KING_ANSWER",
    "KING_FEN",
    "KING_INSTRUCTION",
    "PAWNS_ANSWER",
    "PAWNS_FEN",
    "PAWNS_INSTRUCTION",
    "PIECES_ANSWER",
    "PIECES_FEN",
    "PROMPTS",
    "PROMPT_PIECE",
    "PROMPT_TEMPLATE",
    "START_FEN",
    "breakdown",
    "evaluate",
    "generate_dataset",
    "make_reward",
    "own_square_share",
    "parse_move_list",
    "piece_list",
    "position_split",
    "reach_share",
    "reward",
    "score_completion",
    "wellformed_share",
]

SPLITS = ("train", "held_out", "supervised")
_MOVE_LINE = re.compile(r"M:((?:[ \t]+\S+)+)[ \t]*")
_UCI = re.compile(r"[a-h][1-8][a-h][1-8][qrbn]?")



@dataclass(frozen=True)
class ChessRewardConfig:
    """Weights of the move-listing reward."""

    illegal_penalty: float = 0.5
    """Subtracted in proportion to the share of listed moves that are illegal (>= 0)."""
    format_penalty: float = 1.0
    """Reward is -format_penalty when the completion is not one 'M: move move ...' line (>= 0)."""
    piece: str | None = None
    """Only this kind of piece's moves are asked for ("pawn", ...; `PIECE_KINDS`): the legal
    moves of other pieces count as illegal. None: every legal move."""
    square_weight: float = 0.0
    """Added times the share of distinct listed moves that start on a square holding a piece
    asked for (the side to move's, of kind `piece` when set), legal or not: a reward for
    reading the position from the prompt (>= 0; 0: off)."""
    reach_weight: float = 0.0
    """Added times the share of distinct listed moves that start on a square holding a piece
    asked for and end on a square that piece reaches from there on an empty board (a king's
    neighbours, a knight's jumps; `grpo.rewards.chess.reach`), legal or not: a reward for the
    piece's rule of movement, blockers, checks and castling aside (>= 0; 0: off)."""
    wellformed_weight: float = 0.0
    """Added times the share of distinct listed entries that are well-formed UCI moves
    (``e2e4``, ``e7e8q``), legal or not: a format reward for a list of separate moves, for a
    model that writes one unbroken string after ``M:`` (>= 0; 0: off)."""

    def __post_init__(self) -> None:
        piece_types(self.piece)  # ValueError naming the choices
        for name in (
            "illegal_penalty",
            "format_penalty",
            "square_weight",
            "reach_weight",
            "wellformed_weight",
        ):
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
    check = check_moves(fen, moves, config.piece)
    illegal_share = len(check.illegal) / (len(check.legal) + len(check.illegal))
    value = check.coverage - config.illegal_penalty * illegal_share
    if config.square_weight:
        value += config.square_weight * own_square_share(fen, moves, config.piece)
    if config.reach_weight:
        value += config.reach_weight * reach_share(fen, moves, config.piece)
    if config.wellformed_weight:
        value += config.wellformed_weight * wellformed_share(moves)
    return value


def _share(moves: Sequence[str], keep: Callable[[str], bool]) -> float:
    """The share of the distinct `moves` (at least one) that `keep` accepts."""
    distinct = set(moves)
    return sum(keep(m) for m in distinct) / len(distinct)


def _wellformed(move: str) -> bool:
    return bool(_UCI.fullmatch(move))


def wellformed_share(moves: Sequence[str]) -> float:
    """The share of the distinct `moves` that are well-formed UCI (``e2e4``, ``e7e8q``)."""
    return _share(moves, _wellformed)


def own_square_share(fen: str, moves: Sequence[str], piece: str | None = None) -> float:
    """The share of the distinct `moves` that are well-formed UCI (``e2e4``, ``e7e8q``) and start
    on a square of a piece asked for: the side to move's (of kind `piece` when set), legal or
    not."""
    squares = own_squares(fen, piece)
    return _share(moves, lambda m: _wellformed(m) and m[:2] in squares)


def reach_share(fen: str, moves: Sequence[str], piece: str | None = None) -> float:
    """The share of the distinct `moves` that `own_square_share` counts and that end on a square
    their piece reaches from its square on an empty board (`grpo.rewards.chess.reach`): moves
    that follow the piece's rule of movement, legal or not (a promotion letter is not
    checked)."""
    listed = {m[:2] for m in moves if _wellformed(m)} & own_squares(fen, piece)
    reaches = {square: reach(fen, square) for square in listed}  # the listed from-squares only
    return _share(moves, lambda m: _wellformed(m) and m[2:4] in reaches.get(m[:2], ()))


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


def position_split(
    fen: str, held_out_fraction: float = 0.1, supervised_fraction: float = 0.0
) -> str:
    """``"held_out"``, ``"supervised"`` or ``"train"``: a stable hash of the FEN decides, not a
    seed (`grpo.tasks.hash_split`)."""
    return hash_split(fen, held_out_fraction, supervised_fraction)


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
    supervised_fraction: float = 0.0,
    prompt: str = "fen",
) -> list[dict[str, Any]]:
    """`num_positions` distinct rows ``{"prompt", "fen", "legal_moves"}`` of `split` ("train",
    "held_out" or "supervised": `position_split`), the same for the same seed; `prompt` names
    the prompt's form in `PROMPTS`. For a prompt asking for one kind of piece's moves
    (`PROMPT_PIECE`), `legal_moves` holds that kind's and positions where it has none are
    skipped."""
    if prompt not in PROMPTS:
        raise ValueError(f"prompt must be one of {', '.join(PROMPTS)}, got {prompt!r}")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if not isinstance(num_positions, int) or num_positions < 0:
        raise ValueError(f"num_positions must be a non-negative integer, got {num_positions!r}")
    if not (supervised_fraction >= 0 and held_out_fraction + supervised_fraction < 1):
        raise ValueError(
            "need supervised_fraction >= 0 and held_out_fraction + supervised_fraction < 1, got "
            f"{supervised_fraction!r} and {held_out_fraction!r}"
        )
    if split == "supervised" and not supervised_fraction:
        raise ValueError("split 'supervised' needs supervised_fraction > 0, got 0")
    if not 0 <= min_plies <= max_plies:
        raise ValueError(f"need 0 <= min_plies <= max_plies, got {min_plies} and {max_plies}")
    piece = PROMPT_PIECE.get(prompt)
    rng = random.Random(f"chess/{split}/{seed}")  # str seeds hash stably across runs
    fens = draw_distinct(
        num_positions,
        lambda: _random_position(rng, rng.randint(min_plies, max_plies)),
        lambda fen: position_split(fen, held_out_fraction, supervised_fraction) == split
        and (piece is None or bool(legal_moves(fen, piece))),
        shortfall=lambda found: (
            f"num_positions={num_positions} distinct {split!r} positions could not be drawn "
            f"(found {found}); widen [min_plies, max_plies]"
        ),
    )
    rows = []
    for fen in fens:
        moves = sorted(legal_moves(fen, piece))
        rows.append(
            {"prompt": PROMPTS[prompt](fen), "fen": fen, "legal_moves": " ".join(moves)}
        )
    return rows


def breakdown(
    rows: Sequence[Mapping[str, Any]], completions: Sequence[str], piece: str | None = None
) -> dict[str, float]:
    """Evaluation metrics of one completion per row (its ``fen`` column), means over completions:
    format_rate (one ``M:`` line), precision (the share of listed moves that are legal) and
    coverage (the share of the legal moves found), an unformatted completion counting 0 in
    both, precision_formatted (precision over the formatted completions alone) and
    distinct_rate (distinct sets of listed moves per formatted completion: 1 when every
    position gets its own list, 1 / n when one list is written everywhere); nan if none is
    formatted. precision_elsewhere is precision with each list checked against the next
    different position of `rows` (the last against the first): a list written without reading
    the position is about as legal there as on its own, so precision - precision_elsewhere is
    what reading it earns (nan for one position). own_square_rate is `own_square_share`:
    distinct listed moves starting on a square of a piece asked for; wellformed_rate is
    `wellformed_share`, distinct listed entries that are well-formed moves; reach_rate is
    `reach_share`, distinct listed moves that own_square_rate counts and that end where their
    piece reaches on an empty board. With `piece`, only that
    kind of piece's moves are legal and its squares count (as in the reward)."""
    formatted = precision = coverage = elsewhere = own = reached = wellformed = 0.0
    lists: set[frozenset[str]] = set()
    n = len(rows)
    positions = list(dict.fromkeys(row["fen"] for row in rows))  # rows may repeat a position
    after = {fen: positions[(j + 1) % len(positions)] for j, fen in enumerate(positions)}
    for row, completion in zip(rows, completions, strict=True):
        moves = parse_move_list(completion)
        if moves is None:
            continue
        formatted += 1
        lists.add(frozenset(moves))
        check = check_moves(row["fen"], moves, piece)
        precision += check.precision
        coverage += check.coverage
        own += own_square_share(row["fen"], moves, piece)
        reached += reach_share(row["fen"], moves, piece)
        wellformed += wellformed_share(moves)
        other = check_moves(after[row["fen"]], moves, piece)
        elsewhere += other.precision
    return {
        "format_rate": formatted / n,
        "precision": precision / n,
        "precision_elsewhere": elsewhere / n if len(positions) > 1 else float("nan"),
        "coverage": coverage / n,
        "own_square_rate": own / n,
        "reach_rate": reached / n,
        "wellformed_rate": wellformed / n,
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
        **breakdown(rows, completions, (config or ChessRewardConfig()).piece),
        "num_positions": float(len(rows)),
    }
