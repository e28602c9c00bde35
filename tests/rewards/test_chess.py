"""Tests for grpo.rewards.chess: move legality with python-chess."""

import pytest

pytest.importorskip("chess")

from grpo.rewards.chess import (  # noqa: E402
    MoveCheck,
    check_moves,
    legal_move_reward,
    legal_moves,
    own_squares,
    reach,
)

START = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"
# White king a1, white pawn a7 (promotes), black king h8: hand-countable moves.
PROMOTION = "7k/P7/8/8/8/8/8/K7 w - - 0 1"


def test_start_position_has_twenty_moves():
    """The initial position has exactly 20 legal moves: 16 pawn moves and 4 knight moves."""
    moves = legal_moves(START)
    assert len(moves) == 20
    assert {"e2e4", "g1f3", "a2a3"} <= moves and "e2e5" not in moves


def test_promotion_position_moves_by_hand():
    """K on a1 has a2, b1, b2; the a7 pawn promotes on a8 to q, r, b, n: 7 moves."""
    assert legal_moves(PROMOTION) == {"a1a2", "a1b1", "a1b2", "a7a8q", "a7a8r", "a7a8b", "a7a8n"}


def test_check_moves_splits_legal_illegal_repeated():
    """Distinct legal moves in order, illegal and malformed ones apart, repeats counted."""
    result = check_moves(START, ["e2e4", "e2e4", "e7e5", "zz", "d2d4"])
    assert result == MoveCheck(("e2e4", "d2d4"), ("e7e5", "zz"), 1, 20)
    assert (result.precision, result.coverage) == (2 / 4, 2 / 20)  # the repeat is neither
    assert (MoveCheck((), (), 0, 0).precision, MoveCheck((), (), 0, 0).coverage) == (0.0, 0.0)


def test_moves_of_one_kind_of_piece():
    """`piece` keeps that kind's moves: the initial position's 16 pawn and 4 knight moves; with
    `piece`, check_moves counts another kind's legal move as illegal."""
    pawns = legal_moves(START, "pawn")
    assert len(pawns) == 16 and {"a2a3", "a2a4", "h2h4"} <= pawns
    assert legal_moves(START, "knight") == {"b1a3", "b1c3", "g1f3", "g1h3"}
    assert legal_moves(PROMOTION, "pawn") == {"a7a8q", "a7a8r", "a7a8b", "a7a8n"}
    assert check_moves(START, ["e2e4", "g1f3", "e2e5"], "pawn") == MoveCheck(
        ("e2e4",), ("g1f3", "e2e5"), 0, 16
    )
    with pytest.raises(ValueError, match="piece must be one of pawn, knight"):
        legal_moves(START, "pawns")


def test_own_squares_of_the_side_to_move():
    """The side to move's squares, all kinds or one."""
    assert own_squares(PROMOTION) == {"a1", "a7"} and own_squares(PROMOTION, "pawn") == {"a7"}
    assert own_squares(START, "pawn") == {f"{file}2" for file in "abcdefgh"}
    assert len(own_squares(START)) == 16 and "e8" not in own_squares(START)


def test_reach_is_the_rule_of_movement_on_an_empty_board():
    """A piece's reach ignores blockers and checks: the e1 king reaches its five neighbours
    though its own pieces stand there (none is legal at the start); a knight its jumps, a
    pawn its pushes (two from its starting rank, one after) and its diagonals (one on the
    a-file), Black's pawns downward; a bishop its two diagonals to the edge, a rook its rank
    and file, a queen both; an empty square nothing."""
    assert reach(START, "e1") == {"d1", "d2", "e2", "f1", "f2"} and not legal_moves(START, "king")
    assert reach(START, "g1") == {"e2", "f3", "h3"}
    assert reach(START, "e2") == {"d3", "e3", "e4", "f3"}
    assert reach(START, "e7") == {"d6", "e6", "e5", "f6"}
    assert reach(START, "a2") == {"a3", "a4", "b3"}
    assert reach(START, "c1") == {"b2", "a3", "d2", "e3", "f4", "g5", "h6"}
    assert reach(START, "a1") == {f"a{rank}" for rank in "2345678"} | {f"{f}1" for f in "bcdefgh"}
    assert len(reach(START, "d1")) == 7 + 7 + 3 + 4  # d-file, first rank, two diagonals
    assert reach(START, "e4") == frozenset()
    assert reach(PROMOTION, "a7") == {"a8", "b8"} and reach(PROMOTION, "a1") == {"a2", "b1", "b2"}
    with pytest.raises(ValueError, match="square must name a square a1-h8, got 'e9'"):
        reach(START, "e9")


def test_legal_move_reward_exact():
    """1.0 for a single legal UCI move of the row's position, else 0.0."""
    scores = legal_move_reward(
        ["", "", ""], [" e2e4\n", "e2e5", "a7a8q"], [START, START, PROMOTION]
    )
    assert scores == [1.0, 0.0, 1.0]


def test_invalid_fen_is_named():
    """A malformed FEN raises ValueError quoting it."""
    with pytest.raises(ValueError, match="not a valid FEN"):
        legal_moves("not a fen")
