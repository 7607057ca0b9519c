# Everything a user or CI runs. `make demo` and `make test` create .venv when needed.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
WORKDIR ?= workdirs/demo
# 8 fake CPU devices so sharding tests see a mesh; harmless for the demo (it uses them all).
TEST_ENV := XLA_FLAGS=--xla_force_host_platform_device_count=8 TF_CPP_MIN_LOG_LEVEL=2

.PHONY: demo test install lint clean-demo

$(VENV)/.installed: requirements.txt requirements-test.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -r requirements.txt -r requirements-test.txt
	touch $@

install: $(VENV)/.installed

demo: $(VENV)/.installed
	TF_CPP_MIN_LOG_LEVEL=2 $(PY) -m pretrain.demo --workdir=$(WORKDIR)

test: $(VENV)/.installed
	$(TEST_ENV) $(PY) -m pytest -q

clean-demo:
	rm -rf $(WORKDIR)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
