# Two commands on a fresh clone: `make conformance` (the kit on the bundled engines) and
# `make test` (the whole suite). Both create .venv and install into it when needed; re-running
# is fast because the install is stamped against pyproject.toml.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build by default. A GPU user installs a CUDA build of torch into $(VENV) first;
# it is kept, because this spec is only installed when torch is missing.
TORCH ?= torch==2.13.0
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# pytest-xdist workers for the main test run (the kit's summary is aggregated across them)
WORKERS ?= 2

.PHONY: conformance conformance-others test bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet "$(TORCH)"
	$(PY) -m pip install --quiet -e ".[hf,serve]"
	touch $(STAMP)

# The kit on each bundled engine: the reference, the fast engine, and transformers' assisted
# generation and prompt lookup (its known failures are listed, with reasons, in the xfails file).
conformance: $(STAMP)
	$(PY) -m pytest properties/ --impl=reference $(PYTEST_ARGS)
	$(MAKE) --no-print-directory conformance-others

conformance-others: $(STAMP)
	$(PY) -m pytest properties/ --impl=fast -n $(WORKERS) $(PYTEST_ARGS)
	$(PY) -m pytest properties/ --impl=transformers --xfails-file=properties/known/transformers.txt -n $(WORKERS) $(PYTEST_ARGS)
	$(PY) -m pytest properties/ --impl=transformers-lookup -n $(WORKERS) $(PYTEST_ARGS)

# The whole suite (tests/, fast/ and the kit on the reference), then the kit on the other engines.
test: $(STAMP)
	$(PY) -m pytest -n $(WORKERS) $(PYTEST_ARGS)
	$(MAKE) --no-print-directory conformance-others

bench: $(STAMP)
	$(PY) -m pytest --benchmark-only fast/ $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .hypothesis .pytest_cache .benchmarks
