# Every target installs what it needs into .venv (created on first use) with the tested pins.
# The main job needs only the grader's extra (numpy, matplotlib, tqdm: a 0.2 GB environment); the
# tests and the models need every extra (torch, Ray, TensorBoard, onnxruntime, the RL toolkits
# with JAX, ...: about 3 GB). One stamp per set, so that `make run` stays lean, a later
# `make test` adds the rest, and `make run` after `make test` installs nothing (the full set
# includes the grader's: its recipe touches both stamps).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
EVAL_STAMP := $(VENV)/.installed-eval
ALL_STAMP := $(VENV)/.installed-all
WORKERS ?= 2

# The nine scripted policies, as agents/registry.py's HEADLINE lists them (asked when a recipe runs).
NINE = $$($(PY) -c 'from agents.registry import HEADLINE; print(",".join(HEADLINE))')

.PHONY: run test bench grade-models board example-study datasets offline-study clean system verifiers

# The operating-system sandbox of outside policies needs bubblewrap (`bwrap`), and the results
# site's tests a browser (Debian's `chromium`, run headless). Installed here where missing and we
# can (root with apt-get, as in CI); elsewhere those tests skip and say which package to install.
system:
	@missing=""; command -v bwrap >/dev/null || missing="bubblewrap"; \
	  command -v chromium >/dev/null || command -v chromium-browser >/dev/null || \
	  missing="$$missing chromium"; \
	  [ -z "$$missing" ] || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing) \
	  >/dev/null; } || echo "note: missing $$missing: the sandbox (bubblewrap) or browser \
	(chromium) tests will skip"

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(EVAL_STAMP): pyproject.toml constraints.txt | $(PY)
	$(PY) -m pip install --quiet -c constraints.txt -e ".[eval]"
	touch $@

$(ALL_STAMP): pyproject.toml constraints.txt | $(PY)
	$(PY) -m pip install --quiet -c constraints.txt -e ".[eval,train,model,ray,inspect,onnx,toolkits,dev]"
	touch $@ $(EVAL_STAMP)

# The benchmark as a `verifiers` environment (`eval/models/hub/`, id `finality-gym-env`) lives in a
# venv of its own: verifiers pins an openai client older than constraints.txt's, so it is never
# installed into .venv, and this one takes no pins of ours (no -c constraints.txt). It holds
# verifiers, finality-gym with the extras the grader imports, the environment package and pytest;
# agents/ and eval/ run from the repository root, which a .pth file puts on its path (as running
# from the root does for .venv). `make run` never builds it; `make test` does, to run its test.
VF_VENV := .venv-verifiers
VF_PY := $(VF_VENV)/bin/python
VF_STAMP := $(VF_VENV)/.installed

$(VF_STAMP): pyproject.toml eval/models/hub/pyproject.toml
	$(PYTHON) -m venv $(VF_VENV)
	$(VF_PY) -m pip install --quiet --upgrade pip
	$(VF_PY) -m pip install --quiet "verifiers>=0.4,<0.5" -e ".[eval,model,dev]" -e eval/models/hub
	$(VF_PY) -c 'import pathlib, sysconfig; pathlib.Path(sysconfig.get_paths()["purelib"], \
	  "finality_gym_repository.pth").write_text(str(pathlib.Path.cwd()) + "\n")'
	touch $@

verifiers: $(VF_STAMP)  ## .venv-verifiers: verifiers and the finality-gym-env environment

run: $(EVAL_STAMP)  ## the main job: the headline evaluation
	$(PY) -m eval headline --workers $(WORKERS) --out results/headline

# One worker runs each test file whole (`--dist loadfile`): a module-scoped fixture (a trained
# sweep, a graded attack run) is then made once, not once per worker that runs one of its tests.
test: $(ALL_STAMP) $(VF_STAMP) system  ## the whole test suite (the verifiers env's in its venv)
	$(PY) -m pytest -n $(WORKERS) --dist loadfile tests
	$(VF_PY) -m pytest tests/model/test_verifiers_env.py

bench: $(EVAL_STAMP)  ## the speed benchmarks of the README
	$(PY) benchmarks/engine.py

grade-models: $(ALL_STAMP)  ## the shipped PPO models with the nine scripted policies, both splits
	for split in public regenerated; do \
	  $(PY) -m eval headline --split $$split --policies $(NINE),ppo:models/ppo_full.zip \
	    --workers $(WORKERS) --no-progress --out results/models/ppo_full_$$split && \
	  $(PY) -m eval headline --split $$split --probe none \
	    --policies $(NINE),ppo:models/ppo_noprobe.zip \
	    --workers $(WORKERS) --no-progress --out results/models/ppo_noprobe_$$split || exit 1; \
	done

