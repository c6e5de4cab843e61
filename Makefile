# The two commands README.md opens with. Each sets up .venv on a fresh machine first.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test bench
demo: $(VENV)/.installed
	$(VENV)/bin/autoplace demo

test: $(VENV)/.installed
	$(PY) -m pytest -q -p no:cacheprovider --durations=25

# The benchmarks, one line each; run one with `$(PY) -m benchmarks NAME` (benchmarks/README.md).
bench: $(VENV)/.installed
	$(PY) -m benchmarks

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@
