# One command each for a fresh Linux machine with Python 3.10-3.13:
#   make test   creates .venv, installs the project with its dev extra, runs the test suite
#   make demo   trains on the embedded synthetic dataset, evaluates the held-out split
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install test test-fast demo clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

# The whole suite; `gpu` tests skip themselves without a GPU.
test: $(STAMP)
	$(BIN)/python -m pytest

# Everything except the end-to-end `slow` runs and the browser test.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow and not browser"

demo: $(STAMP)
	$(BIN)/python train.py experiment=demo
	$(BIN)/python scripts/evaluate.py run_dir=outputs/demo
	@echo ""
	@echo "results:   outputs/demo/eval/test/ (metrics.csv, summary.json, predictions/, overlays/)"
	@echo "MLflow UI: $(BIN)/mlflow ui --backend-store-uri sqlite:///mlruns.db   then open http://127.0.0.1:5000"

clean:
	rm -rf $(VENV) .pytest_cache outputs multirun
