# nobackfill: `make test` creates .venv if missing, installs, and runs the suite.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: test test-slow install lint bench-base clean

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

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

lint: $(STAMP)
	$(VENV)/bin/ruff check training service worker tests

bench-base: $(STAMP)
	$(VENV)/bin/nobackfill bench base --json

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
