# Two entry points for a fresh machine with Python 3.11: `make run` and `make test`.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
WORKDIR ?= workdir

.PHONY: run test install install-test install-benchmarks bench clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(VENV)/.installed: $(VENV)/bin/python setup.py requirements.txt
	$(PY) -m pip install -q -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[test]'
	touch $@

# The benchmark adapters' packages. fast-downward-textworld (ALFWorld's planner) is
# compiled with the `python` found on PATH, so the venv's comes first; pddlgym goes in
# without its declared deps (see PDDLGYM in setup.py).
$(VENV)/.installed-benchmarks: $(VENV)/.installed-test setup.py
	PATH="$(abspath $(VENV))/bin:$$PATH" $(PY) -m pip install -q -e '.[scienceworld,babyai,alfworld,pddl-runtime]'
	$(PY) -m pip install -q --no-deps "$$(grep -o 'pddlgym==[0-9.]*' setup.py)"
	touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test
install-benchmarks: $(VENV)/.installed-benchmarks

# The whole tiny curriculum (SFT -> A -> B -> C, from the packaged pretrained base), then
# a short held-out evaluation table (Base and each phase's policy on HotpotQA validation
# questions).
run: install
	$(PY) experiments/run.py --config=phase_c.py --workdir=$(WORKDIR)
	$(PY) experiments/run.py --config=eval_hotpotqa.py --workdir=$(WORKDIR)

test: install-test
	$(PY) -m pytest -q tests

clean:
	rm -rf $(VENV) $(WORKDIR) .pytest_cache
