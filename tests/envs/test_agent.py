"""Tests for grpo.envs.agent: multi-turn rollouts and GRPO on episodes with a tiny causal LM."""

import math

import pytest
import torch
from tiny_models import CHAT_TEMPLATE, build_tiny_causal_lm, load_tiny_causal_lm, spans

from grpo.config import GRPOConfig
from grpo.envs.agent import EpisodePolicy, EpisodeReward, PolicyAgent
from grpo.envs.chat_mask import encode_chat, tokenize_with_assistant_mask
from grpo.envs.rollout import AgentOutput, collect_rollouts
from grpo.lm.policy import CausalLMPolicy, CausalLMSettings
from grpo.lm.sampling import GenerationSettings
from grpo.rewards.parsers import ParseResult
from grpo.step.trainer import GRPOTrainer
from grpo.tasks.guess_number import GuessNumberConfig, GuessNumberEnv

GAME = GuessNumberConfig(low=1, high=4, max_guesses=3)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return build_tiny_causal_lm(
        tmp_path_factory.mktemp("tiny") / "qwen2", arch="qwen2", max_positions=512
    )


def make_policy(path, seed=0):
    model, tokenizer = load_tiny_causal_lm(path)
    settings = CausalLMSettings(generation=GenerationSettings(max_new_tokens=4, seed=seed))
    return CausalLMPolicy(model, tokenizer, settings)


class SpyAgent:
    """Samples like PolicyAgent and also keeps the Completion records, in call order."""

    def __init__(self, policy):
        self.policy = policy
        self.completions = []

    def __call__(self, conversations):
        completions = [g[0] for g in self.policy.generate_actions(conversations, 1)]
        self.completions += completions
        return AgentOutput(
            [c.text for c in completions], [list(c.completion_ids) for c in completions]
        )


def test_rollout_masks_are_exactly_the_assistant_spans(model_path):
    """Sampled episodes: template masks cover each turn's content + <|end|>; sampled-id masks cover the ids."""
    policy = make_policy(model_path)
    tokenizer = policy.tokenizer
    rollouts = collect_rollouts(
        [GuessNumberEnv(s, GAME) for s in (1, 2, 3, 4)], PolicyAgent(policy), max_turns=3
    )
    for rollout in rollouts:
        tokens = tokenize_with_assistant_mask(tokenizer, rollout.messages)
        assert tokens.input_ids == encode_chat(
            tokenizer, rollout.messages
        )  # append-only: one rendering
        runs = spans(tokens.assistant_mask)
        assert len(runs) == rollout.turns
        end_id = tokenizer.convert_tokens_to_ids("<|end|>")
        for (start, stop), action in zip(runs, rollout.actions, strict=True):
            assert tokens.input_ids[start - 1] == tokenizer.convert_tokens_to_ids("<|assistant|>")
            assert tokens.input_ids[stop - 1] == end_id
            assert tokenizer.decode(tokens.input_ids[start : stop - 1]) == action
        sampled = tokenize_with_assistant_mask(
            tokenizer, rollout.messages, action_token_ids=rollout.action_token_ids
        )
        counted = [t for t, m in zip(sampled.input_ids, sampled.assistant_mask, strict=True) if m]
        assert counted == [t for ids in rollout.action_token_ids for t in ids]


def test_episode_log_probs_equal_the_sampled_turns(model_path):
    """EpisodePolicy scores each turn under the exact prompt it was sampled with; tokens laid end to end."""
    policy = make_policy(model_path)
    spy = SpyAgent(policy)
    rollouts = collect_rollouts([GuessNumberEnv(s, GAME) for s in (2, 3)], spy, max_turns=3)
    episode_policy = EpisodePolicy(policy, lambda s: GuessNumberEnv(s, GAME), max_turns=3)
    prompts, turns = [], []
    for rollout in rollouts:
        p, c = episode_policy.turn_completions(rollout)
        prompts += p
        turns += c
    # The rebuilt prompts are token for token the ones the policy sampled from.
    assert sorted((c.prompt_ids, c.completion_ids) for c in turns) == sorted(
        (c.prompt_ids, c.completion_ids) for c in spy.completions
    )
    with torch.no_grad():
        packed = episode_policy.get_token_log_probabilities([2, 3], rollouts)
        per_turn = policy.get_token_log_probabilities(prompts, turns)
    expected = _split(per_turn.logprobs, rollouts, episode_policy)
    assert packed.logprobs.shape == (2, max(len(row) for row in expected))
    for n, row in enumerate(expected):  # each episode row = its turns' counted tokens, end to end
        torch.testing.assert_close(packed.logprobs[n, : len(row)], row, rtol=1e-5, atol=1e-6)
        assert packed.completion_mask[n].tolist() == [True] * len(row) + [False] * (
            packed.logprobs.shape[1] - len(row)
        )


