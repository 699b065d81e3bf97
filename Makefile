# Two commands on a fresh clone: `make demo` (main job) and `make test` (tests).
# Both create .venv and install the package with the CPU pins in constraints.txt.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-unit test-integration acceptance acceptance-quick lint bench docs clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e ".[test]"
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/hetmm demo --out out/demo

# tests/unit: no Ray, no network server, seconds (the loop of a day's work); tests/integration: real
# Ray, Serve over HTTP, a moto S3 server, a browser. `make test` runs both, unit first.
test: $(STAMP)
	$(PY) -m pytest -q tests/unit tests/integration

test-unit: $(STAMP)
	$(PY) -m pytest -q tests/unit

test-integration: $(STAMP)
	$(PY) -m pytest -q tests/integration

# tests/acceptance: whole features at the size their issues state (hours on 2 cores; the runs that need
# ../shared skip without it). Not in `make test`; acceptance-quick runs the same code at toy sizes (minutes).
acceptance: $(STAMP)
	$(PY) -m pytest -q -s -m acceptance tests/acceptance

acceptance-quick: $(STAMP)
	HETMM_ACCEPTANCE_QUICK=1 $(PY) -m pytest -q -s -m acceptance tests/acceptance

lint: $(STAMP)
	$(VENV)/bin/ruff check hetmm_ray tests benchmarks
	$(VENV)/bin/ruff format --check hetmm_ray tests benchmarks
	$(VENV)/bin/mypy  # [tool.mypy] in pyproject.toml: hetmm_ray/

# The documentation site (mkdocs.yml), built offline into site/; --strict: a broken link fails the build.
# The reference pages are generated from the code at build time (docs/hooks/reference.py).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

bench: $(STAMP)
	$(PY) benchmarks/bench_atmm.py einsum
	$(PY) benchmarks/bench_throughput.py e2e

clean:
	rm -rf $(VENV) out site .pytest_cache
