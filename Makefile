# make demo / make test work on a fresh Linux machine with Python 3.11: they build .venv first.
# On a GPU machine choose your torch build, e.g. make demo TORCH_SPEC="torch==2.13.0 --index-url <cuda wheels>".

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
TEST_REDIS_URL ?= redis://127.0.0.1:6379/15
PYTEST_ARGS ?=

BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint setup clean

setup: $(STAMP)

# torch first, on its own, so that nothing later pulls a multi-GB CUDA build on a CPU machine.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q $(TORCH_SPEC)
	$(BIN)/pip install -q -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/animegamer demo

test: $(STAMP)
	ANIMEGAMER_TEST_REDIS_URL=$(TEST_REDIS_URL) bash scripts/ensure_redis.sh
	ANIMEGAMER_TEST_REDIS_URL=$(TEST_REDIS_URL) $(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) out data .pytest_cache
