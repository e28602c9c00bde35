"""Tests for grpo.tasks.chess: the move-listing reward, dataset and evaluation (the chess loop)."""

import math

import pytest

pytest.importorskip("chess")

from grpo.rewards.chess import board_from_fen, legal_moves  # noqa: E402
from grpo.tasks.chess import (  # noqa: E402
    ENDGAME_ANSWER,
    ENDGAME_FEN,
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
    PROMPTS,
    START_FEN,
    ChessRewardConfig,
    breakdown,
    evaluate,
    generate_dataset,
    make_reward,
    own_square_share,
    parse_move_list,
    piece_list,
    position_split,
    reach_share,
    reward,
    score_completion,
    wellformed_share,
)

AFTER_E4 = "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1"
PROMOTION = "7k/P7/8/8/8/8/8/K7 w - - 0 1"  # 7 legal moves: a1a2 a1b1 a1b2 a7a8{q,r,b,n}
ALL_START = "M: " + " ".join(sorted(legal_moves(START_FEN)))


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("M: e2e4 d2d4", 2 / 20),  # 2 of 20 legal moves, nothing illegal
        (ALL_START, 1.0),  # every legal move
        ("  " + ALL_START + "\n", 1.0),  # surrounding whitespace is fine
        (ALL_START + " zz", 1.0 - 0.5 * 1 / 21),  # one malformed move among 21 listed
        ("M: e2e4 e2e4 e7e5", 1 / 20 - 0.5 * 1 / 2),  # the repeat is ignored; e7e5 is black's
        ("M: e7e5 a1a8", 0.0 - 0.5 * 2 / 2),  # all illegal
        ("e2e4 d2d4", -1.0),  # no "M:" prefix
        ("M:", -1.0),  # no moves
        ("M: e2e4\nM: d2d4", -1.0),  # more than one line
    ],
)
def test_reward_on_hand_made_answers(completion, expected):
    """Exact reward: coverage - 0.5 * illegal share, or -1 for a broken format."""
    assert score_completion(START_FEN, completion) == pytest.approx(expected, rel=1e-9)


def test_reward_callable_and_config():
    """The reward reads the fen column; the penalties come from the config."""
    completions = ["M: a7a8q a7a8n a1b1", "M: a7a8q h1h2", "nothing"]
    assert reward([""] * 3, completions, [PROMOTION] * 3) == pytest.approx(
        [3 / 7, 1 / 7 - 0.5 / 2, -1.0]
    )
    harsh = make_reward(ChessRewardConfig(illegal_penalty=2.0, format_penalty=0.25))
    assert harsh([""] * 2, completions[1:], [PROMOTION] * 2) == pytest.approx([1 / 7 - 1.0, -0.25])
    with pytest.raises(ValueError, match="illegal_penalty"):
        ChessRewardConfig(illegal_penalty=-1)


def test_parse_move_list():
    """Only one 'M:' line with at least one move parses."""
    assert parse_move_list(" M: e2e4  d2d4 ") == ["e2e4", "d2d4"]
    assert parse_move_list("M:e2e4") is None and parse_move_list("moves: e2e4") is None


def test_dataset_is_seeded_and_splits_are_disjoint():
    """Same seed, same rows; stored legal moves match python-chess; train and held-out never share a FEN."""
    first = generate_dataset(12, seed=3, max_plies=12)
    assert first == generate_dataset(12, seed=3, max_plies=12)
    assert first != generate_dataset(12, seed=4, max_plies=12)
    held_out = generate_dataset(12, split="held_out", seed=3, max_plies=12)
    assert not {r["fen"] for r in first} & {r["fen"] for r in held_out}
    for row in first:
        assert row["prompt"] == f"FEN: {row['fen']}\n"
        assert set(row["legal_moves"].split()) == legal_moves(row["fen"])
    assert len({r["fen"] for r in first}) == 12


