"""Stop strings end completions exactly, in every engine that runs here, and the loss counts
nothing after them (grpo.lm.sampling.split_completion, grpo.lm.policy, grpo.lm.scoring).

The reference is independent of the cutting code: a completion sampled with a stop string is
the completion sampled without it, cut after the first token at which its decoded text holds
the stop string (greedy decoding draws the same tokens either way). The base-model Gemma 3
(`tiny_models.BASE_ARCHS`: sliding-window layers, no chat template) samples with the
transformers engine; the lean engine samples the tiny Llama here, since it refuses prompt +
completion lengths past the tiny Gemma 3's 8-token window (tests/lm/engines/test_lean.py
runs its stop string on a Gemma 3 of a wider window).
"""

import pytest
import torch
from tiny_models import load_tiny_causal_lm

from grpo.lm.engines import RolloutSettings
from grpo.lm.policy import CausalLMPolicy, CausalLMSettings
from grpo.lm.prompt_forms import PLAIN_STOP, plain_text
from grpo.lm.sampling import GenerationSettings, split_completion

QUESTIONS = ["say a b c", "count the red", "write blue green yes no", "b"]
STATES = [{"prompt": plain_text([{"role": "user", "content": q}])} for q in QUESTIONS]
MAX_NEW = 16


def greedy_policy(path, engine: str, stop_strings=()) -> CausalLMPolicy:
    model, tokenizer = load_tiny_causal_lm(path)
    generation = GenerationSettings(
        max_new_tokens=MAX_NEW, do_sample=False, stop_strings=stop_strings
    )
    return CausalLMPolicy(model, tokenizer, CausalLMSettings(generation), RolloutSettings(engine))


def written_word(ids, tokenizer) -> str:
    """The text of a word-like token the model wrote, past its first two: a stop string it
    meets (not a stray byte's replacement character)."""
    texts = [tokenizer.decode([t]) for t in ids[2:]]
    return next(text for text in texts if text.strip().isascii() and text.strip().isalpha())


def cut_after_stop(ids, stop: str, tokenizer) -> int | None:
    """Reference: the fewest leading tokens whose text holds `stop`, or None."""
    return next((k for k in range(1, len(ids) + 1) if stop in tokenizer.decode(ids[:k])), None)


def test_the_plain_stop_ends_at_the_token_that_completes_it(tiny_lm_dir):
    """Hand-built ids " a" "\\nQuestion" ":" " b" EOS: the completion is the first three pieces
    (the stop's tokens kept, as an EOS is), neither truncated nor ended by EOS; without stop
    strings it runs to the EOS."""
    _, tok = load_tiny_causal_lm(tiny_lm_dir("gemma3"))
    pieces = [tok(text, add_special_tokens=False)["input_ids"] for text in
              (" a", "\nQuestion", ":", " b")]  # fmt: skip
    ids = [t for piece in pieces for t in piece] + [tok.eos_token_id]
    kept = pieces[0] + pieces[1] + pieces[2]
    assert split_completion(ids, {tok.eos_token_id}, (PLAIN_STOP,), tok) == (kept, False, True)
    assert split_completion(ids, {tok.eos_token_id}, (), tok) == (ids, True, False)
    head = pieces[0] + pieces[1]  # "\nQuestion" without its colon does not stop
    assert split_completion(head, {tok.eos_token_id}, (PLAIN_STOP,), tok) == (head, False, False)


@pytest.mark.parametrize(("arch", "engine"), [("gemma3", "transformers"), ("llama", "lean")])
def test_a_stopped_completion_is_the_unstopped_one_cut_after_its_stop(tiny_lm_dir, arch, engine):
    """Every completion sampled with a stop string equals the one sampled without it, cut after
    the first token whose text completes the stop (or whole when it never does); a cut one is
    neither truncated nor ended by EOS, and at least one row is cut before its end."""
    path = tiny_lm_dir(arch)
    unstopped = greedy_policy(path, engine)
    free, tok = unstopped.generate_actions(STATES, 1), unstopped.tokenizer
    stop = written_word(free[0][0].completion_ids, tok)
    stopped = greedy_policy(path, engine, (stop,)).generate_actions(STATES, 1)
    cut_rows = 0
    for [whole], [cut] in zip(free, stopped, strict=True):
        k = cut_after_stop(whole.completion_ids, stop, tok)
        if k is None:
            assert cut.completion_ids == whole.completion_ids
            continue
        assert cut.completion_ids == whole.completion_ids[:k]
        assert not cut.truncated and not cut.finished_by_eos
        assert cut.text == tok.decode(whole.completion_ids[:k], skip_special_tokens=True)
        cut_rows += k < whole.num_tokens
    assert cut_rows >= 1


def test_the_loss_counts_no_token_after_the_stop(tiny_lm_dir):
    """Scored on the Gemma 3, a cut completion's mask holds exactly its own tokens, its
    log-probs are the first k of the uncut completion's (the cut tokens change nothing before
    them), and the loss's token counts are the cut lengths."""
    path = tiny_lm_dir("gemma3")
    unstopped = greedy_policy(path, "transformers")
    free = unstopped.generate_actions(STATES, 1)
    stop = written_word(free[0][0].completion_ids, unstopped.tokenizer)
    policy = greedy_policy(path, "transformers", (stop,))
    cut = [c for [c] in policy.generate_actions(STATES, 1)]
    whole = [c for [c] in free]
    assert any(c.num_tokens < w.num_tokens for c, w in zip(cut, whole, strict=True))
    with torch.no_grad():
        scored = policy.get_token_log_probabilities(STATES, cut)
        reference = policy.get_token_log_probabilities(STATES, whole)
    for n, c in enumerate(cut):
        k = c.num_tokens
        width = scored.completion_mask.shape[1]
        assert scored.completion_mask[n].tolist() == [True] * k + [False] * (width - k)
        assert scored.logprobs[n, k:].eq(0).all()
        torch.testing.assert_close(scored.logprobs[n, :k], reference.logprobs[n, :k],
                                   rtol=1e-5, atol=1e-6)  # fmt: skip
    counts = policy.loss_token_counts(STATES, cut)
    assert counts.tolist() == [c.num_tokens for c in cut]
