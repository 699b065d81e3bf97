# Two commands on a fresh clone: `make demo` (main job) and `make test` (tests).
# Both create .venv and install the package with the CPU pins in constraints.txt.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint bench clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e ".[test]"
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/hetmm demo --out out/demo

test: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check hetmm_ray tests benchmarks
	$(VENV)/bin/ruff format --check hetmm_ray tests benchmarks

bench: $(STAMP)
	$(PY) benchmarks/bench_atmm.py
	$(PY) benchmarks/bench_e2e.py

clean:
	rm -rf $(VENV) out .pytest_cache