def test_supervised_positions_are_apart_from_train_and_held_out():
    """With supervised_fraction, "supervised" rows lie in their own hash range and the "train"
    split no longer holds any of them; held-out rows are the same with or without it."""
    from grpo.tasks import hash_split

    # crc32 % 10000 of "a7", "b3", "e4": 102, 4924, 5880; held out below 1000, supervised
    # below 1000 + 4500, train above; without a supervised share, "b3" trains
    assert [hash_split(t, 0.1, 0.45) for t in ("a7", "b3", "e4")] == [
        "held_out", "supervised", "train"
    ]  # fmt: skip
    assert hash_split("b3", 0.1) == "train" and hash_split("e4", 0.1, 0.49) == "supervised"
    kept = dict(seed=5, max_plies=12, supervised_fraction=0.45)
    supervised = generate_dataset(30, split="supervised", **kept)
    train = generate_dataset(30, split="train", **kept)
    assert {position_split(r["fen"], 0.1, 0.45) for r in supervised} == {"supervised"}
    assert {position_split(r["fen"], 0.1, 0.45) for r in train} == {"train"}
    assert not {r["fen"] for r in supervised} & {r["fen"] for r in train}
    held = generate_dataset(10, split="held_out", seed=0, max_plies=12)
    assert held == generate_dataset(10, split="held_out", seed=0, max_plies=12,
                                    supervised_fraction=0.45)  # fmt: skip
    with pytest.raises(ValueError, match="split 'supervised' needs supervised_fraction > 0"):
        generate_dataset(3, split="supervised", seed=0)
    with pytest.raises(ValueError, match="held_out_fraction \\+ supervised_fraction < 1"):
        generate_dataset(3, seed=0, supervised_fraction=0.9)


def test_evaluate_oracle_and_garbage():
    """An oracle listing every legal move scores 1 everywhere; garbage scores -1 and format 0."""
    rows = generate_dataset(5, seed=0, max_plies=10)
    by_prompt = {r["prompt"]: "M: " + r["legal_moves"] for r in rows}
    perfect = evaluate(lambda ps: [by_prompt[p] for p in ps], rows)
    # each position's full list checked on the next position: the share legal there too
    moves = [legal_moves(r["fen"]) for r in rows]
    elsewhere = sum(len(m & moves[(i + 1) % 5]) / len(m) for i, m in enumerate(moves)) / 5
    assert 0 < elsewhere < 1
    # castling, the one legal move outside a king's reach, is legal in none of these
    boards = [board_from_fen(r["fen"]) for r in rows]
    assert not any(board.is_castling(m) for board in boards for m in board.legal_moves)
    assert perfect == {
        "reward": 1.0,
        "format_rate": 1.0,
        "precision": 1.0,
        "precision_elsewhere": pytest.approx(elsewhere, rel=1e-12),
        "coverage": 1.0,
        "own_square_rate": 1.0,
        "reach_rate": 1.0,
        "wellformed_rate": 1.0,
        "precision_formatted": 1.0,
        "distinct_rate": 1.0,
        "num_positions": 5.0,
    }
    garbage = evaluate(lambda ps: ["I don't know"] * len(ps), rows)
    assert garbage["reward"] == -1.0 and garbage["format_rate"] == 0.0
    assert math.isnan(garbage["precision_formatted"]) and math.isnan(garbage["distinct_rate"])


