# nobackfill: `make test` creates .venv if missing, installs, and runs the suite.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: test test-slow install lint serve demo bench-base bench-gpu docs docs-serve clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# Reinstall when pyproject.toml changes. torch/torchvision come from the registry's
# default (CUDA) builds, which run on CPU too.
$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

# The service on this machine: bootstraps a demo on first start, then the embedded worker
# and the gateway on http://127.0.0.1:8000/ (settings: NOBACKFILL_* variables, .env.example).
serve: $(STAMP)
	$(PY) -m service.stack.launch

# The whole story (docs/concepts/index.md) on the synthetic world, non-interactively: a
# table per step, runs/demo/report.md with plots. How long it takes: docs/how-to/demo.md.
DEMO_OUT ?= runs/demo
demo: $(STAMP)
	$(VENV)/bin/nobackfill demo --out $(DEMO_OUT)

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

lint: $(STAMP)
	$(VENV)/bin/ruff check training service worker tests

bench-base: $(STAMP)
	$(VENV)/bin/nobackfill bench base --json

# The check of a GPU host: training, then migration and rerank on the models it trained,
# each part under a time limit, one table at the end (deploy/gpu-check.sh; QUICK=1: every
# part at its smallest, on the CPU too).
bench-gpu: $(STAMP)
	PY=$(VENV)/bin/python deploy/gpu-check.sh

# The manual (mkdocs.yml, docs/): built into site/ with --strict, so a broken link, a page
# missing from the nav or a bad anchor fails; the reference pages are generated from the
# code at every build (docs/hooks/reference_pages.py).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --dev-addr 127.0.0.1:8001

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
