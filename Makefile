# Everything a user or CI runs. `make demo` and `make test` create .venv when needed.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
WORKDIR ?= workdirs/demo
# The demo's run; configs/runs/demo.gin is BERT-Tiny (MLM + NSP), e.g. with WORKDIR=workdirs/demo_bert.
DEMO_GIN ?= configs/runs/demo_deberta.gin
# 8 fake CPU devices so sharding tests see a mesh; harmless for the demo (it uses them all).
TEST_ENV := XLA_FLAGS=--xla_force_host_platform_device_count=8 TF_CPP_MIN_LOG_LEVEL=2

.PHONY: demo demo-glue test test-extended test-fast install lint clean-demo bench bench-optimisations bench-peer-venv bench-accelerator \
	check-accelerator-requirements

# pip installs without compiling every module to bytecode (--no-compile: about 100 s on 2
# cores, for the thousands of TensorFlow and torch modules nothing imports); Python writes the
# bytecode of what is imported at its first import instead, also where the environment says not
# to (PYTHONDONTWRITEBYTECODE: without bytecode every process would compile TensorFlow again,
# about 20 s each).
unexport PYTHONDONTWRITEBYTECODE

$(VENV)/.installed: requirements.txt requirements-test.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet --no-compile -r requirements.txt -r requirements-test.txt
	touch $@

install: $(VENV)/.installed

demo: $(VENV)/.installed
	TF_CPP_MIN_LOG_LEVEL=2 $(PY) -m pretrain.demo --workdir=$(WORKDIR) --gin_file=$(DEMO_GIN)

# GLUE end to end, offline: fine-tune the demo's pretrained model on a GLUE-format task made
# from the embedded corpus. Runs `make demo` first: its pretraining when it has not finished
# (a shorter one leaves the model at chance on the task), else only its report (and its
# refusal of a workdir of another demo model).
demo-glue: $(VENV)/.installed
	TF_CPP_MIN_LOG_LEVEL=2 $(PY) -m pretrain.demo --workdir=$(WORKDIR) --gin_file=$(DEMO_GIN)
	$(PY) -m finetune.demo_task --output=$(WORKDIR)/glue_data
	TF_CPP_MIN_LOG_LEVEL=2 $(PY) -m finetune.glue --init_from=$(WORKDIR)/run --tasks=word_order \
		--glue_dir=$(WORKDIR)/glue_data --workdir=$(WORKDIR)/glue --gin_file=configs/glue/demo.gin
	cat $(WORKDIR)/glue/results.md

# Two pytest workers (pytest-xdist), one test file each at a time so module fixtures are shared,
# files in collection order (tests/conftest.py puts the longest first; xdist would otherwise
# start the files with the most tests first and the 6-minute fault-injection file last).
# Compiled steps are shared through the persistent cache tests/conftest.py sets up.
# First the layers contract (pyproject.toml [tool.importlinter]: no folder imports from a floor
# above its own, lazy imports included).
TEST_WORKERS ?= 2
# --durations: the 25 slowest tests at the end of every run, so CI logs show where the time goes.
PYTEST := $(TEST_ENV) $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25
# Three tiers (docs/testing.md): `make test` is every test but the extended tier (each kind of
# proof once: parity per family, resume, mesh, the data statistics, the one-line errors);
# `make test-extended` is the rest (every objective's resume and mesh proof, the end-to-end
# runs of the tools, local pods, fault injection, demos, ablation grids, benchmarks); CI
# (.ci/run) runs both, the second on the first's compilation cache.
test: $(VENV)/.installed
	$(VENV)/bin/lint-imports --no-cache
	$(PYTEST) -m "not extended"

# The extended tier also compiles for TPU slices on this machine (pretrain.tpu_compile), with
# libtpu (a 210 MB wheel, from requirements-tpu.txt), which `make test` and `make demo` leave out.
$(VENV)/.libtpu: $(VENV)/.installed requirements-tpu.txt
	$(VENV)/bin/pip install --quiet --no-compile --no-deps $$(grep -E '^libtpu==' requirements-tpu.txt)
	touch $@

test-extended: $(VENV)/.installed $(VENV)/.libtpu
	$(PYTEST) -m extended

# The inner loop: the contract and the tests that compile no model step; those marked slow
# (over about 1.5 s on an empty compilation cache: model steps, training runs, subprocesses)
# are left out.
test-fast: $(VENV)/.installed
	$(VENV)/bin/lint-imports --no-cache
	$(PYTEST) -m "not slow and not extended"

# The speed peer, HF transformers' Flax BERT, in its own venv (never in requirements.txt):
# transformers 4.57.6 is the last release with Flax models; jax/flax/optax as ours.
PEER_VENV ?= .venv-peer
$(PEER_VENV)/.installed: requirements.txt
	$(PYTHON) -m venv $(PEER_VENV)
	$(PEER_VENV)/bin/pip install --quiet --upgrade pip
	$(PEER_VENV)/bin/pip install --quiet transformers==4.57.6 $$(grep -E '^(jax|flax|optax|numpy)==' requirements.txt)
	touch $@

bench-peer-venv: $(PEER_VENV)/.installed

# Ours vs the peer, BERT-base, batch 32 x 128, float32 and bf16 compute, side by side
# (about 14 minutes on 2 CPU cores).
BENCH_ARGS ?= --gin_file=configs/models/bert_base.gin --batch_size=32 --seq_len=128 --steps=5
bench: $(VENV)/.installed $(PEER_VENV)/.installed
	$(PY) -m bench.compare $(BENCH_ARGS) --peer_python=$(PEER_VENV)/bin/python

# What each optimisation buys: ours with and without it, alternating in one process
# (BERT-base, batch 8 x 128, in bf16, then the float32 row; about 20 minutes on 2 CPU cores).
bench-optimisations: $(VENV)/.installed $(PEER_VENV)/.installed
	$(PY) -m bench.compare --gin_file=configs/models/bert_base.gin --batch_size=8 --seq_len=128 --steps=3 \
		--dtypes=bfloat16,float32 --optimisations --peer_python=$(PEER_VENV)/bin/python

# Every family member's step at its recipe's shape in bf16, and the peer at BERT-base 128 and
# BERT-large 512, in one call (bench/suite.py): for a GPU or TPU host; the peer's rows need
# its venv (make bench-peer-venv), without it they say so.
bench-accelerator: $(VENV)/.installed
	$(PY) -m bench.suite --dtype=bfloat16 --peer_python=$(PEER_VENV)/bin/python

# The accelerator requirement files resolve against the package index (network; nothing is
# installed): what `pip install -r requirements-gpu.txt` / `-tpu.txt` would fetch.
check-accelerator-requirements: $(VENV)/.installed
	$(VENV)/bin/pip install --dry-run --ignore-installed --quiet -r requirements-gpu.txt
	$(VENV)/bin/pip install --dry-run --ignore-installed --quiet -r requirements-tpu.txt
	@echo "requirements-gpu.txt and requirements-tpu.txt resolve"

clean-demo:
	rm -rf $(WORKDIR)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
