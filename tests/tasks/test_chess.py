"""Tests for grpo.tasks.chess: the move-listing reward, dataset and evaluation (seed 001)."""

import math

import pytest

pytest.importorskip("chess")

from grpo.rewards.chess import legal_moves  # noqa: E402
from grpo.tasks.chess import (  # noqa: E402
    ENDGAME_ANSWER,
    ENDGAME_FEN,
    INSTRUCTION,
    PROMPTS,
    START_FEN,
    ChessRewardConfig,
    breakdown,
    evaluate,
    generate_dataset,
    make_reward,
    parse_move_list,
    reward,
    score_completion,
)

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


def test_evaluate_oracle_and_garbage():
    """An oracle listing every legal move scores 1 everywhere; garbage scores -1 and format 0."""
    rows = generate_dataset(5, seed=0, max_plies=10)
    by_prompt = {r["prompt"]: "M: " + r["legal_moves"] for r in rows}
    perfect = evaluate(lambda ps: [by_prompt[p] for p in ps], rows)
    assert perfect == {
        "reward": 1.0,
        "format_rate": 1.0,
        "precision": 1.0,
        "coverage": 1.0,
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
    assert breakdown(rows, completions) == pytest.approx(
        {
            "format_rate": 3 / 4,
            "precision": (2 / 3 + 1 + 1) / 4,
            "coverage": (2 / 20 + 4 / 7 + 4 / 7) / 4,
            "precision_formatted": (2 / 3 + 1 + 1) / 3,
            "distinct_rate": 2 / 3,
        },
        rel=1e-12,
    )


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
                                         "endgame_example"):  # fmt: skip
        generate_dataset(1, prompt="chat")
