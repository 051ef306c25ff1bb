# Every target installs what it needs into .venv (created on first use) with the tested pins.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
WORKERS ?= 2

.PHONY: run test bench clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e ".[train,model,dev]"
	touch $(STAMP)

run: $(STAMP)  ## the main job: the headline evaluation
	$(PY) -m eval headline --workers $(WORKERS) --out results/headline

test: $(STAMP)  ## the whole test suite
	$(PY) -m pytest -n $(WORKERS) tests

bench: $(STAMP)  ## the speed benchmarks of the README
	$(PY) benchmarks/engine.py

clean:
	rm -rf $(VENV) results .pytest_cache .hypothesis
