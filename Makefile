# delayq: `make demo` runs the main job, `make test` runs the whole suite. Nothing else is needed.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: install lock up down status lint test test-fast demo bench soak jar clean

install: $(STAMP)

# Every part of delayq (extras dev: node, reconcile, the local stack; test), at the versions CI passed with:
# constraints.txt pins them, so a fresh clone does not get whatever was released this morning.
$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip setuptools wheel
	$(BIN)/pip install -q -c constraints.txt -e ".[dev,test]"
	@touch $(STAMP)

# Newer versions within pyproject.toml's ranges, into the lock files (then `make test` before committing them).
UV_COMPILE = $(BIN)/uv pip compile -q --upgrade --python-version 3.11 --no-annotate --no-header pyproject.toml
lock: install
	$(BIN)/pip install -q uv
	{ sed -n '/^#/p' constraints.txt; $(UV_COMPILE) --extra dev --extra test; } > constraints.txt.new
	{ sed -n '/^#/p' constraints-quix.txt; $(UV_COMPILE) --extra quix; } > constraints-quix.txt.new
	mv constraints.txt.new constraints.txt && mv constraints-quix.txt.new constraints-quix.txt

up: install
	$(BIN)/delayq dev up

down:
	@if [ -x $(BIN)/delayq ]; then $(BIN)/delayq dev down; else echo "nothing installed, nothing running"; fi

status: install
	$(BIN)/delayq dev status

# ruff (lint and import order) on everything, mypy on the runtime packages. mypy reads them under
# their import names (delayq.proxy, ...), which only the wheel's layout has: .lint/ links them so.
LINT_TREE := .lint/delayq
PARTS := proxy store election delay_service spark dev demo bench
lint: install
	@rm -rf .lint && mkdir -p $(LINT_TREE)
	@for f in delayq/*; do ln -s ../../$$f $(LINT_TREE)/; done
	@for p in $(PARTS); do ln -s ../../$$p $(LINT_TREE)/$$p; done
	$(BIN)/ruff check .
	$(BIN)/mypy

# The test session starts the embedded stack if it is not running and stops what it started.
test: install lint
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# Everything but the slow fault-injection tests.
test-fast: install
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

demo: install
	$(BIN)/delayq demo

# The continuous reconciliation's JVM step (spark/jvm/src) into spark/jvm/delayq-spark.jar, which is kept in the
# tree: the images run Java, they do not compile it. Needs a JDK 17 (javac); the unit tests fail on a stale jar.
jar: install
	$(BIN)/python spark/jvm/build.py

# The benchmark suite (about 45 minutes); writes bench/results.json and BENCHMARKS.md.
bench: install
	$(BIN)/delayq bench

# The chaos soak (30 minutes + drain + reconciliation) on a stack of its own: faults from a printed seed,
# every delayed message checked. SOAK_ARGS="--duration 2m --seed 7" for a short one or a replay.
SOAK_ARGS ?= --duration 30m --rate 500
soak: install
	$(BIN)/delayq soak $(SOAK_ARGS)

clean: down
	rm -rf $(VENV) build *.egg-info
