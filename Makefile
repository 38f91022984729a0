# make demo / make test work on a fresh Linux machine with Python 3.11: they build .venv first.
# On a GPU machine choose your torch build, e.g. make demo TORCH_SPEC="torch==2.13.0 --index-url <cuda wheels>".

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
TEST_REDIS_URL ?= redis://127.0.0.1:6379/15
PYTEST_ARGS ?=
STACK_ARGS ?=
TEST_PROCESSES ?= 3

BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo check test stack lint setup clean

setup: $(STAMP)

# torch first, on its own, so that nothing later pulls a multi-GB CUDA build on a CPU machine. pip compiles every
# installed module one at a time; compileall does the same on every core (a fresh venv here: 81 s before, 66 s now).
# Like pip, it skips files it cannot compile (a package's Python 2 examples), so its exit status is not the build's.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --no-compile $(TORCH_SPEC)
	$(BIN)/pip install -q --no-compile -e ".[test]"
	$(BIN)/python -m compileall -q -j 0 $(VENV)/lib >/dev/null 2>&1 || true
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/animegamer demo

# Both tiers run three pytest processes (pytest-xdist) on a 2-core machine, each test file on one of them so its module
# fixtures are built once, torch on one thread in each. Most tests wait on what they started (bots, workers, servers,
# leases running out), so a third process overlaps those waits: on this 2-core machine the fast tier took 136 s with
# three against 166 s with two, the slow tier 638 s against 707 s (and it had 9 more tests). TEST_PROCESSES=2 on a
# machine with less memory.
XDIST = -n $(TEST_PROCESSES) --dist loadfile --no-loadscope-reorder
TORCH_THREADS = OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

# The fast tier, for the inner loop: no worker, Redis, PostgreSQL or Chromium of its own (tests/tiers.py).
check: $(STAMP)
	$(TORCH_THREADS) $(BIN)/python -m pytest -m "not slow" $(XDIST) $(PYTEST_ARGS)

# Everything, CI's command: both tiers in one run, then one line each (scripts/test_tiers.sh).
test: $(STAMP)
	ANIMEGAMER_TEST_REDIS_URL=$(TEST_REDIS_URL) bash scripts/ensure_redis.sh
	ANIMEGAMER_TEST_REDIS_URL=$(TEST_REDIS_URL) $(TORCH_THREADS) PYTHON=$(BIN)/python \
		bash scripts/test_tiers.sh $(XDIST) $(PYTEST_ARGS)

# The composed stack from outside (compose.yaml, tests/stack.py): both images built, a turn played, the stack taken
# down and up again with nothing lost. Needs a Docker daemon and minutes, so it is not part of `make test`.
stack: $(STAMP)
	PYTHON=$(BIN)/python bash scripts/stack.sh $(STACK_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) out data .pytest_cache
