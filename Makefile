# Every target installs what it needs into .venv (created on first use) with the tested pins.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
WORKERS ?= 2

NINE := random,optimistic,eager,majority_vote,sop,react,reflection,finality_gate,finality_oracle

.PHONY: run test bench grade-models clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e ".[train,model,ray,dev]"
	touch $(STAMP)

run: $(STAMP)  ## the main job: the headline evaluation
	$(PY) -m eval headline --workers $(WORKERS) --out results/headline

test: $(STAMP)  ## the whole test suite
	$(PY) -m pytest -n $(WORKERS) --dist loadgroup tests

bench: $(STAMP)  ## the speed benchmarks of the README
	$(PY) benchmarks/engine.py

grade-models: $(STAMP)  ## the shipped PPO models with the nine scripted policies, both splits
	for split in public regenerated; do \
	  $(PY) -m eval headline --split $$split --policies $(NINE),ppo:models/ppo_full.zip \
	    --workers $(WORKERS) --no-progress --out results/models/ppo_full_$$split && \
	  $(PY) -m eval headline --split $$split --probe none \
	    --policies $(NINE),ppo:models/ppo_noprobe.zip \
	    --workers $(WORKERS) --no-progress --out results/models/ppo_noprobe_$$split || exit 1; \
	done

clean:
	rm -rf $(VENV) results .pytest_cache .hypothesis
