# dp2ddp developer entry points. Both `make demo` and `make test` set up their own
# virtual environment (.venv) on a fresh machine: torch is pinned through
# constraints.txt (2.13.0, the CPU build available here) for our setup and CI only.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.dp2ddp-installed
DEMO   ?= demo-out
PYTEST_ARGS ?=
VENV_LOWEST ?= .venv-lowest

.PHONY: demo test test-fast test-lowest bench docs clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[test]'
	touch $(STAMP)

# Rewrite the bundled DataParallel example, train the result under torchrun on
# CPU (2 ranks, gloo), then verify it against the original and draw the plot.
demo: $(STAMP)
	rm -rf $(DEMO) && mkdir -p $(DEMO)
	cp examples/train_cifar_dp.py $(DEMO)/train.py
	$(PY) -m dp2ddp rewrite $(DEMO)/train.py
	cd $(DEMO) && OMP_NUM_THREADS=1 ../$(VENV)/bin/torchrun --standalone --nproc_per_node=2 train_ddp.py --epochs 2
	$(PY) -m dp2ddp verify $(DEMO)/train.py --steps 0 --min-speedup 0 --plot $(DEMO)/verify.png --json $(DEMO)/verify.json
	@echo "demo: migrated script $(DEMO)/train_ddp.py, report $(DEMO)/verify.json, plot $(DEMO)/verify.png"

# The whole test suite (what CI runs: .ci/run), with its 25 slowest tests listed at the end. Costliest tests first (tests/conftest.py);
# the generated scripts' runs, and dp2ddp verify with its runs, fork from Pythons that imported
# torch once (tests/_scripts.py, tests/_verify_launch.py say what that covers);
# DP2DDP_TEST_REAL_LAUNCH=1 launches every one for real.
test: $(STAMP)
	$(PY) -m pytest -n 2 -q --durations=25 $(PYTEST_ARGS)

# The unit layer: everything in-process. Left out (they run in `make test`): the tests that
# launch torchrun (marker `torchrun`) and the `slow` ones (Python processes that import
# torch, the pre-commit hook environment, the 300-case property test). docs/development.md
# says what each layer covers.
test-fast: $(STAMP)
	$(PY) -m pytest -n 2 -q -m "not torchrun and not slow" $(PYTEST_ARGS)

# The whole suite on the lowest versions pyproject.toml admits (constraints-lowest.txt),
# in its own environment. Run by hand or by a CI job of its own (not .ci/run, which runs `make test` only):
# torch 2.2 comes from PyPI as its CUDA build: 2.8 GB to download, 5.1 GB installed.
test-lowest: $(VENV_LOWEST)/.dp2ddp-installed
	$(VENV_LOWEST)/bin/python -m pytest -n 2 -q $(PYTEST_ARGS)

$(VENV_LOWEST)/.dp2ddp-installed: pyproject.toml constraints-lowest.txt
	$(PYTHON) -m venv $(VENV_LOWEST)
	$(VENV_LOWEST)/bin/python -m pip install --quiet --disable-pip-version-check -c constraints-lowest.txt -e '.[test]'
	touch $@

bench: $(STAMP)
	$(PY) benchmarks/bench_rewrite.py
	$(PY) benchmarks/bench_check.py
	$(PY) benchmarks/bench_probe.py

# docs/rules.md: every code dp2ddp prints, generated from dp2ddp/registry.py
# (tests/test_registry.py fails when it is stale).
docs: $(STAMP)
	$(PY) -m dp2ddp.registry > docs/rules.md

clean:
	rm -rf $(VENV) $(VENV_LOWEST) $(DEMO) .pytest_cache