def test_breakdown_on_hand_made_answers():
    """Means over completions, an unformatted one counting 0; precision_formatted skips it;
    distinct_rate counts sets of moves (order and repeats aside) per formatted completion."""
    rows = [{"fen": START_FEN}, {"fen": PROMOTION}, {"fen": START_FEN}, {"fen": PROMOTION}]
    completions = ["M: e2e4 d2d4 e2e4 zz", "M: a7a8q a1a2 a1b1 a1b2", "e2e4",
                   "M: a1b2 a1b1 a7a8q a1a2 a1a2"]  # fmt: skip
    # start: 2 distinct legal of 20, 1 illegal listed (the repeat is neither): precision 2/3
    # promotion: 4 legal of 7, nothing illegal: precision 1 (twice, the same set of moves)
    # elsewhere: each list on the other position is all illegal
    assert breakdown(rows, completions) == pytest.approx(
        {
            "format_rate": 3 / 4,
            "precision": (2 / 3 + 1 + 1) / 4,
            "precision_elsewhere": 0.0,
            # distinct moves from a square of the side to move: e2 and d2 but not "zz"; all
            "own_square_rate": (2 / 3 + 1 + 1) / 4,
            # e2e4 d2d4 pawn pushes; a1a2 a1b1 a1b2 king steps; a7a8q a push: all of
            # own_square_rate's
            "reach_rate": (2 / 3 + 1 + 1) / 4,
            # distinct well-formed entries: all but "zz"
            "wellformed_rate": (2 / 3 + 1 + 1) / 4,
            "coverage": (2 / 20 + 4 / 7 + 4 / 7) / 4,
            "precision_formatted": (2 / 3 + 1 + 1) / 3,
            "distinct_rate": 2 / 3,
        },
        rel=1e-12,
    )
    # each position's completions repeated (several samples per position): a list is checked
    # on the next different position, never on its own
    rows = [{"fen": START_FEN}] * 2 + [{"fen": AFTER_E4}] * 2
    repeated = breakdown(rows, ["M: e2e4"] * 2 + ["M: e7e5"] * 2)
    assert repeated["precision"] == 1.0 and repeated["precision_elsewhere"] == 0.0
    assert math.isnan(breakdown([{"fen": START_FEN}] * 2, ["M: e2e4"] * 2)["precision_elsewhere"])
    # one list written everywhere is as legal on the next position as on its own
    same = breakdown([{"fen": START_FEN}, {"fen": AFTER_E4}], ["M: g8f6 b1c3 e2e4"] * 2)
    assert same["precision_elsewhere"] == pytest.approx(same["precision"], rel=1e-12)
    assert same["precision"] == pytest.approx((2 / 3 + 1 / 3) / 2, rel=1e-12)


def test_piece_list_names_the_side_to_move_first():
    """Pieces by kind and square in board order, the side to move's first; the
    'pieces_example' prompt renders the example and the position the same way."""
    assert piece_list(AFTER_E4) == (
        "Black to move.\n"
        "Black: king e8, queen d8, rooks a8 h8, bishops c8 f8, knights b8 g8, "
        "pawns a7 b7 c7 d7 e7 f7 g7 h7\n"
        "White: king e1, queen d1, rooks a1 h1, bishops c1 f1, knights b1 g1, "
        "pawns a2 b2 c2 d2 f2 g2 h2 e4"
    )
    assert piece_list(ENDGAME_FEN) == "White to move.\nWhite: king e1, rook a1\nBlack: king e5"
    system, example, answer, user = PROMPTS["pieces_example"](AFTER_E4)
    assert system["content"] == INSTRUCTION and answer["content"] == PIECES_ANSWER
    assert example["content"] == f"FEN: {PIECES_FEN}\n{piece_list(PIECES_FEN)}"
    assert piece_list(PIECES_FEN).splitlines()[1] == "White: king g2, knight c3, pawns a3 f3"
    listed = PIECES_ANSWER.removeprefix("M: ").split()
    assert sorted(listed) == sorted(legal_moves(PIECES_FEN))  # every legal move, once
    from_squares = [move[:2] for move in listed]  # grouped by piece, in the listing's order
    assert list(dict.fromkeys(from_squares)) == ["g2", "c3", "a3", "f3"]
    assert user["content"] == f"FEN: {AFTER_E4}\n{piece_list(AFTER_E4)}"


