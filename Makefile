# Two commands from a fresh clone:  `make demo` (the main job) and `make test` (every test).
# Each sets up its own virtual environment in .venv (idempotently) from constraints.txt.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export WANDB_MODE ?= disabled
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: demo test env lock

$(BIN)/.installed: pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	touch $@

env: $(BIN)/.installed

# The main job: train a Domino draft on the embedded default, evaluate it, write runs/demo/.
demo: $(BIN)/.installed
	$(BIN)/python -m domino_research.train --config embedded_domino --run_name demo

# Every test: notebooks clean, library in sync with nbs/, notebook tests, then pytest (its summary line ends the output).
test: $(BIN)/.installed
	PATH=$(abspath $(BIN)):$$PATH bash tests/run_all.sh

lock: $(BIN)/.installed
	$(BIN)/python -m pip freeze --exclude-editable | sed 's/^torch==\(.*\)+cpu/torch==\1/' > constraints.txt
