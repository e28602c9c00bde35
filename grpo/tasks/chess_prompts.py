"""The chess task's prompts (`grpo.tasks.chess`): how a position is shown to the model.

``PROMPTS`` maps the task option ``prompt`` to a function of the FEN: the bare
``FEN: ...`` line, or chat messages (an instruction, at most one worked example,
the position) for a chat model read through its chat template. ``PROMPT_PIECE``
names the prompts that ask for one kind of piece's moves alone. Every worked
example's answer is its position's exact list of moves (the tests check each).
"""

from __future__ import annotations

from collections.abc import Callable

from grpo.rewards.chess import PIECE_KINDS, board_from_fen, own_squares, piece_types

__all__ = [
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
    "piece_list",
]

START_FEN = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"
ENDGAME_FEN = "8/8/8/4k3/8/8/8/R3K3 w Q - 0 1"
PROMPT_TEMPLATE = "FEN: {fen}\n"

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


def _instruction_for(pieces: str) -> str:
    """INSTRUCTION asking for the moves of `pieces` ("the pawns") of the side to move alone."""
    return INSTRUCTION.replace("of the side to move", f"of {pieces} of the side to move")


PAWNS_INSTRUCTION = _instruction_for("the pawns")
PAWNS_FEN = "4k3/8/7P/3pp3/4PP2/2P5/P7/6K1 w - - 0 1"
PAWNS_ANSWER = "M: a2a3 a2a4 c3c4 e4d5 f4e5 f4f5 h6h7"
# every legal pawn move of PAWNS_FEN (a double step, a blocked pawn, two captures), pawn by
# pawn in `piece_list` order (a test checks it)
KING_INSTRUCTION = _instruction_for("the king")
KING_FEN = "8/8/4k3/8/1PK5/8/8/8 w - - 0 1"
KING_ANSWER = "M: c4b3 c4b5 c4c3 c4c5 c4d3 c4d4"
# every legal king move of KING_FEN: of the eight squares next to c4, b4 holds its own pawn
# and d5 is next to the other king (a test checks it)
PIECES_FEN = "4k3/1p6/8/8/8/P1N2P2/6K1/8 w - - 0 1"
PIECES_ANSWER = (
    "M: g2f1 g2f2 g2g1 g2g3 g2h1 g2h2 g2h3 c3a2 c3a4 c3b1 c3b5 c3d1 c3d5 c3e2 c3e4 a3a4 f3f4"
)  # every legal move of PIECES_FEN, piece by piece in `piece_list` order (a test checks it)


def _fen_prompt(fen: str) -> str:
    return PROMPT_TEMPLATE.format(fen=fen)


def piece_list(fen: str) -> str:
    """The position as words a small model can copy squares from: the side to move, then its
    pieces by kind, then the other side's, squares in board order (a1, b1, ..., h8):

        White to move.
        White: king e1, queen d1, rooks a1 h1, ..., pawns a2 b2 c2 d2 f2 g2 h2 e4
        Black: king e8, ...
    """
    import chess

    board = board_from_fen(fen)
    sides = [(chess.WHITE, "White"), (chess.BLACK, "Black")]
    if board.turn == chess.BLACK:
        sides.reverse()
    lines = [f"{sides[0][1]} to move."]
    for color, name in sides:
        kinds = []
        for kind in reversed(piece_types(None)):  # king, queen, rook, bishop, knight, pawn
            squares = [chess.square_name(s) for s in sorted(board.pieces(kind, color))]
            if squares:
                word = PIECE_KINDS[kind - 1] + ("s" if len(squares) > 1 else "")
                kinds.append(f"{word} {' '.join(squares)}")
        lines.append(f"{name}: {', '.join(kinds)}")
    return "\n".join(lines)


def _pieces_prompt(fen: str) -> str:
    return f"{_fen_prompt(fen)}{piece_list(fen)}"


def _king_square_prompt(fen: str) -> str:
    """`_pieces_prompt` and a last line naming the square every king move starts on, so the
    from-square is copied from the line just before the answer: the square the square
    reward pays for (`own_squares`). The side to move must have one king (every generated
    position has)."""
    kings = own_squares(fen, "king")
    if len(kings) != 1:
        raise ValueError(f"king_square_example: the side to move needs one king in {fen!r}")
    (square,) = kings
    return f"{_pieces_prompt(fen)}\nThe king is on {square}: each of its moves starts with {square}."


def _instruction_prompt(
    fen: str, render: Callable[[str], str] = _fen_prompt, instruction: str = INSTRUCTION
) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": instruction},
        {"role": "user", "content": render(fen).strip()},
    ]


def _worked_example(
    example_fen: str,
    answer: str,
    render: Callable[[str], str] = _fen_prompt,
    instruction: str = INSTRUCTION,
) -> Callable[[str], list[dict[str, str]]]:
    def prompt(fen: str) -> list[dict[str, str]]:
        system, user = _instruction_prompt(fen, render, instruction)
        example = [
            {"role": "user", "content": render(example_fen).strip()},
            {"role": "assistant", "content": answer},
        ]
        return [system, *example, user]

    return prompt


PROMPTS: dict[str, Callable[[str], str | list[dict[str, str]]]] = {
    "fen": _fen_prompt,
    "instruction": _instruction_prompt,
    "example": _worked_example(START_FEN, EXAMPLE_ANSWER),
    "endgame_example": _worked_example(ENDGAME_FEN, ENDGAME_ANSWER),
    "pieces_example": _worked_example(PIECES_FEN, PIECES_ANSWER, _pieces_prompt),
    "pawns_example": _worked_example(PAWNS_FEN, PAWNS_ANSWER, _pieces_prompt, PAWNS_INSTRUCTION),
    "king_example": _worked_example(KING_FEN, KING_ANSWER, _pieces_prompt, KING_INSTRUCTION),
    "king_square_example": _worked_example(
        KING_FEN, KING_ANSWER, _king_square_prompt, KING_INSTRUCTION
    ),
}
"""The prompt of a position: the bare FEN line; an instruction and the FEN as chat
messages; the same with one worked example (the initial position, or a rook endgame)
before the FEN; or every position also told piece by piece (`piece_list`), with a worked
example whose moves follow its pieces in that order, so that each move's from-square can be
copied from the prompt (a king, a knight and two pawns: a list rarely legal elsewhere); or
the same asking for the pawns' moves alone, with a pawn example; or for the king's moves
alone (one from-square, named in the prompt; its moves go to the squares next to it, or two
along its rank when castling), with a king example, and the same with a last line that
names the king's square."""
PROMPT_PIECE: dict[str, str] = {
    "pawns_example": "pawn",
    "king_example": "king",
    "king_square_example": "king",
}
"""The prompts that ask for one kind of piece's moves, and that kind (`ChessRewardConfig.piece`);
the others ask for every legal move."""