def test_pawns_prompt_asks_for_and_scores_pawn_moves_alone():
    """'pawns_example' asks for the pawns' moves with a pawn example (every legal pawn move of
    its position, pawn by pawn); its rows hold pawn moves alone, never none; with piece='pawn'
    the reward and the breakdown count a legal knight move as illegal."""
    system, example, answer, user = PROMPTS["pawns_example"](AFTER_E4)
    assert system["content"] == PAWNS_INSTRUCTION != INSTRUCTION and "pawns" in PAWNS_INSTRUCTION
    assert example["content"] == f"FEN: {PAWNS_FEN}\n{piece_list(PAWNS_FEN)}"
    assert answer["content"] == PAWNS_ANSWER and user["content"].endswith(piece_list(AFTER_E4))
    listed = PAWNS_ANSWER.removeprefix("M: ").split()
    assert sorted(listed) == sorted(legal_moves(PAWNS_FEN, "pawn"))
    assert piece_list(PAWNS_FEN).splitlines()[1] == "White: king g1, pawns a2 c3 e4 f4 h6"
    assert list(dict.fromkeys(m[:2] for m in listed)) == ["a2", "c3", "e4", "f4", "h6"]
    rows = generate_dataset(30, seed=2, prompt="pawns_example")
    for row in rows:
        assert row["legal_moves"].split() == sorted(legal_moves(row["fen"], "pawn")) != []
    pawns = ChessRewardConfig(piece="pawn")
    # start: 1 of 16 pawn moves found, the knight move and a made-up one illegal
    assert score_completion(START_FEN, "M: e2e4 g1f3 e2e5", pawns) == pytest.approx(
        1 / 16 - 0.5 * 2 / 3, rel=1e-12
    )
    assert score_completion(START_FEN, "M: e2e4 g1f3 e2e5") == pytest.approx(
        2 / 20 - 0.5 * 1 / 3, rel=1e-12
    )
    both = breakdown([{"fen": START_FEN}, {"fen": AFTER_E4}], ["M: e2e4 g1f3", "M: e7e5"], "pawn")
    assert both["precision"] == pytest.approx((1 / 2 + 1) / 2, rel=1e-12)
    assert both["coverage"] == pytest.approx((1 / 16 + 1 / 16) / 2, rel=1e-12)
    assert both["precision_elsewhere"] == 0.0  # e2e4 is not Black's; e7e5 is not White's
    assert both["own_square_rate"] == pytest.approx((1 / 2 + 1) / 2, rel=1e-12)  # g1: a knight
    # well-formed moves only: "e2zz" and "e2" start on e2 but earn no square share
    assert own_square_share(START_FEN, ["e2zz", "e2", "e2e4", "g1f3"], "pawn") == 1 / 4
    # square_weight adds its share of distinct moves from a pawn's square (e2 twice, not g1)
    squares = ChessRewardConfig(piece="pawn", square_weight=0.25)
    assert score_completion(START_FEN, "M: e2e4 g1f3 e2e5 e2e5", squares) == pytest.approx(
        1 / 16 - 0.5 * 3 / 4 + 0.25 * 2 / 3, rel=1e-12
    )
    with pytest.raises(ValueError, match="piece must be one of pawn"):
        ChessRewardConfig(piece="pawns")


def test_king_prompt_asks_for_and_scores_the_kings_moves_alone():
    """'king_example' asks for the king's moves with a king example (every legal king move of
    its position: the squares next to c4 but b4, its own pawn, and d5, next to the other
    king); its rows hold king moves alone, never none; with piece='king' a legal pawn move
    counts as illegal, and a list is checked against another position's king."""
    system, example, answer, user = PROMPTS["king_example"](AFTER_E4)
    assert system["content"] == KING_INSTRUCTION and "of the king of the side" in KING_INSTRUCTION
    assert example["content"] == f"FEN: {KING_FEN}\n{piece_list(KING_FEN)}"
    assert answer["content"] == KING_ANSWER and user["content"].endswith(piece_list(AFTER_E4))
    assert piece_list(KING_FEN).splitlines()[1] == "White: king c4, pawn b4"
    listed = KING_ANSWER.removeprefix("M: ").split()
    assert listed == sorted(legal_moves(KING_FEN, "king"))
    assert {"c4b4", "c4d5"}.isdisjoint(listed) and len(listed) == 6
    rows = generate_dataset(30, seed=2, prompt="king_example")
    for row in rows:
        assert row["legal_moves"].split() == sorted(legal_moves(row["fen"], "king")) != []
    king = ChessRewardConfig(piece="king")
    # the king example's own position: its list scores 1; a pawn move there is not asked for
    assert score_completion(KING_FEN, KING_ANSWER, king) == 1.0
    assert score_completion(KING_FEN, "M: c4c5 b4b5", king) == pytest.approx(
        1 / 6 - 0.5 * 1 / 2, rel=1e-12
    )
    after_e4_e5 = "rnbqkbnr/pppp1ppp/8/4p3/4P3/8/PPPP1PPP/RNBQKBNR w KQkq - 0 2"
    both = breakdown([{"fen": after_e4_e5}, {"fen": KING_FEN}], ["M: e1e2", KING_ANSWER], "king")
    assert both["precision"] == 1.0 and both["coverage"] == 1.0  # e1e2 is the only one
    assert both["precision_elsewhere"] == 0.0  # neither king stands on the other's square
    assert both["own_square_rate"] == 1.0
    assert both["reach_rate"] == 1.0  # e1e2 and every move of the example: one king step


