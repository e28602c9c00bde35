"""`task.options.prompt_form` of the word_problems and prompts tasks (grpo.cli.tasks): plain
prompts and the plain stop for a base model, the chat form refused on one by the key's name,
and the chat form's run exactly as before. The base model is the tiny Gemma 3 of
tests/tiny_models.py (sliding-window and full attention, no chat template, a BOS)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from tiny_models import build_tiny_causal_lm, teach_plain_replies

from grpo.cli import main
from grpo.cli.tasks import build_task
from grpo.lm.prompt_forms import PLAIN_STOP, plain_text
from grpo.run.config_files import load_config
from grpo.run.structured import ConfigError
from grpo.tasks.word_problems import INSTRUCTION, generate_dataset

REPO = Path(__file__).resolve().parents[2]
TINY_RUN = {
    "task.train_size": 16, "task.eval_size": 4, "prompts_per_step": 2, "grpo.group_size": 2,
    "grpo.batch_size": 4, "grpo.gradient_accumulation_steps": 1, "policy.micro_batch_size": 4,
    "policy.generation.max_new_tokens": 4, "schedule.num_steps": 1, "evaluation.every": 1,
    "evaluation.batch_size": 4, "run.threads": 1, "run.tensorboard": False,
}  # fmt: skip
MESSAGES = [{"role": "system", "content": "Add."}, {"role": "user", "content": "1+1?"}]


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory) -> Path:
    """The tiny base Gemma 3, with a context for word problems spelt mostly in bytes."""
    return build_tiny_causal_lm(tmp_path_factory.mktemp("gemma3"), "gemma3", max_positions=1024)


@pytest.fixture(scope="module")
def answering_gemma3(gemma3, tmp_path_factory) -> Path:
    """The tiny Gemma 3 taught to answer " Answer: 7" or " I do not know." and go on to the
    next question (`teach_plain_replies`): on word problems its samples end at the plain stop,
    and their format reward differs within a group."""
    return teach_plain_replies(gemma3, tmp_path_factory.mktemp("answering-gemma3"))


@pytest.fixture(scope="module")
def chat_llama(tmp_path_factory) -> Path:
    """A tiny Llama with a chat template and the same context."""
    return build_tiny_causal_lm(tmp_path_factory.mktemp("llama"), "llama", max_positions=1024)


def word_problems(tmp_path: Path, model: Path, form: str = "plain") -> str:
    path = tmp_path / "word.yaml"
    path.write_text(textwrap.dedent(f"""
        model: {{path: {model}, device: cpu, use_reference: false}}
        task: {{name: word_problems, train_size: 4, eval_size: 1, options: {{prompt_form: {form}}}}}
        prompts_per_step: 2
        grpo: {{group_size: 2, batch_size: 4, kl_coeff: 0.0}}
        policy: {{generation: {{max_new_tokens: 24}}}}
        schedule: {{num_steps: 1}}
        evaluation: {{modes: [greedy]}}
        run: {{threads: 1, dir: {tmp_path / 'run'}}}
    """))  # fmt: skip
    return str(path)


def test_plain_word_problems_train_one_grpo_step_on_a_base_gemma3(tmp_path, answering_gemma3):
    """`grpo train` on the base model: one step on plain prompts, whose samples end at the
    plain stop (not at max_new_tokens) and whose groups carry a signal, and the evaluations
    of every held-out split; the run's config.yaml records the plain form and its stop
    string, and the logged samples' prompts are the plain text (the bare split's a lone
    question) and their completions end with the stop string."""
    path = word_problems(tmp_path, answering_gemma3)
    assert main(["train", path, "--set", "prompts_per_step=2", "--set", "grpo.group_size=4",
                 "--set", "grpo.batch_size=8"]) == 0  # fmt: skip
    run = tmp_path / "run"
    recorded = yaml.safe_load((run / "config.yaml").read_text())
    assert recorded["task"]["options"]["prompt_form"] == "plain"
    assert recorded["policy"]["generation"]["stop_strings"] == [PLAIN_STOP]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    (step,) = [row for row in rows if row.get("step") == 1 and "loss/policy" in row]
    assert step["completion/truncated_frac"] < 1 and step["completion/eos_frac"] < 1
    assert step["reward/zero_std_frac"] < 1
    assert sum("eval/heldout_bare/greedy/accuracy" in row for row in rows) == 2  # before, after
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert {s["split"] for s in samples} == {"heldout_numbers", "heldout_phrasings", "heldout_bare"}
    for s in samples:
        assert s["prompt"].endswith("\nAnswer:")
        assert s["prompt"].startswith("Question: " if s["split"] == "heldout_bare" else INSTRUCTION)
        assert s["completion"].endswith(PLAIN_STOP)


def test_the_chat_form_on_a_base_model_is_refused_by_its_key(tmp_path, gemma3):
    """The default chat form on a tokenizer without a chat template: a ConfigError naming
    task.options.prompt_form and the plain form, before any prompt is encoded."""
    with pytest.raises(ConfigError, match=r"task.options.prompt_form: got chat.*allowed: plain"):
        build_task(load_config(word_problems(tmp_path, gemma3, "chat")))


def test_the_chat_form_leaves_prompts_and_stop_strings_as_they_were(tmp_path, chat_llama):
    """On a chat model the chat form's prompts are the task's messages and its generation
    settings the very object the config gave (no stop string); the plain form on the same model
    gives plain_text prompts and adds PLAIN_STOP."""
    path = word_problems(tmp_path, chat_llama, "chat")
    config = load_config(path)
    given = config.policy.generation
    parts = build_task(config)
    assert parts.policy.settings.generation is given and given.stop_strings == ()
    assert [s["prompt"] for s in parts.train_states] == [
        r["prompt"] for r in generate_dataset(4, split="train", seed=0)
    ]
    plain = build_task(load_config(path, ["task.options.prompt_form=plain"]))
    assert plain.policy.settings.generation.stop_strings == (PLAIN_STOP,)
    assert [s["prompt"] for s in plain.train_states] == [
        plain_text(s["prompt"]) for s in parts.train_states
    ]


def prompts_task(tmp_path: Path, model: Path, rows: list, **options) -> str:
    (tmp_path / "rewards.py").write_text(
        "def one(prompts, completions, **columns):\n    return [1.0] * len(completions)\n"
    )
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = {"name": "prompts", "train_file": str(tmp_path / "train.jsonl"),
            "rewards": [{"function": f"{tmp_path / 'rewards.py'}:one"}], "options": options}  # fmt: skip
    path = tmp_path / "prompts.yaml"
    path.write_text(f"model: {{path: {model}, device: cpu}}\ntask: {json.dumps(task)}\n")
    return str(path)


def test_prompts_task_writes_chat_rows_as_plain_text_for_a_base_model(tmp_path, gemma3):
    """prompt_form plain: message rows become plain_text, str rows stay, each record still
    names its line, and PLAIN_STOP joins the stop strings; the chat form with message rows is
    refused by its key, with str rows alone it loads."""
    rows = [{"prompt": MESSAGES, "answer": "2"}, {"prompt": "3+4=", "answer": "7"}]
    parts = build_task(load_config(prompts_task(tmp_path, gemma3, rows, prompt_form="plain")))
    assert [s["prompt"] for s in parts.train_states] == [plain_text(MESSAGES), "3+4="]
    assert parts.train_states[0].source.startswith("train prompts line 1 of ")
    assert parts.policy.settings.generation.stop_strings == (PLAIN_STOP,)
    with pytest.raises(ConfigError, match="task.options.prompt_form: got chat"):
        build_task(load_config(prompts_task(tmp_path, gemma3, rows)))
    build_task(load_config(prompts_task(tmp_path, gemma3, rows[1:])))


@pytest.mark.parametrize(
    ("options", "rows", "message"),
    [
        ({"prompt_form": "text"}, ["1+1="], "task.options.prompt_form: got 'text'; allowed: chat, plain"),
        ({"form": "plain"}, ["1+1="], "task.options.form: unknown option; allowed: prompt_form"),
        ({"prompt_form": "plain"}, [{"prompt": [{"role": "tool", "content": "{}"}]}],
         "train prompts line 1 of .*message 0: role 'tool' has no plain form"),
    ],
)  # fmt: skip
def test_bad_prompt_forms_are_named_before_the_model_loads(tmp_path, monkeypatch, options,
                                                           rows, message):  # fmt: skip
    """An unknown form or option, or a message the plain form cannot write, names the key (and
    the row) with no model loaded."""
    import grpo.cli.tasks

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded for a rejected config")

    monkeypatch.setattr(grpo.cli.tasks, "load_policy", no_loading)
    with pytest.raises(ConfigError, match=message):
        build_task(load_config(prompts_task(tmp_path, tmp_path, rows, **options)))


def test_one_grpo_step_of_the_gemma_config_on_a_tiny_base_model(answering_gemma3, tmp_path):
    """configs/gemma3_math.yaml at a tiny size on a tiny Gemma 3 base model: plain prompts
    ending at the stop string, one step with the embedding frozen (it leaves the step as
    loaded). The tiny model's sliding window is shorter than the prompts, which the lean
    engine refuses (its window rule), so the transformers engine samples here."""
    folder, run = answering_gemma3, tmp_path / "run"
    overrides = {**TINY_RUN, "model.path": str(folder), "run.dir": str(run),
                 "rollout.engine": "transformers", "policy.generation.max_new_tokens": 24,
                 "grpo.group_size": 4, "grpo.batch_size": 8, "policy.micro_batch_size": 8,
                 "schedule.learning_rate": 0.01}  # fmt: skip
    args = [f"{key}={value}" for key, value in overrides.items()]
    config = REPO / "configs" / "gemma3_math.yaml"
    assert main(["train", str(config), *[a for arg in args for a in ("--set", arg)]]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "reward/mean" in r] == [1]
    sample = (run / "samples.jsonl").read_text()
    assert "Question:" in sample and "Answer:" in sample
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["policy"]["generation"]["stop_strings"] == [PLAIN_STOP]
    before = load_file(folder / "model.safetensors")
    after = load_file(run / "final" / "model.safetensors")
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and "model.embed_tokens.weight" not in changed  # the step moved the rest
