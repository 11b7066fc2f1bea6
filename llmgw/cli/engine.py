"""`llmgw engine ...`: run one inference engine process (the agent starts these).

Each command hands its arguments as given to the engine's own `main`, the one
place that parses them (its tunables: `llmgw.engines.ENGINE_ARGS`); `--help`
goes there too and lists them.
"""

from __future__ import annotations

import sys
from typing import Annotated

import cyclopts
from cyclopts import Parameter

engine_app = cyclopts.App(name="engine", help="Run one inference engine process (the agent starts these).")

# Every token, flags included, reaches the engine's parser untouched.
_Tokens = Annotated[str, Parameter(allow_leading_hyphen=True)]


@engine_app.command(name="sim", help_flags=[], version_flags=[])
def sim(*tokens: _Tokens) -> None:
    """The simulator: an OpenAI-compatible server with deterministic answers (--help lists its flags)."""
    from llmgw.engines import watch_parent
    from llmgw.engines.sim import main

    watch_parent()
    sys.exit(main(tokens))


@engine_app.command(name="llama-cpp", help_flags=[], version_flags=[])
def llama_cpp(*tokens: _Tokens) -> None:
    """llama.cpp's native server on CPU, through the prebuilt xllamacpp wheel (--help lists its flags)."""
    from llmgw.engines import watch_parent
    from llmgw.engines.llamacpp import main

    watch_parent()
    sys.exit(main(tokens))
