"""The shipped chess checkpoint grpo/assets/chess-tiny and its build, scripts/build_chess_model.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("chess")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import build_chess_model  # noqa: E402
import yaml  # noqa: E402

from grpo.tasks import chess  # noqa: E402
from grpo.tasks.arithmetic import greedy_completions  # noqa: E402

ASSET = REPO / "grpo" / "assets" / "chess-tiny"
# The documented warm start (docs/chess.md): the format, many legal moves, not all of them.
WARM_START_RANGE = (0.3, 0.6)
REDUCED = ["--positions", "300", "--batch-size", "8", "--lr", "1e-2", "--eval-positions", "20",
           "--threads", "1", "--shape", json.dumps({"hidden_size": 32, "intermediate_size": 64,
           "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2})]  # fmt: skip


@pytest.fixture(scope="module")
def shipped():
    """The checkpoint loaded with the plain Auto classes, and its build record."""
    torch.set_num_threads(min(2, torch.get_num_threads()))
    model = transformers.AutoModelForCausalLM.from_pretrained(ASSET)
    tokenizer = transformers.AutoTokenizer.from_pretrained(ASSET)
    return model, tokenizer, json.loads((ASSET / "build_info.json").read_text())


def _held_out(model, tokenizer, count: int) -> dict[str, float]:
    rows = build_chess_model.positions(count, "held_out", 0)
    generate = lambda p: greedy_completions(model, tokenizer, p, build_chess_model.MAX_NEW_TOKENS)  # noqa: E731
    return chess.evaluate(generate, rows)


def test_checkpoint_is_small_and_in_safetensors():
    """The shipped folder holds safetensors weights and weighs at most 5 MB."""
    files = [f for f in ASSET.iterdir() if f.is_file()]
    assert (ASSET / "model.safetensors").is_file() and not any(f.suffix == ".bin" for f in files)
    assert sum(f.stat().st_size for f in files) <= 5 * 1024 * 1024


def test_model_matches_its_build_record(shipped):
    """Parameter count, shape and vocabulary are the ones recorded at build time."""
    model, tokenizer, info = shipped
    assert model.num_parameters() == info["model"]["parameters"]
    assert model.config.num_hidden_layers == info["model"]["num_hidden_layers"]
    assert model.config.vocab_size == len(tokenizer) == info["vocab_size"]


def test_a_move_is_one_token_and_text_decodes_exactly(shipped):
    """A FEN is read a character at a time, each move (promotions too) is one token with its
    space, and decoding gives the text back unchanged."""
    _, tokenizer, _ = shipped
    prompt = chess.PROMPT_TEMPLATE.format(fen=chess.START_FEN)
    ids = tokenizer(prompt)["input_ids"]
    assert ids[0] == tokenizer.bos_token_id and len(ids) == 1 + len(prompt)
    answer = "M: e2e4 g1f3 e7e8q"
    tokens = tokenizer.convert_ids_to_tokens(tokenizer(answer, add_special_tokens=False)["input_ids"])
    assert tokens == ["M", ":", " e2e4", " g1f3", " e7e8q"]
    assert tokenizer.decode(tokenizer(prompt + answer)["input_ids"], skip_special_tokens=True) \
        == prompt + answer  # fmt: skip
    assert tokenizer.unk_token_id not in tokenizer(" ".join(build_chess_model.every_move()))["input_ids"]


def test_greedy_held_out_lists_are_a_partial_warm_start(shipped):
    """On the build's held-out positions the greedy lists are well-formed, partly legal and
    incomplete, with the task's reward in the documented range and as recorded."""
    model, tokenizer, info = shipped
    result = _held_out(model, tokenizer, info["sft"]["eval_positions"])
    assert WARM_START_RANGE[0] <= result["reward"] <= WARM_START_RANGE[1]
    assert result["reward"] == pytest.approx(info["held_out"]["reward"], abs=0.01)
    assert result["format_rate"] >= 0.95 and result["wellformed_rate"] >= 0.95
    assert 0.3 < result["precision"] < 0.9 and 0.3 < result["coverage"] < 0.9


def test_chess_config_trains_the_shipped_model_away_from_its_supervised_positions(shipped):
    """configs/chess.yaml names the shipped model, its bare prompt, and the hash range the model
    was taught from, so that GRPO's positions and the held-out ones are neither of them."""
    _, _, info = shipped
    config = yaml.safe_load((REPO / "configs" / "chess.yaml").read_text())
    options = config["task"]["options"]
    assert config["model"]["path"] == "grpo/assets/chess-tiny" and options["prompt"] == "fen"
    assert options["supervised_fraction"] == info["task"]["supervised_fraction"] \
        == build_chess_model.SUPERVISED_FRACTION  # fmt: skip
    train = chess.generate_dataset(20, split="train", seed=0, max_plies=10,
                                   supervised_fraction=options["supervised_fraction"])  # fmt: skip
    assert {chess.position_split(r["fen"], 0.1, options["supervised_fraction"]) for r in train} \
        == {"train"}  # fmt: skip


def test_a_reduced_build_is_deterministic_and_learns_the_format(tmp_path):
    """Built twice from one seed, the weights are byte for byte the same; 150 steps of a
    one-layer model write one `M:` line of well-formed moves everywhere, some legal (reward
    above the -0.5 of a list of illegal moves, below the shipped model's range), and the
    saved model scores what its record says."""
    first, second = tmp_path / "a", tmp_path / "b"
    for out in (first, second):
        build_chess_model.main(["--out", str(out), "--steps", "20", *REDUCED])
    assert (first / "model.safetensors").read_bytes() == (second / "model.safetensors").read_bytes()
    info = build_chess_model.main(["--out", str(first), "--steps", "150", *REDUCED])
    held = info["held_out"]
    assert held["format_rate"] == 1.0 and held["wellformed_rate"] == 1.0
    assert -0.5 < held["reward"] < WARM_START_RANGE[0] and held["precision"] > 0
    model = transformers.AutoModelForCausalLM.from_pretrained(first)
    tokenizer = transformers.AutoTokenizer.from_pretrained(first)
    # the record keeps four decimals
    assert _held_out(model, tokenizer, 20)["reward"] == pytest.approx(held["reward"], abs=5e-5)
