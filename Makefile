# transformer-nmt: one entry point per pipeline stage.
#   make install            venv + editable install with dev, export and cluster extras (CPU torch pinned unless torch is already there)
#   make test               unit and scenario tests (tests/scenario: end to end, reliability),
#                           all but the heavy tier: under 10 minutes on a 2-core CPU
#   make test-heavy         the heavy tier (pytest -m heavy), on the CPU: the compiled, packed and
#                           graphed GPU paths, GPU-machine scripts, the simulated cluster, the
#                           sweeps; CI runs it after make test
#   make test-fast          the unit tests only (tests/unit): about 1.5 minutes on a 2-core CPU
#   make data|train|average|eval|table EXP=<experiment> ARGS="hydra.overrides=..."
#   make smoke              the whole default pipeline at smoke size (prepare, train, average,
#                           evaluate: about a minute on a laptop CPU; runs/smoke)
#   make all                the whole default job: train (data first), average, evaluate, table
#                           (runs/results.md; the committed docs/results.md is rebuilt only when
#                           asked: make table ARGS=table.output=docs/results.md)
# test, test-heavy, test-fast, data, train, average, eval and table run `make install` first when the environment is
# missing or older than pyproject.toml (stamp file $(VENV)/.installed).
#   make table3 EXP=wmt14_en_de_base [ARGS="hydra/launcher=slurm_torchrun ..."]   the paper's Table 3 sweep
#   make table3-proxy       Table 3 at CPU scale on Multi30k (resumable; runs/table3_proxy/results.md
#                           and .png; the committed docs/table3_proxy.md and .png are rebuilt only
#                           when asked: make table3-proxy TABLE3_PROXY_OUT=docs/table3_proxy)
#   make plots EXP=<experiment>   training curves, BLEU per checkpoint (runs/<experiment>/plots/)
#   make export EXP=<experiment>  runs/<experiment>/export/hf (ARGS="export.format=ctranslate2 export.quantization=int8"; to replace an earlier export: ARGS=export.overwrite=true)
#   make bench-install      .venv-bench: this package (export extra: CTranslate2) plus the peers it is timed against (fairseq, transformers)
#   make bench              CPU training and decoding benchmarks against the peers (docs/benchmarks.md)
#   make device-bundle      device_bundle/: what scripts/cluster/device_measure.py needs on a GPU
#                           machine with torch only (wheels of hydra-core, omegaconf, antlr4; Multi30k)
#   make gpu-check          on a CUDA machine: GPU tests, bf16/fp16/DDP/big runs, decoding
#                           -> runs/gpu_check/report.md and .json (elsewhere: GPU_CHECK_OUT=<path
#                           without suffix>)

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0
EXP ?= multi30k_en_de
ARGS ?=
# Multi30k is read from this local mirror when it exists (set it empty to download by URL).
export NMT_MULTI30K_MIRROR ?= $(if $(wildcard ../shared/data/multi30k/train.en.gz),$(abspath ../shared/data/multi30k),)

.PHONY: all install test test-heavy test-fast data train average eval export table table3 table3-proxy plots lint clean bench-install bench gpu-check device-bundle

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
	$(BIN)/python -m pip install -e ".[dev,export,cluster]"
	@touch $(STAMP)

# The environment is (re)installed when missing or when pyproject.toml changed since.
$(STAMP): pyproject.toml
	$(MAKE) install

all: train eval table

# The default pipeline on a 3,000-pair slice with a 1+1-layer model (configs/experiment/smoke.yaml).
.PHONY: smoke
smoke: $(STAMP)
	$(BIN)/nmt-prepare experiment=smoke $(ARGS)
	$(BIN)/nmt-train experiment=smoke $(ARGS)
	$(BIN)/nmt-average experiment=smoke $(ARGS)
	$(BIN)/nmt-evaluate experiment=smoke $(ARGS)

# Tests run in TEST_WORKERS processes (pytest-xdist; each test uses one thread): 2 keeps a
# 2-core machine busy; TEST_WORKERS=0 runs them in this process.
TEST_WORKERS ?= 2

test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) -m "not heavy" tests

test-heavy: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) -m heavy tests

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) tests/unit

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

