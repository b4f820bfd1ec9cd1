# Two commands: `make run` (simulate on built-in defaults) and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Where install-test gets torch: empty = pip's configured index (PyPI serves the CUDA build
# on Linux); `make test TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu` for the CPU wheel.
TORCH_INDEX_URL ?=

.PHONY: run test install install-test clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install -q -e .

install-test: $(BIN)/python
	$(BIN)/pip install -q torch==2.13.0 $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL))
	$(BIN)/pip install -q -e '.[engine,server,sweep,test]'

run: install
	$(BIN)/llmsched simulate --out results
	$(BIN)/llmsched plot results

test: install-test
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) results
