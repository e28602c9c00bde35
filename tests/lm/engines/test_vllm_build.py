"""Tests for grpo.lm.engines.vllm_build: an engine build leaves the trainer's process as it was.

No vLLM is needed: a stand-in `vllm` module's `LLM` does to the trainer's decoder
class what vLLM 0.32's transformers backend does when it builds its model
(`support_torch_compile` from `compilation/decorators.py`, applied to
`type(model.get_decoder())`), and what its workers do to RNGs and threads.
tests/lm/engines/test_vllm_cpu.py repeats the class check with vLLM's own decorator.
"""

from __future__ import annotations

import copy
import random
import sys
import types
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from tiny_models import load_tiny_causal_lm

from grpo.lm.engines.vllm_build import (
    build_llm,
    classes_kept,
    process_state_kept,
    reset_prefix_cache,
)


class CompileWrapperStandIn:
    """Plays vLLM's TorchCompileWithNoGuardsWrapper: the base class the decorator appends."""


def support_torch_compile_stand_in(cls: type) -> type:
    """What vLLM's `_support_torch_compile` does to a class, in eager mode."""
    if CompileWrapperStandIn in cls.__bases__:
        return cls
    cls.__bases__ = (*cls.__bases__, CompileWrapperStandIn)
    old_init = cls.__init__
    cls._ignore_compile_vllm = False

    def __init__(self, *args, vllm_config=None, prefix="", **kwargs):
        if vllm_config is None:  # vLLM's get_current_vllm_config() outside an engine
            raise RuntimeError("Current vLLM config is not set.")
        old_init(self, *args, **kwargs)
        self.do_not_compile = True  # enforce_eager: compilation mode NONE

    def __call__(self, *args, **kwargs):
        if self.do_not_compile:  # set by the new __init__ only
            return self.forward(*args, **kwargs)
        raise AssertionError("compiled path")

    cls.__init__ = __init__
    cls.__call__ = __call__
    return cls


def fake_vllm(decorate: type) -> types.ModuleType:
    """A `vllm` module whose LLM(...) decorates `decorate` and reseeds and rethreads the process."""

    def LLM(**kwargs):  # noqa: N802 (vLLM's name)
        support_torch_compile_stand_in(decorate)
        random.seed(0)  # vLLM's set_random_seed(seed)
        np.random.seed(0)
        torch.manual_seed(0)
        torch.set_num_threads(1)  # GPU worker: set_torch_threads_for_runtime
        torch.set_num_threads = lambda n: None  # CPU worker: skip_set_num_threads
        return SimpleNamespace(kwargs=kwargs)

    module = types.ModuleType("vllm")
    module.LLM = LLM
    return module


@pytest.fixture
def model_with_own_decoder_class(tiny_lm_dir):
    """A tiny Llama whose decoder is an instance of a class made for this test alone."""
    model, _ = load_tiny_causal_lm(tiny_lm_dir("llama"))
    decoder = model.get_decoder()
    decoder.__class__ = type("DecoderUnderTest", (type(decoder),), {})
    return model.eval()


def test_engine_build_leaves_the_trainers_decoder_class_callable(
    model_with_own_decoder_class, monkeypatch, tmp_path
):
    """After vLLM decorated the decoder class: the existing model, a deep copy and a new
    decoder compute exactly as before, and the class is the one it was."""
    model = model_with_own_decoder_class
    cls = type(model.get_decoder())
    before = (cls.__bases__, dict(vars(cls)))
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        want = model(input_ids=ids).logits
    monkeypatch.setitem(sys.modules, "vllm", fake_vllm(cls))
    llm = build_llm(model, str(tmp_path), {"seed": 0})
    assert llm.kwargs["model"] == str(tmp_path)
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, want)  # raised AttributeError before
        assert torch.equal(copy.deepcopy(model)(input_ids=ids).logits, want)
        fresh = cls(model.config)  # needed a vLLM config before
        fresh.load_state_dict(model.get_decoder().state_dict())
        assert torch.equal(fresh(input_ids=ids).last_hidden_state, model.get_decoder()(ids)[0])
    assert (cls.__bases__, dict(vars(cls))) == before


def test_classes_kept_removes_added_and_restores_replaced_attributes():
    """Added attributes go, replaced ones come back, `__bases__` is restored."""

    class Base(torch.nn.Module):
        pass

    class Leaf(Base):
        def forward(self, x):
            return x + 1

    module, forward = Leaf(), Leaf.forward
    with classes_kept(module):
        support_torch_compile_stand_in(Leaf)
        Leaf.forward = lambda self, x: x
        Base.extra = 1
    assert Leaf.__bases__ == (Base,) and Leaf.forward is forward
    assert not hasattr(Leaf, "_ignore_compile_vllm") and not hasattr(Base, "extra")
    assert int(module(torch.tensor(1))) == 2


def test_process_state_kept_restores_every_rng_and_the_thread_count():
    """Seeding and thread changes inside leave every generator, the thread count and
    torch.set_num_threads itself as they were (CUDA generators too, where there are some);
    threads=False leaves the threads as the body set them."""
    threads, set_num_threads = torch.get_num_threads(), torch.set_num_threads
    random.seed(7), np.random.seed(7), torch.manual_seed(7)
    states = random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    with process_state_kept():
        random.seed(0), np.random.seed(0), torch.manual_seed(0)  # also seeds CUDA
        torch.set_num_threads(threads + 1)
        torch.set_num_threads = lambda n: None
    assert random.getstate() == states[0]
    assert np.array_equal(np.random.get_state()[1], states[1])
    assert torch.equal(torch.get_rng_state(), states[2])
    if cuda is not None:
        assert all(map(torch.equal, torch.cuda.get_rng_state_all(), cuda))
    assert torch.get_num_threads() == threads and torch.set_num_threads is set_num_threads
    with process_state_kept(threads=False):  # vLLM's CPU build: its thread binding stands
        torch.set_num_threads = noop = lambda n: None
    assert torch.set_num_threads is noop
    torch.set_num_threads = set_num_threads


def test_a_refused_prefix_cache_reset_raises():
    """vLLM's False (blocks still in use) is an error, True is not."""
    reset_prefix_cache(SimpleNamespace(reset_prefix_cache=lambda: True))
    with pytest.raises(RuntimeError, match="did not reset its prefix cache"):
        reset_prefix_cache(SimpleNamespace(reset_prefix_cache=lambda: False))