def test_reach_weight_pays_for_the_kings_rule_of_movement():
    """reach_share counts distinct well-formed moves from the king's square that end one king
    step away, legal or not: after 1. e4 e5 the king on e1 has one legal move, e1e2; e1d1
    (its queen stands there) follows the rule, e1e3 does not, g1f3 is not the king's.
    reach_weight adds its share; the repeat of e1e2 counts once."""
    after_e4_e5 = "rnbqkbnr/pppp1ppp/8/4p3/4P3/8/PPPP1PPP/RNBQKBNR w KQkq - 0 2"
    moves = ["e1e2", "e1e3", "e1d1", "g1f3", "e1e2"]
    assert own_square_share(after_e4_e5, moves, "king") == 3 / 4
    assert reach_share(after_e4_e5, moves, "king") == 2 / 4
    assert reach_share(after_e4_e5, moves) == 3 / 4  # all pieces: g1f3 is a knight's jump
    # malformed ("e1e2x", "e1", "e1e9") and from an empty square (e2e3): none
    assert reach_share(after_e4_e5, ["e1e2x", "e1", "e1e9", "e2e3", "e1f2"], "king") == 1 / 5
    config = ChessRewardConfig(piece="king", reach_weight=0.25)
    text = "M: " + " ".join(moves)
    # coverage 1/1, illegal e1e3 e1d1 g1f3 of 4 distinct, reach 2/4
    assert score_completion(after_e4_e5, text, config) == pytest.approx(
        1 - 0.5 * 3 / 4 + 0.25 * 2 / 4, rel=1e-12
    )
    metrics = breakdown([{"fen": after_e4_e5}, {"fen": AFTER_E4}], [text, "M: e1e2"], "king")
    assert metrics["reach_rate"] == pytest.approx((2 / 4 + 0) / 2, rel=1e-12)  # e1e2: not Black's
    with pytest.raises(ValueError, match="reach_weight must be a number >= 0, got -1"):
        ChessRewardConfig(reach_weight=-1)


def test_king_square_prompt_names_the_from_square_last():
    """'king_square_example' is 'king_example' with one more line after each piece list, the
    example's too: the side to move's king square, the from-square of every move asked for
    (Black's e8 after 1. e4, c4 in the example, whose answer starts each move with it)."""
    system, example, answer, user = PROMPTS["king_square_example"](AFTER_E4)
    king = PROMPTS["king_example"](AFTER_E4)
    assert system == king[0] and answer == king[2]
    last = "The king is on e8: each of its moves starts with e8."
    assert user["content"] == f"{king[3]['content']}\n{last}"
    assert example["content"].endswith("\nThe king is on c4: each of its moves starts with c4.")
    assert all(move.startswith("c4") for move in KING_ANSWER.removeprefix("M: ").split())
    assert PROMPT_PIECE["king_square_example"] == "king"
    rows = generate_dataset(10, seed=2, prompt="king_square_example")
    assert [r["legal_moves"] for r in rows] == [
        r["legal_moves"] for r in generate_dataset(10, seed=2, prompt="king_example")
    ]