def _split(tensor, rollouts, episode_policy):
    out, row = [], 0
    for rollout in rollouts:
        turns = episode_policy.turn_completions(rollout)[1]
        out.append(torch.cat([tensor[row + k, : c.num_tokens] for k, c in enumerate(turns)]))
        row += len(turns)
    return out


def test_short_multi_turn_grpo_run(model_path):
    """GRPOTrainer trains on guess-the-number episodes: two steps finish with finite losses and masks."""
    torch.manual_seed(0)
    policy = make_policy(model_path)
    # A length bonus per turn (through the parser path) makes rewards differ within groups.
    episode_policy = EpisodePolicy(
        policy,
        lambda s: GuessNumberEnv(s, GAME),
        max_turns=3,
        parser=lambda t: ParseResult(t, 0.1 * len(t)),
    )
    config = GRPOConfig(
        group_size=4, batch_size=8, num_epochs_per_update=1, kl_coeff=0.04, entropy_coeff=0.0
    )
    trainer = GRPOTrainer(episode_policy, EpisodeReward(), config=config)
    before = {k: v.detach().clone() for k, v in policy.get_parameters().items()}
    for _ in range(2):
        metrics = trainer.train_step([1, 4])
        assert math.isfinite(metrics["step_loss"]) and metrics["reward/zero_std_frac"] < 1.0
    changed = any(not torch.equal(before[k], v) for k, v in policy.get_parameters().items())
    assert changed  # smoke check; the exactness is proved by the two tests above


def test_episodes_without_token_ids_are_refused(model_path):
    """Episodes played by a text-only agent cannot be trained on: the error says why."""
    policy = make_policy(model_path)
    [rollout] = collect_rollouts([GuessNumberEnv(2, GAME)], lambda convs: ["2"] * len(convs))
    with pytest.raises(ValueError, match="no sampled token ids"):
        EpisodePolicy(policy, GuessNumberEnv).get_token_log_probabilities([2], [rollout])


