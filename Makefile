# One command each for a fresh Linux machine with Python 3.10-3.13:
#   make test   creates .venv, installs the project with its dev extra, runs the default test suite
#               (6.3 min on a 2-core AMD EPYC Zen 5: docs/measurements/ci_zen5/ci_d5af722.txt); make test-slow runs the rest (end-to-end runs of the entry
#               points, fault drills, the planner's accuracy, the MLflow UI in a browser); CI runs both
#   make demo   trains on the embedded synthetic dataset, evaluates the held-out split
# Both install with pip from requirements.lock, the pinned versions every install uses
# (.venv here, the Docker image); `make lock` refreshes it after pyproject.toml changes.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
LOCK   := requirements.lock

# The lock is made by uv (only `make lock` needs it; installing needs pip alone): one universal
# resolution valid on Linux for Python 3.10-3.13 (pins differ by Python where a package dropped
# 3.10), covering the dev extra (`make test`) and the gpu extra (`pip install -c requirements.lock
# ".[gpu]"` on a host without a CUDA image). An existing lock's pins are kept where still valid;
# `make lock LOCK_ARGS=--upgrade` moves everything to the newest allowed versions.
UV_VERSION := 0.13.9
UV_VENV    := $(VENV)/.uv
UV         := $(UV_VENV)/bin/uv
LOCK_ARGS  ?=

.PHONY: install lint format test test-slow test-all demo lock clean

$(STAMP): pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --constraint $(LOCK) -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

# ruff, as configured in pyproject.toml: the format is checked and the lint rules hold (`make format`
# applies both fixes; .pre-commit-config.yaml runs the same before each commit).
LINTED := brats_seg scripts tests train.py
lint: $(STAMP)
	$(BIN)/ruff format --check $(LINTED)
	$(BIN)/ruff check $(LINTED)

format: $(STAMP)
	$(BIN)/ruff format $(LINTED)
	$(BIN)/ruff check --fix $(LINTED)

# The default suite: everything but the `slow` end-to-end runs, the `browser` test and the `alone`
# measurements (run by test-slow); `gpu` tests
# skip themselves without a GPU. The lint first: CI fails on a formatting or lint error too.
# Two pytest-xdist workers, a test file each at a time (--dist loadfile: a file's module fixtures,
# often a training, are built once, in one worker): 6.3-6.5 min instead of 10.9-11.3 in one
# process on the 2-core Zen 5 (docs/measurements/suite_time_zen5/, ci_zen5/ci_d5af722.txt). TEST_WORKERS=0 runs it in this process, one test at a time;
# more workers on a bigger machine cost a TensorFlow process (~1-2 GB) each.
TEST_WORKERS ?= 2
test: $(STAMP) lint
	$(BIN)/python -m pytest -m "not slow and not browser and not alone" -n $(TEST_WORKERS) --dist loadfile --durations=15

# The rest, minutes each: the entry points end to end (kills, signals, preemption, clusters,
# sweeps, 2x, the planner measured), and the MLflow UI in headless Chromium.
# Two workers as above, then the `alone` tests (the planner's accuracy, the inference estimate
# against the allocator's peak: their memory peaks must be the machine's) with nothing beside them;
# both run whatever the first gives.
test-slow: $(STAMP)
	$(BIN)/python -m pytest -m "(slow or browser) and not alone" -n $(TEST_WORKERS) --dist loadfile --durations=10; \
	first=$$?; $(BIN)/python -m pytest -m "alone"; second=$$?; test $$first -eq 0 && test $$second -eq 0

# Both, as CI runs them.
test-all: test test-slow

demo: $(STAMP)
	$(BIN)/python train.py experiment=demo
	$(BIN)/python scripts/evaluate.py run_dir=outputs/demo
	@echo ""
	@echo "results:   outputs/demo/training_curves.png, outputs/demo/eval/test/ (metrics.csv, summary.json, per_case.png, predictions/, overlays/)"
	@echo "MLflow UI: $(BIN)/mlflow ui --backend-store-uri sqlite:///mlruns.db   then open the link in outputs/demo/train.log"
	@grep -o "http://127.0.0.1:5000/#/[^ ]*" outputs/demo/train.log | tail -n 1

$(UV):
	$(PYTHON) -m venv $(UV_VENV)
	$(UV_VENV)/bin/python -m pip install --quiet "uv==$(UV_VERSION)"

lock: $(UV)
	$(UV) pip compile pyproject.toml --universal --python-version 3.10 --extra dev --extra gpu \
		--custom-compile-command "make lock" --output-file $(LOCK) --quiet $(LOCK_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache outputs multirun
