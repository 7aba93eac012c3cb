# transformer-nmt: one entry point per pipeline stage.
#   make install            venv + editable install with dev and export extras (CPU torch pinned unless torch is already there)
#   make test               the whole test suite (the cluster simulations of tests/test_cluster.py included)
#   make data|train|average|eval|table EXP=<experiment> ARGS="hydra.overrides=..."
#   make all                the whole default job: train (data first), average, evaluate, table
# test, data, train, average, eval and table run `make install` first when the environment is
# missing or older than pyproject.toml (stamp file $(VENV)/.installed).
#   make plots EXP=<experiment>   training curves, BLEU per checkpoint (runs/<experiment>/plots/)
#   make export EXP=<experiment>  runs/<experiment>/export/hf (ARGS="export.format=ctranslate2 export.quantization=int8")
#   make bench-install      .venv-bench: this package plus the peers it is timed against (fairseq, transformers)
#   make bench              CPU training and decoding benchmarks against the peers (docs/benchmarks.md)
#   make gpu-check          on a CUDA machine: GPU tests, bf16/fp16/DDP/big runs, decoding -> docs/gpu_check.md

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0
EXP ?= multi30k_en_de
ARGS ?=
# Multi30k is read from this local mirror when it exists (set it empty to download by URL).
export NMT_MULTI30K_MIRROR ?= $(if $(wildcard ../shared/data/multi30k/train.en.gz),$(abspath ../shared/data/multi30k),)

.PHONY: all install test data train average eval export table plots lint clean bench-install bench gpu-check

# Benchmark environment: the peers are dependencies of the benchmarks only, never of the package.
BENCH_VENV ?= .venv-bench
BENCH_BIN := $(BENCH_VENV)/bin
BENCH_PEERS ?= fairseq-fixed==0.12.3.1 transformers==5.23.0
BENCH_TRAIN_ARGS ?=
BENCH_DECODE_ARGS ?=

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip

STAMP := $(VENV)/.installed

install: $(BIN)/python
	@if $(BIN)/python -c "import torch" 2>/dev/null; then \
		echo "torch $$($(BIN)/python -c 'import torch; print(torch.__version__)') already installed; keeping it"; \
	else \
		$(BIN)/python -m pip install "$(TORCH_SPEC)"; \
	fi
	$(BIN)/python -m pip install -e ".[dev,export]"
	@touch $(STAMP)

# The environment is (re)installed when missing or when pyproject.toml changed since.
$(STAMP): pyproject.toml
	$(MAKE) install

all: train eval table

test: $(STAMP)
	$(BIN)/python -m pytest -q tests

data: $(STAMP)
	$(BIN)/nmt-prepare experiment=$(EXP) $(ARGS)

train: data
	$(BIN)/nmt-train experiment=$(EXP) $(ARGS)

average: $(STAMP)
	$(BIN)/nmt-average experiment=$(EXP) $(ARGS)

eval: average
	$(BIN)/nmt-evaluate experiment=$(EXP) $(ARGS)

export: average
	$(BIN)/nmt-export experiment=$(EXP) $(ARGS)

table: $(STAMP)
	$(BIN)/nmt-table $(ARGS)

plots: $(STAMP)
	$(BIN)/nmt-plot experiment=$(EXP) $(ARGS)

$(BENCH_BIN)/python:
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_BIN)/python -m pip install --upgrade pip

bench-install: $(BENCH_BIN)/python
	@if $(BENCH_BIN)/python -c "import torch" 2>/dev/null; then \
		echo "torch $$($(BENCH_BIN)/python -c 'import torch; print(torch.__version__)') already installed; keeping it"; \
	else \
		$(BENCH_BIN)/python -m pip install "$(TORCH_SPEC)"; \
	fi
	$(BENCH_BIN)/python -m pip install -e .
	$(BENCH_BIN)/python -m pip install $(BENCH_PEERS)

bench:
	$(BENCH_BIN)/nmt-prepare experiment=$(EXP)
	$(BENCH_BIN)/python scripts/bench_train.py $(BENCH_TRAIN_ARGS)
	$(BENCH_BIN)/python scripts/bench_decode.py $(BENCH_DECODE_ARGS)

gpu-check:
	$(BIN)/python scripts/gpu_check.py

lint:
	$(BIN)/ruff check src tests scripts

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
