"""The llama.cpp CPU engine: llama.cpp's native HTTP server from the prebuilt `xllamacpp` wheel.
Owns turning launch flags into xllamacpp parameters and the process's life until SIGTERM/SIGINT.

The wheel has no command line: `xllamacpp.Server(params)` loads the model,
starts the HTTP server in native threads and returns; this process then only
waits for a stop signal. xllamacpp is imported lazily, so the rest of llmgw
works on nodes without it.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

__all__ = ["LaunchArgs", "main", "parse_extra_args", "run"]

logger = logging.getLogger("llmgw.engine.llamacpp")

ROLES = ("chat", "embedding", "guard")
NOT_INSTALLED = "llama.cpp engine not installed: pip install 'llmgw[llamacpp]'"
_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}
# llama.cpp log verbosity: 0 output, 1 errors, 2 warnings, 3 info. Warnings and
# errors reach the agent's log; info would add per-request lines.
_LOG_VERBOSITY = 2


@dataclass(frozen=True)
class LaunchArgs:
    """The tunables that extra engine arguments may set; None keeps llama.cpp's default."""

    ctx_size: int = 2048
    threads: int | None = None
    parallel: int | None = None


_FLAGS = {"--ctx-size": "ctx_size", "--threads": "threads", "--parallel": "parallel"}


def parse_extra_args(extra_args: Sequence[str], base: LaunchArgs = LaunchArgs()) -> LaunchArgs:
    """`--ctx-size N`, `--threads N`, `--parallel N` (also `--flag=N`) over `base`; ValueError otherwise."""
    values: dict[str, Any] = {
        "ctx_size": base.ctx_size,
        "threads": base.threads,
        "parallel": base.parallel,
    }
    items = iter(extra_args)
    for arg in items:
        flag, eq, raw = arg.partition("=")
        if flag not in _FLAGS:
            raise ValueError(f"unsupported llama.cpp argument {arg!r} (accepted: {', '.join(_FLAGS)})")
        value = raw if eq else next(items, None)
        number = int(value) if value is not None and value.isascii() and value.isdigit() else 0
        if number < 1:
            raise ValueError(f"llama.cpp argument {flag} needs a positive integer, got {value!r}")
        values[_FLAGS[flag]] = number
    return LaunchArgs(**values)


def run(
    *,
    host: str,
    port: int,
    model: str,
    role: str,
    weights: str,
    ctx_size: int = 2048,
    threads: int | None = None,
    parallel: int | None = None,
    extra_args: Sequence[str] = (),
) -> int:
    """Serve `weights` as `model` on host:port until SIGTERM/SIGINT.

    A stop signal ends the process at once with status 0 (see `_exit_now`);
    otherwise it returns the exit status: 1 when the model does not load or
    the port cannot be bound, 2 for bad arguments or a missing xllamacpp.
    """
    try:
        launch = parse_extra_args(extra_args, LaunchArgs(ctx_size, threads, parallel))
    except ValueError as error:
        return _fail(2, str(error))
    if role not in ROLES:
        return _fail(2, f"unknown role {role!r}; expected one of {', '.join(ROLES)}")
    if not os.path.isfile(weights):
        return _fail(1, f"llama.cpp: weights file not found: {weights}")
    # Block the stop signals before any native thread exists, so every llama.cpp
    # thread inherits the mask and only sigwait() below ever takes them.
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        try:
            import xllamacpp  # no type information (see [tool.mypy] overrides)
        except ImportError:
            return _fail(2, NOT_INSTALLED)
        params = _params(xllamacpp, host=host, port=port, model=model, role=role, weights=weights, launch=launch)
        started = time.monotonic()
        try:
            server = xllamacpp.Server(params)
        except RuntimeError as error:
            return _fail(
                1,
                f"llama.cpp could not start model {model} from {weights} on {host}:{port}: {error} "
                "(the model file did not load or the port is taken; llama.cpp's own lines above say which)",
            )
        # `server` stays referenced until the process ends: dropping it would stop llama.cpp.
        logger.info(
            "llama.cpp serving %s (role %s) on %s, loaded in %.2f s",
            model,
            role,
            server.listening_address,
            time.monotonic() - started,
        )
        signum = signal.sigwait(_STOP_SIGNALS)
        logger.info("llama.cpp engine stopping on %s", signal.Signals(signum).name)
        _exit_now()
    finally:
        # Reached only when starting failed: a stop signal sent meanwhile must
        # not kill us with its default action once unblocked.
        while set(signal.sigpending()) & _STOP_SIGNALS:
            signal.sigwait(_STOP_SIGNALS)
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _exit_now() -> NoReturn:
    """End the process without destroying the llama.cpp server.

    Destroying it joins llama.cpp's threads while holding the GIL: tens of ms
    when idle, but forever while a client holds a stream open. The server keeps
    no state worth flushing, so the kernel closing its sockets is the cleanup.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _params(
    xllamacpp: Any, *, host: str, port: int, model: str, role: str, weights: str, launch: LaunchArgs
) -> Any:
    params = xllamacpp.CommonParams()
    params.model.path = weights
    params.hostnames = [host]
    params.port = port
    params.n_ctx = launch.ctx_size
    # The attribute is a set[str] in current wheels; older ones took a string.
    params.model_alias = model if isinstance(params.model_alias, str) else {model}
    if launch.threads is not None:
        params.cpuparams.n_threads = launch.threads
        params.cpuparams_batch.n_threads = launch.threads
    if launch.parallel is not None:
        params.n_parallel = launch.parallel
    if role == "embedding":
        params.embedding = True
    # An engine serves the gateway, not browsers: no web UI, and no CORS grant
    # that would let any web page a node's user opens read its answers.
    params.ui = False
    params.cors_origins = ""
    params.verbosity = _LOG_VERBOSITY
    return params


def _fail(status: int, message: str) -> int:
    print(message, file=sys.stderr, flush=True)
    return status


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m llmgw.engines.llamacpp`: the same flags as `llmgw engine llama-cpp`."""
    parser = argparse.ArgumentParser(prog="llmgw engine llama-cpp", description="the llama.cpp CPU engine")
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", required=True, type=int)
    parser.add_argument("--model", required=True)
    parser.add_argument("--role", default="chat", choices=ROLES)
    parser.add_argument("--weights", required=True)
    ns, extra = parser.parse_known_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return run(host=ns.host, port=ns.port, model=ns.model, role=ns.role, weights=ns.weights, extra_args=extra)


if __name__ == "__main__":
    sys.exit(main())
