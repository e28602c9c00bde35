"""TRL 1.16 set up for the gemma3 workload (configs/gemma3_math.yaml) as grpo is: its prompts
are grpo's, its frozen embedding stays as loaded, and its sampler stops at the plain stop string
and hands the reward and the loss the completion grpo's cut gives (bench/accuracy_workers.py's
`trl_trainer`, bench/trl_stops.py). On the tiny base Gemma 3 of tests/bench/conftest.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import accuracy_workers  # noqa: E402
from tiny_models import PLAIN_REPLIES  # noqa: E402

from grpo.lm.prompt_forms import PLAIN_STOP, plain_text  # noqa: E402

MAX_NEW = 32
GEMMA3_TRL = {  # TRL's GRPOConfig field -> its value for configs/gemma3_math.yaml
    "num_generations": 8, "per_device_train_batch_size": 8, "gradient_accumulation_steps": 8,
    "steps_per_generation": 8, "num_iterations": 1, "max_steps": 64, "learning_rate": 4e-6,
    "lr_scheduler_type": "constant", "beta": 0.0, "max_completion_length": 64,
    "temperature": 1.0, "top_p": 1.0, "top_k": 0, "loss_type": "dapo", "scale_rewards": "batch",
    "gradient_checkpointing": False,
}  # fmt: skip
SHORT = [plain_text([{"role": "user", "content": q}]) for q in ("say a b", "count the red")]


def gemma3_parts(model: Path, tmp_path: Path, *sets: str):
    """configs/gemma3_math.yaml on a tiny model and a few problems -> (config, grpo's parts)."""
    from grpo.cli.tasks import build_task

    overrides = ["config=configs/gemma3_math.yaml", f"model.path={model}", "task.train_size=8",
                 "task.eval_size=2", *sets]  # fmt: skip
    config = accuracy_workers.run_config(overrides, 0, str(tmp_path / "run"))
    return config, build_task(config)


def cut_after_stop(ids: list[int], tokenizer) -> int | None:
    """Reference: the fewest leading tokens whose text holds the plain stop, or None."""
    found = (k for k in range(1, len(ids) + 1) if PLAIN_STOP in tokenizer.decode(ids[:k]))
    return next(found, None)


def test_trl_gets_the_gemma3_configs_settings(answering_gemma3, tmp_path):
    """configs/gemma3_math.yaml maps to TRL's G 8 over B 8 (64 rows in 8 micro-batches of 8, one
    optimizer step per generation), 64 steps at 4e-6, beta 0, 64 new tokens at temperature 1.0
    with no top-p / top-k, the token-mean loss ("dapo"), batch-scaled rewards, no checkpointing.
    Only model.path is changed (to the tiny model), so no fetched model is read."""
    overrides = ["config=configs/gemma3_math.yaml", f"model.path={answering_gemma3}"]
    config = accuracy_workers.run_config(overrides, 0, str(tmp_path))
    trl = accuracy_workers.trl_config(config, 0, tmp_path)
    got = {key: getattr(trl, key) for key in GEMMA3_TRL}
    assert got == GEMMA3_TRL
    assert list(config.model.freeze) == ["model.embed_tokens.*"]
    assert config.task.options["prompt_form"] == "plain"


def test_trl_prompts_are_grpos_byte_for_byte(answering_gemma3, tmp_path):
    """TRL's training rows hold the very str prompts grpo's policy encodes (the plain form: no
    chat messages, so TRL applies no chat template), which TRL tokenizes to grpo's ids: one BOS,
    the text's own tokens."""
    from trl.data_utils import is_conversational

    config, parts = gemma3_parts(answering_gemma3, tmp_path)
    trainer = accuracy_workers.trl_trainer(config, parts, 0, tmp_path)
    prompts = list(trainer.train_dataset["prompt"])
    grpo_prompts = [state["prompt"] for state in parts.train_states]
    assert [p.encode() for p in prompts] == [p.encode() for p in grpo_prompts]
    assert all(p.endswith("\nAnswer:") and "Question: " in p for p in prompts)
    assert not is_conversational(trainer.train_dataset[0])
    trl_ids, _, _ = trainer._tokenize_prompts(prompts)
    assert trl_ids == parts.policy.encode_states(parts.train_states)
    bos = trainer.processing_class.bos_token_id
    assert all(ids[0] == bos and ids.count(bos) == 1 for ids in trl_ids)


@pytest.mark.parametrize("frozen", [True, False])
def test_trls_step_leaves_the_frozen_embedding_as_loaded(answering_gemma3, tmp_path, frozen):
    """With model.freeze's "model.embed_tokens.*" the tied embedding and output layer have no
    gradient and no optimizer state, and keep their bits through a TRL step that moves the other
    weights (the taught replies' format reward differs within a group); with no freeze the same
    step moves it too, so the check can fail."""
    sets = ["prompts_per_step=2", "grpo.group_size=4", "policy.micro_batch_size=8",
            "policy.generation.max_new_tokens=24", "schedule.num_steps=1",
            *([] if frozen else ["model.freeze=[]"])]  # fmt: skip
    config, parts = gemma3_parts(answering_gemma3, tmp_path, *sets)
    trainer = accuracy_workers.trl_trainer(config, parts, 0, tmp_path)
    model = trainer.model
    embedding, mlp = model.model.embed_tokens.weight, model.model.layers[0].mlp.down_proj.weight
    before = embedding.detach().clone(), mlp.detach().clone()
    assert model.lm_head.weight is embedding  # tied: one parameter
    assert embedding.requires_grad is not frozen
    trainer.train()
    assert not torch.equal(mlp, before[1])  # the step had a gradient
    assert torch.equal(embedding, before[0]) is frozen
    held = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert (id(embedding) in held) is not frozen and id(mlp) in held
    assert embedding.requires_grad is not frozen and embedding.grad is None


def test_trl_generation_stops_at_the_plain_stop_and_is_cut_as_grpo_cuts(answering_gemma3, tmp_path):
    """TRL's `generate` ends each row at the first token whose text holds "\\nQuestion:" (only
    pads after it: the taught model would write an EOS next) and the completion is the row cut
    there (no pad kept), its text a taught reply and the stop, as grpo's samples are."""
    # grpo samples the tiny model with transformers: its window is narrower than a word problem;
    # at 0.5 the taught model writes only its taught replies (at the config's 1.0 not always)
    config, parts = gemma3_parts(answering_gemma3, tmp_path, "rollout.engine=transformers",
                                 f"policy.generation.max_new_tokens={MAX_NEW}",
                                 "policy.generation.temperature=0.5")  # fmt: skip
    trainer = accuracy_workers.trl_trainer(config, parts, 0, tmp_path)
    tokenizer, generated, generate = trainer.processing_class, [], trainer.model.generate

    def recording(*args, **kwargs):
        generated.append(generate(*args, **kwargs))
        return generated[-1]

    trainer.model.generate = recording
    prompts = [p for p in [s["prompt"] for s in parts.train_states[:2]] + SHORT for _ in range(4)]
    prompt_ids, _, _ = trainer._tokenize_prompts(prompts)
    completions, _ = trainer._generate_single_turn(prompt_ids, None, {}, 4)
    [rows] = generated  # (n, prompt width + new tokens), prompts left-padded
    new = rows[:, max(len(ids) for ids in prompt_ids) :].tolist()
    assert len(new[0]) < MAX_NEW  # stopped by the stop string, not cut after the limit
    for row, ids in zip(new, completions, strict=True):
        end = cut_after_stop(row, tokenizer)
        assert set(row[end:]) <= {tokenizer.pad_token_id}  # stopped there, then padded
        assert ids == row[:end] and tokenizer.pad_token_id not in ids
    assert any(tokenizer.pad_token_id in row for row in new)  # without the cut, pads were kept
    replies = {reply + PLAIN_STOP for reply in PLAIN_REPLIES}
    assert set(tokenizer.batch_decode(completions, skip_special_tokens=True)) <= replies
    states = [*parts.train_states[:2], *SHORT]
    grpo_texts = {c.text for group in parts.policy.generate_actions(states, 4) for c in group}
    assert grpo_texts <= replies


def test_no_stop_strings_change_nothing():
    """Without stop strings (a chat-form workload) TRL gets no generation_kwargs and keeps its
    own sampler."""
    from trl_stops import generation_kwargs, stop_at_strings

    class Trainer:  # stop_at_strings must not touch it
        pass

    trainer = Trainer()
    stop_at_strings(trainer, ())
    assert generation_kwargs(()) is None and vars(trainer) == {}
    assert generation_kwargs((PLAIN_STOP,)) == {"stop_strings": [PLAIN_STOP]}