@torch.no_grad()
def test_conversation_scoring_matches_turn_scoring_on_aligned_episodes(model_path):
    """One-pass scoring equals per-turn scoring when every turn's prompt is a prefix of the final text."""
    policy = make_policy(model_path)
    tokenizer = policy.tokenizer
    # Episodes whose assistant turns are clean words ending in the template's own <|end|>:
    # then the sampled ids, the template's tokens and each turn's prompt all line up.
    end = tokenizer.convert_tokens_to_ids("<|end|>")
    texts = ["a b", "yes", "no c"]
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] + [end] for t in texts]
    rollouts = collect_rollouts(
        [GuessNumberEnv(3, GAME)],
        lambda convs: AgentOutput([texts[len(convs[0]) // 2]], [ids[len(convs[0]) // 2]]),
    )
    turns = EpisodePolicy(policy, GuessNumberEnv, scoring="turns").get_token_log_probabilities(
        [3], rollouts
    )
    whole = EpisodePolicy(
        policy, GuessNumberEnv, scoring="conversation"
    ).get_token_log_probabilities([3], rollouts)
    counted = whole.logprobs[whole.completion_mask]  # assistant tokens in order
    assert counted.shape[0] == sum(len(i) for i in ids) == int(turns.completion_mask.sum())
    torch.testing.assert_close(counted, turns.logprobs[turns.completion_mask], rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_conversation_scoring_matches_turn_scoring_with_text_after_the_end_of_turn(model_path):
    """A template that writes a newline after each <|end|> (as Qwen's after <|im_end|>), and a
    turn cut short without its <|end|>: one-pass scoring still puts each turn in the context
    it was sampled in, the template's closing tokens after the sampled ids, unmasked."""
    policy = make_policy(model_path)
    tokenizer = policy.tokenizer
    tokenizer.chat_template = CHAT_TEMPLATE.replace("<|end|>", "<|end|>\n")
    end = tokenizer.convert_tokens_to_ids("<|end|>")
    texts = ["a b", "yes", "no c"]
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    ids = [ids[0] + [end], ids[1], ids[2] + [end]]  # the second turn hit the token limit
    rollouts = collect_rollouts(
        [GuessNumberEnv(3, GAME)],
        lambda convs: AgentOutput([texts[len(convs[0]) // 2]], [ids[len(convs[0]) // 2]]),
    )
    turns = EpisodePolicy(policy, GuessNumberEnv).get_token_log_probabilities([3], rollouts)
    whole = EpisodePolicy(
        policy, GuessNumberEnv, scoring="conversation"
    ).get_token_log_probabilities([3], rollouts)
    counted = whole.logprobs[whole.completion_mask]
    assert counted.shape[0] == sum(len(i) for i in ids) == int(turns.completion_mask.sum())
    torch.testing.assert_close(counted, turns.logprobs[turns.completion_mask], rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_conversation_scoring_runs_micro_batches(model_path):
    """micro_batch_size conversations a pass: one at a time gives what all at once gives, the
    rows laid out to the longest conversation."""
    policy = make_policy(model_path)
    rollouts = collect_rollouts(
        [GuessNumberEnv(s, GAME) for s in (1, 2, 3, 4, 2)], PolicyAgent(policy), max_turns=3
    )
    episodes = EpisodePolicy(policy, GuessNumberEnv, scoring="conversation")
    policy.settings.micro_batch_size = 8
    whole = episodes.get_token_log_probabilities([0] * 5, rollouts)
    policy.settings.micro_batch_size = 2
    parts = episodes.get_token_log_probabilities([0] * 5, rollouts)
    assert torch.equal(parts.completion_mask, whole.completion_mask)
    torch.testing.assert_close(parts.logprobs, whole.logprobs, rtol=1e-5, atol=1e-6)


def test_conversation_scoring_trains_text_only_episodes(model_path):
    """Episodes without sampled ids can be scored in one pass; an unknown scorer name is refused."""
    policy = make_policy(model_path)
    [rollout] = collect_rollouts([GuessNumberEnv(2, GAME)], lambda convs: ["1"] * len(convs))
    episodes = EpisodePolicy(policy, GuessNumberEnv, scoring="conversation")
    out = episodes.get_token_log_probabilities([2], [rollout])
    tokens = tokenize_with_assistant_mask(policy.tokenizer, rollout.messages)
    assert int(out.completion_mask.sum()) == sum(tokens.assistant_mask)
    out.logprobs.sum().backward()
    assert any(p.grad is not None for p in policy.get_parameters().values())
    with pytest.raises(ValueError, match="scoring must be one of"):
        EpisodePolicy(policy, GuessNumberEnv, scoring="tokens")


class SayYesEnv:
    """Two turns after 'say <word>'; each reply containing 'yes' earns 0.5."""

    def __init__(self, word):
        self.word = word

    def reset(self):
        self.turn, self.score = 0, 0.0
        return f"say {self.word}"

    def step(self, action):
        self.turn += 1
        self.score += 0.5 * ("yes" in action)
        return ("again" if self.turn < 2 else None), self.turn >= 2

    def reward(self):
        return self.score


def test_multi_turn_grpo_improves_held_out_reward(tiny_lm_dir):
    """Twenty GRPO steps on two-turn episodes raise the mean reward on prompts never trained on."""
    torch.manual_seed(0)
    model, tokenizer = load_tiny_causal_lm(tiny_lm_dir("qwen2"))
    settings = CausalLMSettings(generation=GenerationSettings(max_new_tokens=3, seed=0))
    policy = CausalLMPolicy(model, tokenizer, settings)

    def held_out_reward():
        envs = [SayYesEnv(w) for w in ("blue", "green", "red", "the") for _ in range(4)]
        rollouts = collect_rollouts(envs, PolicyAgent(policy, seed=123), max_turns=2)
        return sum(r.total_reward for r in rollouts) / len(rollouts)

    before = held_out_reward()
    config = GRPOConfig(
        group_size=8, batch_size=32, num_epochs_per_update=1, kl_coeff=0.0, entropy_coeff=0.0,
        learning_rate=1e-2,
    )  # fmt: skip
    trainer = GRPOTrainer(
        EpisodePolicy(policy, SayYesEnv, max_turns=2), EpisodeReward(), config=config
    )
    for _ in range(20):
        trainer.train_step(["a", "b", "c", "d"])
    after = held_out_reward()
    assert after >= 0.4 and after > before + 0.3, (before, after)


class FewShotEnv:
    """Shows a worked example as an assistant message: the agent did not say it."""

    def reset(self):
        return [{"role": "user", "content": "1"}, {"role": "assistant", "content": "2"}]

    def step(self, action):
        return None, True

    def reward(self):
        return 0.0


def test_environment_assistant_messages_are_refused():
    """Every assistant message of an episode is scored as the agent's turn, so an environment
    that speaks as the assistant is refused by name, and a hand-built record whose assistant
    messages outnumber its actions is refused too."""
    with pytest.raises(ValueError, match=r"envs\[0\]\.reset\(\)\[1\] is an assistant message"):
        collect_rollouts([FewShotEnv()], lambda convs: ["3"] * len(convs))
    from grpo.envs.base import EpisodeRollout

    messages = ({"role": "user", "content": "1"}, {"role": "assistant", "content": "2"})
    with pytest.raises(ValueError, match="1 assistant messages for 0 actions"):
        EpisodeRollout(messages=messages, rewards=(), actions=())


def test_sampling_that_scoring_would_not_match_is_refused(model_path):
    """Overrides of temperature / top-k / top-p, a policy sampling with top-k, and truncation
    masking under one-pass scoring would train episodes as if sampled otherwise: refused."""
    policy = make_policy(model_path)
    with pytest.raises(ValueError, match="temperature would sample the episodes"):
        EpisodePolicy(policy, GuessNumberEnv, temperature=0.7)
    with pytest.raises(ValueError, match="do_sample would sample the episodes"):
        EpisodePolicy(policy, GuessNumberEnv, do_sample=False)
    EpisodePolicy(policy, GuessNumberEnv, max_new_tokens=2, temperature=1.0)  # the same one
    policy.rollout_engine.tis_cap = 2.0  # as an engine sampling otherwise than the scorer has
    with pytest.raises(ValueError, match="rollout.tis_cap asks for importance weights"):
        EpisodePolicy(policy, GuessNumberEnv)
    policy.rollout_engine.tis_cap = None
    policy.settings.generation = GenerationSettings(max_new_tokens=4, top_k=5)
    with pytest.raises(ValueError, match="samples with top_k or top_p"):
        EpisodePolicy(policy, GuessNumberEnv)
    policy.settings.generation = GenerationSettings(max_new_tokens=4)
    policy.settings.mask_truncated_completions = True
    with pytest.raises(ValueError, match="needs scoring='turns'"):
        EpisodePolicy(policy, GuessNumberEnv, scoring="conversation")


@torch.no_grad()
def test_turns_cut_at_the_token_limit_are_masked_when_asked(model_path):
    """The agent's per-turn truncation flags reach turn scoring: with
    mask_truncated_completions exactly the cut turns count no token, the others all of theirs;
    without it every turn counts. PolicyAgent reports the flags it sampled."""
    policy = make_policy(model_path)
    tokenizer = policy.tokenizer
    end = tokenizer.convert_tokens_to_ids("<|end|>")
    texts = ["1", "3", "4"]  # GuessNumberEnv(4): two wrong guesses, then the secret
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    ids = [ids[0], ids[1] + [end], ids[2]]
    cut = [True, False, True]

    def agent(conversations):
        turn = len(conversations[0]) // 2
        return AgentOutput([texts[turn]], [ids[turn]], [cut[turn]])

    [rollout] = collect_rollouts([GuessNumberEnv(4, GAME)], agent, max_turns=3)
    assert rollout.action_truncated == (True, False, True)
    for masked, counted in ((True, len(ids[1])), (False, sum(len(i) for i in ids))):
        policy.settings.mask_truncated_completions = masked
        scored = EpisodePolicy(policy, GuessNumberEnv).get_token_log_probabilities([4], [rollout])
        assert int(scored.completion_mask.sum()) == counted
    output = PolicyAgent(policy, max_new_tokens=1)([[{"role": "user", "content": "guess"}]] * 4)
    eos = set(policy.eos_token_ids)
    assert all(len(ids) == 1 for ids in output.token_ids)
    assert output.truncated == [ids[-1] not in eos for ids in output.token_ids]  # cut at 1
