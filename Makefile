# Two entry points for a fresh machine with Python 3.11: `make run` and `make test`.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
WORKDIR ?= workdir

.PHONY: run test install install-test bench clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(VENV)/.installed: $(VENV)/bin/python setup.py requirements.txt
	$(PY) -m pip install -q -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[test]'
	touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

# The tiny curriculum up to Phase B, then a short held-out evaluation table (Base, SFT,
# Phase A, Phase B on a handful of HotpotQA validation questions).
run: install
	$(PY) experiments/run.py --config=phase_b.py --workdir=$(WORKDIR)
	$(PY) experiments/run.py --config=eval_hotpotqa.py --workdir=$(WORKDIR)

test: install-test
	$(PY) -m pytest -q tests

clean:
	rm -rf $(VENV) $(WORKDIR) .pytest_cache
