# sparse2d: `make test` and `make train` install everything they need into .venv.
#
# Backend choice (which FBGEMM build is installed):
#   BACKEND=auto (default): cuda when `nvidia-smi -L` lists a GPU, else cpu.
#   BACKEND=cpu  -> fbgemm-gpu-cpu==1.8.0      BACKEND=cuda -> fbgemm-gpu==1.8.0
# TORCH_INDEX_URL=<url> installs torch 2.13.0 from that index (e.g. a CPU-only index).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BACKEND ?= auto
ifeq ($(BACKEND),auto)
  BACKEND := $(shell nvidia-smi -L >/dev/null 2>&1 && echo cuda || echo cpu)
endif
FBGEMM_cpu := fbgemm-gpu-cpu==1.8.0
FBGEMM_cuda := fbgemm-gpu==1.8.0
TORCH_INDEX := $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL),)
STAMP := $(VENV)/.installed-$(BACKEND)
NPROC ?= 4
CONFIG ?= configs/tiny_cpu.yaml
PYTEST_ARGS ?=

.PHONY: install test lint format train bench clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0 $(TORCH_INDEX)
	$(PY) -m pip install -q $(FBGEMM_$(BACKEND))
	$(PY) -m pip install -q --no-deps torchrec==1.8.0
	$(PY) -m pip install -q -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $@

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

test: lint
	$(PY) -m pytest -q $(PYTEST_ARGS)

train: $(STAMP)
	NPROC=$(NPROC) CONFIG=$(CONFIG) PYTHON=$(PY) launch/local.sh

bench: $(STAMP)
	$(PY) bench/sync_bench.py

clean:
	rm -rf $(VENV) runs
