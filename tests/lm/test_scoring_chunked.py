"""`chunked_output_layer`: scoring from hidden states and the output layer equals the
model's own logits path, in values and in gradients, and refuses models it cannot fold."""

import copy

import pytest
import torch
from tiny_models import ARCHS, load_tiny_causal_lm

from grpo.lm.completion import Completion
from grpo.lm.loading import LoraSettings, apply_lora
from grpo.lm.policy import CausalLMPolicy, CausalLMSettings
from grpo.lm.sampling import GenerationSettings

PROMPTS = ["red blue", "green", "yes no yes red"]


def _actions(tokenizer):
    """Ragged completions behind ragged prompts; one has tokens after its EOS."""
    eos = tokenizer.eos_token_id
    specs = [("red blue", " yes no", [eos]), ("green", " a b c d e", []), ("yes", " no", [eos])]
    out = []
    for prompt, completion, tail in specs:
        ids = tokenizer(completion)["input_ids"] + tail
        out.append(Completion(completion, ids, tokenizer(prompt)["input_ids"], False, bool(tail)))
    out.append(
        Completion("x", [eos, *tokenizer(" red")["input_ids"]], out[0].prompt_ids, False, True)
    )
    return out


def _policies(model, tokenizer, temperature=0.7):
    """The same weights under the plain and the folded scoring path."""
    generation = GenerationSettings(max_new_tokens=6, temperature=temperature, seed=3)
    plain_settings = CausalLMSettings(generation, micro_batch_size=4, chunked_output_layer=False)
    plain = CausalLMPolicy(model, tokenizer, plain_settings)
    folded_settings = CausalLMSettings(generation, micro_batch_size=4, chunked_output_layer=True)
    return plain, CausalLMPolicy(model, tokenizer, folded_settings)


def _score_and_grads(policy, actions):
    """Token log-probs, entropy and the gradient of their masked sum w.r.t. every trainable weight."""
    policy.model.zero_grad(set_to_none=True)
    out = policy.get_token_log_probabilities([None] * len(actions), actions)
    (out.logprobs.sum() + 0.1 * out.entropy.sum()).backward()
    grads = {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.grad is not None}
    return out, grads


