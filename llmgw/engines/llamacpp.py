"""The llama.cpp CPU engine: llama.cpp's native HTTP server from the prebuilt `xllamacpp` wheel.
Owns its description (`KIND`), turning launch flags into xllamacpp parameters, and the process's life.

The wheel has no command line: `xllamacpp.Server(params)` loads the model,
starts the HTTP server in native threads and returns; this process then only
waits for a stop signal. xllamacpp is imported lazily, so the rest of llmgw
works on nodes without it.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any, NoReturn

from llmgw.domain.model import ROLES
from llmgw.engines.args import engine_parser, parse_engine_args
from llmgw.engines.base import EngineError, EngineKind, self_command
from llmgw.engines.llama_server import FAILURES
from llmgw.engines.sources import find_spec

__all__ = ["KIND", "LaunchArgs", "main", "run"]

logger = logging.getLogger("llmgw.engine.llamacpp")

_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}
# llama.cpp log verbosity: 0 output, 1 errors, 2 warnings, 3 info. Warnings and
# errors reach the agent's log; info would add per-request lines.
_LOG_VERBOSITY = 2


def not_installed(argv0: str | None = None) -> str:
    """What to do without xllamacpp, for the way this program runs (`self_command`): a
    zipapp carries its packages inside, so only a rebuild adds the engine."""
    if _is_zipapp(self_command(argv0)):
        return "llama.cpp engine not in this zipapp: rebuild it with `python build.py --with-llamacpp`"
    return "llama.cpp engine not installed: pip install 'llmgw[llamacpp]'"


def _is_zipapp(command: list[str]) -> bool:
    return command[1:2] == ["-I"] and len(command) == 3 and os.path.isfile(command[2])


def _detect(_environ: Mapping[str, str]) -> str | None:
    """xllamacpp's version when this interpreter has it (package metadata: nothing is imported)."""
    if find_spec("xllamacpp") is None:
        return None
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("xllamacpp")
    except PackageNotFoundError:
        return ""


# Same llama.cpp core as the binary, so the same lines say why a start failed.
KIND = EngineKind("xllamacpp", "llama.cpp", _detect, failures=FAILURES)


@dataclass(frozen=True)
class LaunchArgs:
    """The engine's tunables (`ENGINE_ARGS["llama.cpp"]`, one field each); None keeps llama.cpp's default."""

    ctx_size: int = 2048
    threads: int | None = None
    parallel: int | None = None
    n_gpu_layers: int | None = None  # the CPU wheel has no GPU: accepted, and changes nothing
    embedding: bool = False
    pooling: str | None = None


def run(*, host: str, port: int, model: str, role: str, weights: str, launch: LaunchArgs = LaunchArgs(),
        lora: Sequence[str] = ()) -> int:
    """Serve `weights` as `model` on host:port until SIGTERM/SIGINT.

    A stop signal ends the process at once with status 0 (see `_exit_now`);
    otherwise it returns the exit status: 1 when the model does not load or
    the port cannot be bound, 2 for bad arguments or a missing xllamacpp.
    """
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
            return _fail(2, not_installed())
        params = _params(xllamacpp, host=host, port=port, model=model, role=role, weights=weights, launch=launch)
        if lora:  # LoRA adapters, each at scale 0 until a request names it (its `lora` field)
            params.lora_adapters = [_adapter(xllamacpp, file) for file in lora]
            params.lora_init_without_apply = True
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
    if role in ("embedding", "rerank") or launch.embedding:
        params.embedding = True
    if role == "rerank" and launch.pooling is None:  # what llama-server's --reranking sets: /v1/rerank served
        params.pooling_type = xllamacpp.llama_pooling_type.LLAMA_POOLING_TYPE_RANK
    if launch.pooling is not None:
        params.pooling_type = getattr(xllamacpp.llama_pooling_type, f"LLAMA_POOLING_TYPE_{launch.pooling.upper()}")
    if launch.n_gpu_layers is not None:
        params.n_gpu_layers = launch.n_gpu_layers
    # An engine serves the gateway, not browsers: no web UI, and no CORS grant
    # that would let any web page a node's user opens read its answers.
    params.ui = False
    params.cors_origins = ""
    params.verbosity = _LOG_VERBOSITY
    return params


def _adapter(xllamacpp: Any, file: str) -> Any:
    info = xllamacpp.CommonAdapterLoraInfo()
    info.path = file
    info.scale = 0.0
    return info


def _fail(status: int, message: str) -> int:
    print(message, file=sys.stderr, flush=True)
    return status


def main(argv: Sequence[str] | None = None) -> int:
    """`llmgw engine llama-cpp` and `python -m llmgw.engines.llamacpp`: where and what to serve,
    then the tunables of `ENGINE_ARGS["llama.cpp"]`."""
    parser = engine_parser("llama.cpp", prog="llmgw engine llama-cpp",
                           description="llama.cpp's native server on CPU, through the prebuilt xllamacpp wheel",
                           role_help="what the model serves as")
    parser.add_argument("--weights", required=True, help="path of the GGUF file")
    parser.add_argument("--lora", action="append", default=[], metavar="FILE",
                        help="a LoRA adapter GGUF to load, at scale 0 until a request names it; repeatable")
    ns, extra = parser.parse_known_args(argv)
    try:
        launch = LaunchArgs(**parse_engine_args("llama.cpp", extra))
    except EngineError as error:
        return _fail(2, f"llama.cpp: {error.message}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return run(host=ns.host, port=ns.port, model=ns.model, role=ns.role, weights=ns.weights, launch=launch,
               lora=ns.lora)


if __name__ == "__main__":
    sys.exit(main())