# The shipped baselines of every probe arm: the nine scripted policies and the five-seed PPO
# models of docs/sweeps/ARM (models/baselines/ARM/seed_K.onnx, the best model of each training
# seed), as bundles `ppo.ARM.seedK` and `RULE.ARM` verified on the private split of a seed made
# for the docs and published (it is public, so this split is a demonstration, not a private one),
# as docs/trust.md's operator would. `eval private-baselines` then reads the seeds' private rows
# into docs/sweeps (the README table's private-split column).
ARMS := full none delayed rate_limited identity
BOARD := results/board
board: $(ALL_STAMP)  ## the leaderboard of the shipped baselines, every arm (README's screenshot)
	mkdir -p $(BOARD)/bundles
	for arm in $(ARMS); do \
	  for p in $$(echo $(NINE) | tr , ' '); do b=$(BOARD)/bundles/$$p.$$arm.finality; [ -f $$b ] || \
	    $(PY) -m eval submit $$p --name $$p.$$arm --probe $$arm --out $$b || exit 1; done; \
	  for k in 0 1 2 3 4; do b=$(BOARD)/bundles/ppo.$$arm.seed$$k.finality; [ -f $$b ] || \
	    $(PY) -m eval submit onnx:models/baselines/$$arm/seed_$$k.onnx --name ppo.$$arm.seed$$k \
	      --probe $$arm --out $$b || exit 1; done; \
	done
	$(PY) -m eval verify $(BOARD)/bundles/*.finality --master-seed-file docs/leaderboard/docs_master_seed \
	  --workers $(WORKERS) --no-progress --out $(BOARD)/board
	$(PY) -m eval leaderboard $(BOARD)/board --out $(BOARD)/site

# examples/masked_ppo.py at the budget of the shipped MaskablePPO of the no-probe arm
# (docs/sweeps/none: 1M steps of the recipe), five seeds (WORKERS at a time; a seed without its
# graded regenerated split is trained again from scratch), each graded beside the nine scripted
# policies, then read as a sweep (eval/sweeps/aggregate.py) into docs/sweeps/example_none, which
# `eval versus` compares with the shipped one (docs/training.md, "A trainer of your own").
EXAMPLE := runs/example_none
example-study: $(ALL_STAMP)  ## the one-file trainer's five seeds on the no-probe arm, as a sweep
	mkdir -p $(EXAMPLE)
	for k in 0 1 2 3 4; do [ -f $(EXAMPLE)/seed_$$k/eval_regenerated/summary.json ] || echo $$k; \
	done | xargs -P $(WORKERS) -I K sh -c 'rm -rf $(EXAMPLE)/seed_K && $(PY) \
	  examples/masked_ppo.py --env-id FinalityNoProbe-v0 --total-timesteps 1000000 --seed K \
	  --against all --workers 1 --out $(EXAMPLE)/seed_K > $(EXAMPLE)/seed_K.log 2>&1 \
	  || { tail $(EXAMPLE)/seed_K.log; exit 255; }'
	$(PY) -c "from pathlib import Path; from train.sweep import seed_run; \
	  from eval.sweeps import aggregate; out = Path('$(EXAMPLE)'); \
	  aggregate.run(out, {k: seed_run(out / f'seed_{k}') for k in range(5)}, 'none', \
	                'masked PPO (examples/masked_ppo.py)')"
	mkdir -p docs/sweeps/example_none
	cp $(EXAMPLE)/summary.json $(EXAMPLE)/report.md $(EXAMPLE)/seeds.png docs/sweeps/example_none/

# Offline RL on the full arm (docs/training.md, "Offline RL"): the four Minari datasets of
# `python -m train dataset` (public split, fault seeds 0-4), then behaviour cloning and
# discrete CQL from each, five seeds each (WORKERS at a time; a seed without its graded
# regenerated split is trained again from scratch), each algorithm and family's seeds read as a
# sweep into a folder of docs/sweeps/offline_full.
DATASETS := runs/datasets
OFFLINE := runs/offline_full
FAMILIES := expert medium mixed random
datasets: $(ALL_STAMP)  ## the full arm's four Minari datasets, into runs/datasets
	for f in $(FAMILIES); do [ -d $(DATASETS)/finality-full/$$f-v0 ] || \
	  $(PY) -m train dataset --family $$f --arm full --out $(DATASETS) || exit 1; done
offline-study: datasets  ## BC and CQL from each dataset, five seeds each, as sweeps
	for a in bc cql; do for f in $(FAMILIES); do for k in 0 1 2 3 4; do \
	  [ -f $(OFFLINE)/$${a}_$$f/seed_$$k/eval_regenerated/summary.json ] || echo $$a $$f $$k; \
	done; done; done | xargs -P $(WORKERS) -L 1 sh -c 'd=$(OFFLINE)/$$0_$$1; rm -rf $$d/seed_$$2 \
	  && mkdir -p $$d && $(PY) -m train offline --algo $$0 --dataset finality-full/$$1-v0 \
	  --datasets $(DATASETS) --seed $$2 --workers 1 --out $$d/seed_$$2 > $$d/seed_$$2.log 2>&1 \
	  || { tail $$d/seed_$$2.log; exit 255; }'
	for a in bc cql; do for f in $(FAMILIES); do d=$(OFFLINE)/$${a}_$$f; $(PY) -c "from \
	  pathlib import Path; from train.sweep import seed_run; from eval.sweeps import aggregate; \
	  out = Path('$$d'); aggregate.run(out, {k: seed_run(out / f'seed_{k}') for k in \
	  range(5)}, 'full', '$$a on $$f')" && mkdir -p docs/sweeps/offline_full/$${a}_$$f && \
	  cp $$d/summary.json $$d/report.md $$d/seeds.png docs/sweeps/offline_full/$${a}_$$f/ \
	  || exit 1; done; done

clean:
	rm -rf $(VENV) $(VF_VENV) results .pytest_cache .hypothesis
