"""`llmgw engine ...`: run one inference engine process (the agent starts these)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Literal

import cyclopts

engine_app = cyclopts.App(name="engine", help="Run one inference engine process (the agent starts these).")


@engine_app.command(name="sim")
def sim(
    *,
    host: str = "127.0.0.1",
    port: int,
    model: str,
    role: Literal["chat", "embedding", "guard"] = "chat",
    tokens_per_s: float = 0.0,
    startup_delay: float = 0.0,
    fail_start: bool = False,
) -> None:
    """The simulator: an OpenAI-compatible server with deterministic answers.

    Parameters
    ----------
    host: address to listen on
    port: port to listen on
    model: the model name it answers as
    role: chat, embedding or guard (Llama Guard-style answers)
    tokens_per_s: generation speed; 0 answers at once
    startup_delay: seconds to wait before listening (a slow model load)
    fail_start: exit with an error instead of serving (failure injection)
    """
    from llmgw.engines import watch_parent
    from llmgw.engines.sim import SimOptions, run

    watch_parent()
    sys.exit(run(SimOptions(host=host, port=port, model=model, role=role, tokens_per_s=tokens_per_s,
                            startup_delay=startup_delay, fail_start=fail_start)))


@engine_app.command(name="llama-cpp")
def llama_cpp(
    *,
    host: str = "127.0.0.1",
    port: int,
    model: str,
    role: Literal["chat", "embedding", "guard"] = "chat",
    weights: Path,
    ctx_size: int = 2048,
    threads: int | None = None,
    parallel: int | None = None,
) -> None:
    """llama.cpp's native server on CPU, through the prebuilt xllamacpp wheel.

    Parameters
    ----------
    weights: path of the GGUF file
    ctx_size: context length
    threads: CPU threads (default: llama.cpp's choice)
    parallel: concurrent sequences
    """
    from llmgw.engines import watch_parent
    from llmgw.engines.llamacpp import run

    watch_parent()
    sys.exit(run(host=host, port=port, model=model, role=role, weights=str(weights), ctx_size=ctx_size,
                 threads=threads, parallel=parallel))
