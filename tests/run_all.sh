#!/usr/bin/env bash
# The test command (`make test`). Order: cheap consistency checks first, pytest last so its summary line ends the output.
set -euo pipefail
cd "$(dirname "$0")/.."
export WANDB_MODE=${WANDB_MODE:-disabled} HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# nbdev_test and pytest each run two workers, one per core: torch's default of one thread per core in each would put four
# busy threads on two cores, and OpenMP threads spin while they wait for a descheduled sibling. One thread each:
# nbs/train.ipynb took 12 s of CPU instead of 54 (25 s wall instead of 90) on the shared 2-core machine.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

echo "== notebooks are clean (nbdev_clean leaves no diff)"
nbdev_clean
if ! git diff --quiet -- nbs/; then
  git diff --stat -- nbs/
  echo "nbs/ differs from what is committed even after nbdev_clean: most often the outputs of a notebook run in Lab."
  echo "To restore a notebook you only ran: git restore <notebook>. If you changed it on purpose, clear the outputs you"
  echo "added (Lab: Edit > Clear Outputs of All Cells, then save), check that git diff shows only your change, and commit."
  exit 1
fi

echo "== library is in sync with the notebooks (nbdev_export leaves no diff)"
nbdev_export
if [ -n "$(git status --porcelain -- domino_research/)" ]; then
  git status --porcelain -- domino_research/; echo "domino_research/ is out of sync with nbs/: run nbdev_export and commit"; exit 1
fi

echo "== lint (ruff, configured in pyproject.toml: library, notebooks, tests)"
ruff check --no-cache .

echo "== notebook tests (nbdev_test${NBDEV_FLAGS:+ --flags $NBDEV_FLAGS})"
nbdev_test --n_workers 2 ${NBDEV_FLAGS:+--flags "$NBDEV_FLAGS"}

echo "== pytest (two workers, one torch thread each, taking the next test as they finish one, the longest first: tests/conftest.py)"
python -m pytest -q -n 2 --dist loadgroup tests
