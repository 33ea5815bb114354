# sparse2d: `make test` and `make train` install everything they need into .venv.
#
# Version set (TORCHREC=...), each in its own venv so the lean default stays untouched:
#   TORCHREC=1.8 (default) -> .venv:     torch 2.13.0, fbgemm-gpu(-cpu) 1.8.0, torchrec 1.8.0
#   TORCHREC=1.9           -> .venv-1.9: torch 2.14.1, fbgemm-gpu(-cpu) 1.9.0, torchrec 1.9.2
#   e.g. `make test TORCHREC=1.9` (see docs/training.md, TorchRec versions).
# Backend choice (which FBGEMM build is installed):
#   BACKEND=auto (default): cuda when `nvidia-smi -L` lists a GPU, else cpu.
#   BACKEND=cpu  -> fbgemm-gpu-cpu             BACKEND=cuda -> fbgemm-gpu (same version)
# TORCH_INDEX_URL=<url> installs torch from that index (e.g. a CPU-only index).
PYTHON ?= python3
TORCHREC ?= 1.8
ifeq ($(TORCHREC),1.8)
  VENV := .venv
  TORCH_VERSION := 2.13.0
  FBGEMM_VERSION := 1.8.0
  TORCHREC_VERSION := 1.8.0
else ifeq ($(TORCHREC),1.9)
  VENV := .venv-1.9
  TORCH_VERSION := 2.14.1
  FBGEMM_VERSION := 1.9.0
  TORCHREC_VERSION := 1.9.2
else
  $(error TORCHREC=$(TORCHREC) is not a known set; use TORCHREC=1.8 or TORCHREC=1.9)
endif
PY := $(VENV)/bin/python
BACKEND ?= auto
ifeq ($(BACKEND),auto)
  BACKEND := $(shell nvidia-smi -L >/dev/null 2>&1 && echo cuda || echo cpu)
endif
FBGEMM_cpu := fbgemm-gpu-cpu==$(FBGEMM_VERSION)
FBGEMM_cuda := fbgemm-gpu==$(FBGEMM_VERSION)
TORCH_INDEX := $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL),)
STAMP := $(VENV)/.installed-$(BACKEND)
NPROC ?= 4
CONFIG ?= configs/tiny_cpu.yaml
# `make test` runs the WHOLE suite, slow tests (restarts, rank loss, trainer runs, fault
# tolerance) included: CI's contract is the whole suite well inside 20 min on 2 cores.
# `make test-quick` skips the tests marked slow, for your own iterations.
PYTEST_ARGS ?=
# The suite's modules run on TEST_WORKERS pytest-xdist processes, a module at a time each
# (`--dist loadfile`: a module's shared fixtures stay in one process). CPU-bound on 2 cores
# either way: two workers keep both cores ~98% busy where one left ~18% idle (pytest 16:38
# vs 19:35 for the same tree in one session). Modules start in collection order
# (`--no-loadscope-reorder`; tests/conftest.py HEAVY_FIRST puts the longest first): xdist's
# default order, most tests first, started the fault-tolerant launches (4 tests, ~1/3 of the
# suite's CPU seconds) after 450 s, to run alone at the end. TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) $(if $(filter 0,$(TEST_WORKERS)),,--dist loadfile --no-loadscope-reorder)

.PHONY: install test test-quick test-all lint bytecode format train train-cluster bench clean

install: $(STAMP)

# Bytecode: pip compiles each package's files one at a time as it installs; one
# `compileall -j 0` over site-packages afterwards uses every core (a fresh install on 2 cores,
# 2026-11-27: 89 s with pip compiling, 41 s + 28 s this way). Its exit status is ignored, as
# pip ignores its own compile errors: torch ships a test helper in Python 3.12 syntax.

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-compile torch==$(TORCH_VERSION) $(TORCH_INDEX)
	$(PY) -m pip install -q --no-compile $(FBGEMM_$(BACKEND))
	$(PY) -m pip install -q --no-compile --no-deps torchrec==$(TORCHREC_VERSION)
	$(PY) -m pip install -q --no-compile -e '.[dev,train]'
	$(PY) -m compileall -q -j 0 $$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') >/dev/null || true
	rm -f $(VENV)/.installed-*
	touch $@

# The suite starts ~110 interpreters that import sparse2d; where PYTHONDONTWRITEBYTECODE is
# set (it is on this project's machines) each compiled its modules from source again
# (0.3-0.5 s against 0.12-0.19 s with bytecode). One compile up front, into the ignored
# __pycache__ dirs (checked against the source's mtime as always: an edit is recompiled).
bytecode: $(STAMP)
	$(PY) -m compileall -q -j 0 sparse2d tests bench >/dev/null

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# No reruns: every test gets one chance; a flaky test is a bug to find (test or product).
test: lint bytecode
	$(PY) -m pytest -q --durations=30 $(XDIST) $(PYTEST_ARGS)

test-quick: lint bytecode
	$(PY) -m pytest -q -m 'not slow' $(XDIST) $(PYTEST_ARGS)

test-all: test

# ARGS: dotted overrides, e.g. make train ARGS="run_dir=runs/again" (a run_dir that holds a
# run is refused unless the run resumes from its checkpoints: train.resume=auto).
train: $(STAMP)
	NPROC=$(NPROC) CONFIG=$(CONFIG) PYTHON=$(PY) launch/local.sh $(ARGS)

# The cluster main job on an emulated cluster (root: network namespaces and tc): 2 hosts x 4
# ranks whose links run at 200 Mbit/s (launch/emulated_hosts.sh, configs/cluster_cpu.yaml).
# ARGS: dotted overrides, e.g. make train-cluster ARGS="parallel.sharding_group_size=8".
HOSTS ?= 2
LINK ?= 200mbit
ARGS ?=
train-cluster: $(STAMP)
	HOSTS=$(HOSTS) NPROC=4 LINK=$(LINK) CONFIG=configs/cluster_cpu.yaml PYTHON=$(PY) \
	  launch/emulated_hosts.sh $(ARGS)

# Performance benchmarks: each script below rewrites its own section of bench/RESULTS.md
# (sync-bench, sync-vs-raw, sparse-sync, overhead, memory, step-breakdown, main-job)
# and its JSON in bench/results/. Duration, the last measured run (the one place it is
# stated): 665 s from a fresh clone, install included, 2026-11-22 (commit 03559b0), on the
# shared 2-core box. Every other bench runs by hand (docs/benchmarks.md lists them).
BENCH_ENV := PYTHONPATH=$(CURDIR) OMP_NUM_THREADS=1
bench: $(STAMP)
	$(BENCH_ENV) $(PY) bench/sync_bench.py
	$(BENCH_ENV) $(PY) bench/sync_vs_raw_bench.py
	$(BENCH_ENV) $(PY) bench/sparse_sync_bench.py
	$(BENCH_ENV) $(PY) bench/overhead_bench.py
	$(BENCH_ENV) $(PY) bench/memory_bench.py
	$(BENCH_ENV) $(PY) bench/step_breakdown.py
	$(BENCH_ENV) $(PY) bench/main_job_bench.py

clean:
	rm -rf .venv .venv-1.9 runs