@pytest.mark.parametrize("arch", ARCHS)
def test_folded_scoring_equals_the_logits_path(tiny_lm_dir, arch):
    """Same log-probs, entropy, mask and weight gradients (1e-5) for Qwen2, Llama and GPT-2."""
    model, tokenizer = load_tiny_causal_lm(tiny_lm_dir(arch))
    plain, folded = _policies(model, tokenizer)
    actions = _actions(tokenizer)
    expected, expected_grads = _score_and_grads(plain, actions)
    got, got_grads = _score_and_grads(folded, actions)
    assert torch.equal(got.completion_mask, expected.completion_mask)
    assert not got.completion_mask[3, 1:].any()  # nothing after the EOS counts
    torch.testing.assert_close(got.logprobs, expected.logprobs, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.entropy, expected.entropy, atol=1e-5, rtol=1e-5)
    assert got_grads.keys() == expected_grads.keys()
    for name, grad in expected_grads.items():
        torch.testing.assert_close(got_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_the_output_layer_runs_at_real_completion_tokens_only(tiny_lm_dir, monkeypatch):
    """Ragged completions: the folded output layer is asked for the real completion tokens
    only (the sum of the lengths, not the padded (n, T) block), in one pass with the entropy."""
    import grpo.lm.scoring as scoring

    model, tokenizer = load_tiny_causal_lm(tiny_lm_dir("llama"))
    _, folded = _policies(model, tokenizer)
    actions = _actions(tokenizer)
    asked = []
    one_pass = scoring.output_layer_logprobs_entropy

    def recording(*args, where, **kwargs):
        asked.append(where.clone())
        return one_pass(*args, where=where, **kwargs)

    monkeypatch.setattr(scoring, "output_layer_logprobs_entropy", recording)
    monkeypatch.setattr(scoring, "output_layer_logprobs", None)  # a second pass would fail
    out = folded.get_token_log_probabilities([None] * len(actions), actions)
    lengths = [a.num_tokens for a in actions]
    assert len(set(lengths)) > 1 and out.logprobs.shape == (4, max(lengths))
    assert len(asked) == 1
    assert asked[0].sum(1).tolist() == lengths


def test_lora_and_its_reference_fold_too(tiny_lm_dir):
    """LoRA on the body (PEFT's "all-linear" leaves the output layer alone): the policy and the
    adapters-disabled reference score as on the logits path."""
    model, tokenizer = load_tiny_causal_lm(tiny_lm_dir("llama"))
    model = apply_lora(model, LoraSettings(r=4, alpha=8))
    with torch.no_grad():  # non-zero adapters, so policy and reference differ
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    plain, folded = _policies(model, tokenizer)
    actions = [a for group in plain.generate_actions(PROMPTS, 2) for a in group]
    states = [None] * len(actions)
    with torch.no_grad():
        for make in (lambda p: p, lambda p: p.make_reference()):
            expected = make(plain).get_token_log_probabilities(states, actions).logprobs
            got = make(folded).get_token_log_probabilities(states, actions).logprobs
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
        policy_lp = folded.get_token_log_probabilities(states, actions).logprobs
        reference_lp = folded.make_reference().get_token_log_probabilities(states, actions)
    assert (policy_lp - reference_lp.logprobs).abs().max() > 1e-3


def test_lora_on_the_output_layer_is_refused(tiny_lm_dir):
    """The folded output layer needs a plain linear layer: LoRA on lm_head is refused by name."""
    model, tokenizer = load_tiny_causal_lm(tiny_lm_dir("qwen2"))
    model = apply_lora(model, LoraSettings(r=4, alpha=8, target_modules=("q_proj", "lm_head")))
    _, folded = _policies(model, tokenizer)
    actions = [a for group in folded.generate_actions(PROMPTS[:1], 2) for a in group]
    with pytest.raises(ValueError, match="chunked_output_layer: needs .* plain nn.Linear"):
        folded.get_token_log_probabilities([None] * 2, actions)


def test_logits_that_are_not_the_output_layer_are_caught(tiny_lm_dir):
    """A model that rescales its logits after the output layer (as soft-capping does) is refused
    on first use instead of being scored with the wrong distribution."""
    model, tokenizer = load_tiny_causal_lm(tiny_lm_dir("llama"))
    scaled = copy.deepcopy(model)

    def double_logits(module, args, kwargs, output):
        output.logits = 2.0 * output.logits
        return output

    scaled.register_forward_hook(double_logits, with_kwargs=True)
    _, folded = _policies(scaled, tokenizer)
    actions = [a for group in folded.generate_actions(PROMPTS[:1], 2) for a in group]
    with pytest.raises(ValueError, match="not its output layer applied to its last hidden states"):
        folded.get_token_log_probabilities([None] * 2, actions)
    _, unscaled = _policies(model, tokenizer)
    unscaled.get_token_log_probabilities([None] * 2, actions)  # the same check passes unscaled


def _sharded_worker(rank: int, port: int, model_dir: str, out: str) -> None:
    """One-process gloo group: FSDP2-shard the model, then try folded scoring."""
    import os
    from pathlib import Path

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=1)
    try:
        model, tokenizer = load_tiny_causal_lm(model_dir)
        _, folded = _policies(model, tokenizer)
        actions = [a for group in folded.generate_actions(PROMPTS[:1], 2) for a in group]
        fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
        try:
            folded.get_token_log_probabilities([None] * 2, actions)
            message = "no error"
        except ValueError as error:
            message = str(error)
        Path(out).write_text(message)
    finally:
        dist.destroy_process_group()


def test_an_fsdp2_sharded_output_layer_is_refused(tiny_lm_dir, tmp_path):
    """Under FSDP2 the body alone would see unsharded-looking shards: refused with the fix named."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = tmp_path / "message.txt"
    mp.spawn(_sharded_worker, args=(port, str(tiny_lm_dir("qwen2")), str(out)), nprocs=1)
    assert "the output layer is sharded (FSDP2)" in out.read_text()
