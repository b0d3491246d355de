# Two commands from a fresh clone:  `make demo` (the main job) and `make test` (every test).
# Each sets up its own virtual environment in .venv (idempotently) from constraints.txt.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The jobs and tests run offline on the embedded default. `make lab` is left out on purpose: a notebook may load a hub
# target or log to wandb, as the user's own environment says.
OFFLINE_JOBS := demo test gpu-check ablations
$(OFFLINE_JOBS): export WANDB_MODE ?= disabled
$(OFFLINE_JOBS): export HF_HUB_OFFLINE := 1
$(OFFLINE_JOBS): export HF_DATASETS_OFFLINE := 1
$(OFFLINE_JOBS): export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: demo test env lab lock ablations gpu-check

# A stock older Python would fail deep inside pip on the first pin that needs 3.11: the venv's Python is checked first.
$(BIN)/.installed: pyproject.toml constraints.txt
	test -x $(BIN)/python || { $(PYTHON) -c 'import sys; v = sys.version_info[:2]; sys.exit(v < (3, 11) and f"make: $(PYTHON) is Python {v[0]}.{v[1]}; the pinned packages (constraints.txt) need Python >= 3.11: run make PYTHON=python3.11 ...")' && $(PYTHON) -m venv $(VENV); }
	$(BIN)/python -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[dev]'
	touch $@

env: $(BIN)/.installed

# Read and run the notebooks in JupyterLab, at the repository root (the environment's `python3` kernel; tqdm draws its
# bars as widgets). Saving runs nbdev's clean first (settings.ini: jupyter_hooks), so opening or saving a notebook adds
# no metadata for `make test` to object to. LAB_ARGS go to Lab, e.g. on a remote GPU box:
#   make lab LAB_ARGS="--no-browser --ip=0.0.0.0 --port=8888"   (add --allow-root where you are root)
LAB_ARGS ?=
lab: $(BIN)/.installed
	$(BIN)/jupyter lab --ContentsManager.pre_save_hook=nbdev.clean.clean_jupyter $(LAB_ARGS)

# The main job: train a Domino draft on the embedded default, evaluate it, write runs/demo/.
demo: $(BIN)/.installed
	$(BIN)/python -m domino_research.train --config embedded_domino --run_name demo --overwrite true

# Every test: notebooks clean, library in sync with nbs/, notebook tests, then pytest (its summary line ends the output).
test: $(BIN)/.installed
	PATH=$(abspath $(BIN)):$$PATH bash tests/run_all.sh

# The checks that need a CUDA GPU (notebook 35) -> one JSON line on stdout; without a GPU: one line saying so, exit 0
# (exit 1 if a GPU is there but torch cannot use it, or with GPU_CHECK_ARGS=--require_gpu).
gpu-check: $(BIN)/.installed
	$(BIN)/python -m domino_research.gpu_check $(GPU_CHECK_ARGS)

# The ablation study (runs/ablations/study28/, its README): a learning-rate sweep at 720 steps, each variant's rate chosen
# on the validation split, the 2880-step table with 3 seeds on 64 test prompts x 128 tokens (two runs at a time), then
# every kept draft timed alone. Each piece resumes where it stopped: rerun the same command. (The first study,
# runs/ablations/main/, ran nbs/ablations.ipynb under papermill with the parameters its executed copy there shows.)
ablations: $(BIN)/.installed
	for piece in sweep rates "table 0,1,2" latency; do $(BIN)/python runs/ablations/study28/study.py $$piece || exit 1; done

lock: $(BIN)/.installed
	$(BIN)/python -m pip freeze --exclude-editable | sed 's/^torch==\(.*\)+cpu/torch==\1/' > constraints.txt