def test_wellformed_weight_pays_for_separate_well_formed_moves():
    """wellformed_weight adds its share of distinct listed entries that are well-formed UCI
    moves, legal or not: one unbroken string after 'M:' earns none of it, the same moves
    spaced earn all; it is off by default and never turns a broken format into a list."""
    assert wellformed_share(["e7b3b3b3b3"]) == 0.0
    assert wellformed_share(["e2e4", "e2e4", "a1a1", "zz", "e7e8q"]) == 3 / 4  # 4 distinct
    king = ChessRewardConfig(piece="king", wellformed_weight=0.25)
    unbroken = "M: c4b3c4b5c4c3"
    spaced = "M: c4b3 c4b5 c4c3"
    assert score_completion(KING_FEN, unbroken, king) == -0.5  # one malformed, illegal entry
    assert score_completion(KING_FEN, spaced, king) == pytest.approx(3 / 6 + 0.25, rel=1e-12)
    # well-formed but illegal (a pawn's, a made-up one) next to a malformed entry
    assert score_completion(KING_FEN, "M: b4b5 a1a1 c4", king) == pytest.approx(
        0 - 0.5 * 1 + 0.25 * 2 / 3, rel=1e-12
    )
    assert score_completion(KING_FEN, "c4b3 c4b5", king) == -1.0  # no "M:" line
    assert score_completion(KING_FEN, spaced, ChessRewardConfig(piece="king")) == 3 / 6
    rows = [{"fen": KING_FEN}, {"fen": START_FEN}]
    assert breakdown(rows, [unbroken, "M: e2e4 e2"], "king")["wellformed_rate"] == (0 + 1 / 2) / 2
    with pytest.raises(ValueError, match="wellformed_weight must be a number >= 0"):
        ChessRewardConfig(wellformed_weight=-0.1)


def test_prompts_instruction_and_worked_example():
    """'fen' is the bare line; 'instruction' and the worked examples are chat messages ending
    with the position; each worked example lists exactly its position's legal moves."""
    fen = generate_dataset(1, seed=0)[0]["fen"]
    assert PROMPTS["fen"](fen) == f"FEN: {fen}\n"
    assert PROMPTS["instruction"](fen) == [
        {"role": "system", "content": INSTRUCTION},
        {"role": "user", "content": f"FEN: {fen}"},
    ]
    system, example, answer, user = PROMPTS["example"](fen)
    assert (system["content"], user["content"]) == (INSTRUCTION, f"FEN: {fen}")
    assert example == {"role": "user", "content": f"FEN: {START_FEN}"}
    assert answer["role"] == "assistant" and answer["content"] == ALL_START
    assert generate_dataset(3, seed=1, prompt="example")[0]["prompt"][-1]["role"] == "user"
    _, example, answer, user = PROMPTS["endgame_example"](fen)
    assert (example["content"], user["content"]) == (f"FEN: {ENDGAME_FEN}", f"FEN: {fen}")
    assert answer["content"] == "M: " + " ".join(sorted(legal_moves(ENDGAME_FEN)))
    assert "e1c1" in ENDGAME_ANSWER  # castling is a legal move to list
    with pytest.raises(ValueError, match="prompt must be one of fen, instruction, example, "
                                         "endgame_example, pieces_example, pawns_example, "
                                         "king_example, king_square_example"):  # fmt: skip
        generate_dataset(1, prompt="chat")


def test_the_held_out_statistics_docs_chess_states():
    """docs/chess.md's "200 held-out positions have A legal moves on average (L to H)" is what
    the task draws: the held-out split at its default options, 200 positions."""
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "chess.md").read_text()
    found = re.search(r"200 held-out positions have (\d+) legal\s+moves on average \((\d+) to (\d+)\)",
                      page)  # fmt: skip
    assert found, "the sentence is gone from docs/chess.md"
    counts = [len(row["legal_moves"].split()) for row in
              generate_dataset(200, split="held_out", seed=0)]  # fmt: skip
    mean, low, high = (int(x) for x in found.groups())
    assert (round(sum(counts) / len(counts)), min(counts), max(counts)) == (mean, low, high)
