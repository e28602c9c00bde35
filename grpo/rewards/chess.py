"""Chess legality with python-chess (``pip install grpo[chess]``).

Building blocks for chess rewards: the legal moves of a position given as a
FEN, a check that splits a list of proposed moves into legal, illegal and
repeated ones, the squares a piece reaches with the board otherwise empty,
and a reward callable for "play one legal move" prompts.
Moves are in UCI notation (``e2e4``, ``e7e8q``), the notation the chess loop's
model writes. The listing task of the chess loop builds on these in
`grpo.tasks.chess`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from grpo.rewards.parsers import completion_text

__all__ = [
    "MoveCheck",
    "PIECE_KINDS",
    "board_from_fen",
    "check_moves",
    "legal_move_reward",
    "legal_moves",
    "own_squares",
    "piece_types",
    "reach",
    "score_by_position",
]


def _chess() -> Any:
    try:
        import chess
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError("chess rewards need python-chess: pip install 'grpo[chess]'") from error
    return chess


def board_from_fen(fen: str) -> Any:
    """A `chess.Board` for `fen`; ValueError naming the FEN when it is not a valid position."""
    chess = _chess()
    if not isinstance(fen, str):
        raise TypeError(f"fen must be a str, got {type(fen).__name__}")
    try:
        board = chess.Board(fen)
    except ValueError as error:
        raise ValueError(f"fen {fen!r} is not a valid FEN: {error}") from None
    if not board.is_valid():
        raise ValueError(f"fen {fen!r} is not a legal position ({board.status()!r})")
    return board


PIECE_KINDS = ("pawn", "knight", "bishop", "rook", "queen", "king")
"""The names a `piece` argument takes: python-chess's piece types 1-6 in order."""


def piece_types(piece: str | None) -> tuple[int, ...]:
    """python-chess's piece types for `piece`: all six for None; ValueError naming the choices
    for an unknown name."""
    if piece is None:
        return tuple(range(1, 7))
    if piece not in PIECE_KINDS:
        raise ValueError(f"piece must be one of {', '.join(PIECE_KINDS)} or None, got {piece!r}")
    return (PIECE_KINDS.index(piece) + 1,)


def legal_moves(fen: str, piece: str | None = None) -> frozenset[str]:
    """The legal moves of the position in UCI notation; with `piece` ("pawn", ...), only the
    moves of that kind of piece."""
    board, kinds = board_from_fen(fen), piece_types(piece)
    return frozenset(
        move.uci() for move in board.legal_moves if board.piece_type_at(move.from_square) in kinds
    )


def own_squares(fen: str, piece: str | None = None) -> frozenset[str]:
    """The squares ("e2", ...) holding the side to move's pieces; with `piece`, of that kind."""
    board, kinds = board_from_fen(fen), piece_types(piece)
    return frozenset(
        _chess().square_name(square) for kind in kinds for square in board.pieces(kind, board.turn)
    )


def reach(fen: str, square: str) -> frozenset[str]:
    """The squares the piece on `square` attacks or, a pawn, pushes to, all other pieces
    removed: a king's neighbours, a knight's jumps, a slider's lines to the edge, a pawn's
    diagonals (as if there were something to take) and its pushes, two from its starting
    rank. Castling is not included; an empty square reaches nothing. ValueError for a FEN that
    is not a legal position or a square that is not a1-h8."""
    chess = _chess()
    board = board_from_fen(fen)
    try:
        at = chess.parse_square(square)
    except ValueError:
        raise ValueError(f"square must name a square a1-h8, got {square!r}") from None
    piece = board.piece_at(at)
    if piece is None:
        return frozenset()
    alone = chess.BaseBoard(None)
    alone.set_piece_at(at, piece)
    targets = chess.SquareSet(alone.attacks_mask(at))
    if piece.piece_type == chess.PAWN:
        forward, start = (8, 1) if piece.color == chess.WHITE else (-8, 6)
        pushes = (1, 2) if chess.square_rank(at) == start else (1,)
        # board_from_fen rejects pawns on ranks 1 and 8: every push stays on the board
        targets |= {at + n * forward for n in pushes}
    return frozenset(chess.square_name(target) for target in targets)


class MoveCheck(NamedTuple):
    """Proposed moves sorted by legality, in order of first appearance."""

    legal: tuple[str, ...]  # distinct legal moves proposed
    illegal: tuple[str, ...]  # proposals that are not legal moves (malformed ones included)
    repeated: int  # proposals that repeat an earlier legal one
    num_legal: int  # how many legal moves the position has

    @property
    def precision(self) -> float:
        """The share of the listed moves (repeats of a legal one aside) that are legal."""
        listed = len(self.legal) + len(self.illegal)
        return len(self.legal) / listed if listed else 0.0

    @property
    def coverage(self) -> float:
        """The share of the position's legal moves listed (0 when it has none)."""
        return len(self.legal) / self.num_legal if self.num_legal else 0.0


def check_moves(fen: str, moves: Iterable[str], piece: str | None = None) -> MoveCheck:
    """Split `moves` (UCI strings) into distinct legal, illegal and repeated proposals; with
    `piece`, a legal move of another kind of piece counts as illegal (not what was asked)."""
    allowed = legal_moves(fen, piece)
    legal: list[str] = []
    illegal: list[str] = []
    repeated = 0
    for move in moves:
        if move in allowed:
            if move in legal:
                repeated += 1
            else:
                legal.append(move)
        else:
            illegal.append(move)
    return MoveCheck(tuple(legal), tuple(illegal), repeated, len(allowed))


def score_by_position(
    completions: Sequence[Any], fen: Sequence[str], score: Callable[[str, str], float]
) -> list[float]:
    """`score(fen, text)` of each completion with its row's position; the lengths must match."""
    if len(completions) != len(fen):
        raise ValueError(
            f"completions and fen must have the same length, got {len(completions)} and {len(fen)}"
        )
    return [
        score(position, completion_text(c, i))
        for i, (c, position) in enumerate(zip(completions, fen, strict=True))
    ]


def legal_move_reward(
    prompts: Sequence[Any], completions: Sequence[Any], fen: Sequence[str], **_: Any
) -> list[float]:
    """1.0 where the stripped completion is one legal UCI move for the row's `fen`, else 0.0."""
    return score_by_position(
        completions, fen, lambda position, text: float(text.strip() in legal_moves(position))
    )