# The paper's Table 3 (section 6.2): every row of configs/table3/ trained and evaluated on the
# development set (one Hydra multirun; rows already done are skipped), then written to
# runs/results.md. On a cluster: ARGS="hydra/launcher=slurm_torchrun hydra.launcher.partition=..."
table3: data
	$(BIN)/nmt-train -m experiment=$(EXP) 'table3=glob(*)' $(ARGS)
	$(BIN)/nmt-table

# Table 3 at CPU scale (experiment=table3_proxy): the base row with three seeds first, then
# every other row; about four hours on a 2-core CPU, resumable (finished rows are skipped).
# The table and its plot go to $(TABLE3_PROXY_OUT).md and .png; the committed result is
# rebuilt from the finished rows (nothing is trained again) with TABLE3_PROXY_OUT=docs/table3_proxy.
TABLE3_PROXY := experiment=table3_proxy
TABLE3_PROXY_OUT ?= runs/table3_proxy/results
table3-proxy: $(STAMP)
	$(BIN)/nmt-prepare $(TABLE3_PROXY)
	$(BIN)/nmt-train -m $(TABLE3_PROXY) table3=base trainer.seed=1,2,3 $(ARGS)
	$(BIN)/nmt-train -m $(TABLE3_PROXY) 'table3=glob(*,exclude=base)' $(ARGS)
	$(BIN)/nmt-table 'table.tables=[table3]' 'table.results_glob=runs/table3_proxy/**/results.json' \
		table.output=$(TABLE3_PROXY_OUT).md table.table3_plot=$(TABLE3_PROXY_OUT).png

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
	$(BENCH_BIN)/python -m pip install -e ".[export]"
	# fairseq builds C extensions against torch: without build isolation it uses the torch
	# above instead of pulling a CUDA torch (gigabytes) into a throw-away build environment
	$(BENCH_BIN)/python -m pip install cython "setuptools<81" wheel numpy
	$(BENCH_BIN)/python -m pip install --no-build-isolation $(BENCH_PEERS)

bench:
	$(BENCH_BIN)/nmt-prepare experiment=$(EXP)
	$(BENCH_BIN)/python scripts/bench/bench_train.py $(BENCH_TRAIN_ARGS)
	$(BENCH_BIN)/python scripts/bench/bench_decode.py $(BENCH_DECODE_ARGS)

# The report goes to $(GPU_CHECK_OUT).md and .json, beside the check's runs (runs/gpu_check).
GPU_CHECK_OUT ?= runs/gpu_check/report
gpu-check:
	$(BIN)/python scripts/cluster/gpu_check.py --out $(GPU_CHECK_OUT)

# What a GPU machine with torch and nothing of ours needs for scripts/cluster/device_measure.py:
# the wheels of hydra-core, omegaconf and antlr4 (the versions installed here) and the Multi30k
# files (from NMT_MULTI30K_MIRROR), in $(DEVICE_BUNDLE)/ (ignored by git; carry it to the machine).
DEVICE_BUNDLE ?= device_bundle
device-bundle: $(STAMP)
	@test -n "$(NMT_MULTI30K_MIRROR)" || { echo "error: set NMT_MULTI30K_MIRROR to the folder with the Multi30k files" >&2; exit 2; }
	rm -rf $(DEVICE_BUNDLE).tmp && mkdir -p $(DEVICE_BUNDLE).tmp/wheels $(DEVICE_BUNDLE).tmp/multi30k
	$(BIN)/python -m pip download --quiet --no-deps --only-binary=:all: -d $(DEVICE_BUNDLE).tmp/wheels \
		"hydra-core==$$($(BIN)/python -c 'import hydra; print(hydra.__version__)')" \
		"omegaconf==$$($(BIN)/python -c 'import omegaconf; print(omegaconf.__version__)')"
	$(BIN)/python -m pip wheel --quiet --no-deps -w $(DEVICE_BUNDLE).tmp/wheels \
		"antlr4-python3-runtime==$$($(BIN)/python -c 'from importlib.metadata import version; print(version("antlr4-python3-runtime"))')"
	cp $(NMT_MULTI30K_MIRROR)/*.gz $(DEVICE_BUNDLE).tmp/multi30k/
	rm -rf $(DEVICE_BUNDLE) && mv $(DEVICE_BUNDLE).tmp $(DEVICE_BUNDLE)
	@du -sh $(DEVICE_BUNDLE)

lint:
	$(BIN)/ruff check src tests scripts

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
