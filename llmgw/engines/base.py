"""What every engine module shares: the launch (`LaunchSpec`), the group a replica runs in, the refusal
(`EngineError`), each engine's description (`EngineKind`), device variables and the self-invocation.

Standard library only, and nothing here imports an engine: the engine modules (`sim`, `llamacpp`,
`llama_server`, `vllm`) describe themselves with these types and `llmgw.engines` dispatches on them.
"""

from __future__ import annotations

import importlib.machinery
import logging
import os
import re
import site
import subprocess
import sys
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Literal

from llmgw.domain.timeouts import TIMEOUTS

__all__ = [
    "HEALTH_PATH",
    "EngineArg",
    "EngineError",
    "EngineKind",
    "Group",
    "LaunchSpec",
    "binary_version",
    "cuda_env",
    "find_binary",
    "self_command",
    "split_hostport",
]

HEALTH_PATH = "/health"
Probe = Literal["http", "tcp", "process"]

_log = logging.getLogger("llmgw.engines")


class EngineError(Exception):
    """A refusal to launch, with a stable `code` and words for the operator."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@dataclass(frozen=True)
class EngineArg:
    """A tunable a model definition's `args` may pass to an engine: a whole number (>= 1: threads,
    slots), a number (>= 0 and <= `maximum`: durations, rates, shares), a switch without a value
    (bool), or one word of `choices` (str)."""

    kind: type[int] | type[float] | type[bool] | type[str]
    help: str
    choices: tuple[str, ...] = ()
    maximum: float | None = None


@dataclass(frozen=True)
class Group:
    """One replica's place in a multi-node group. `leader` is "host:port" of rank 0's rendezvous
    (vLLM's master address, the sim's leader); `members` is "host:port" of each rank >= 1, in rank
    order: llama.cpp's rank 0 dials them (`--rpc`), so it needs their addresses, not its own.
    `address` is this rank's own "host:port" as control told the others ("" = not said): a rank
    that others dial (llama.cpp's rpc-server) listens on that port, not on one of its choosing."""

    rank: int
    size: int
    leader: str
    members: tuple[str, ...] = ()
    address: str = ""


@dataclass(frozen=True)
class LaunchSpec:
    """How to start one engine process.

    `env` holds only the variables to set over the agent's own environment. `probe` says how the
    supervisor knows it serves: "http" (GET `health_path` answers 200), "tcp" (its port accepts a
    connection: llama.cpp's rpc-server) or "process" (alive is all there is: a headless vLLM rank).
    `cwd` is the directory to start it in: never the agent's own (see `self_command`). `port` is
    where it listens when that is not the port it was offered (0): a rank others dial listens on
    the address control gave them. `weights_bytes`: what the replica reports it loads.
    """

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    health_path: str | None = HEALTH_PATH
    probe: Probe = "http"
    cwd: str = "/"
    port: int = 0
    weights_bytes: int | None = None  # the checkpoint's size on disk (engines.sources.checkpoint_bytes); None: none
    # LoRA adapter files of the launch left out, and why (llama.cpp: missing, outside storage, not an adapter):
    # the engine starts without them, and the agent reports them failed with these words.
    lora_skipped: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class EngineKind:
    """One way this node can run an engine of a definition (`engine`): how to find it and its version
    (`detect`: the version, "" when unknown, None when it cannot start here; cheap and cached), its
    readiness probe, and what its output says when a start fails (`failures`: a pattern and the
    reason, `{0}` being the pattern's first group)."""

    name: str
    engine: str
    detect: Callable[[Mapping[str, str]], str | None]
    health_path: str = HEALTH_PATH
    failures: tuple[tuple[re.Pattern[str], str], ...] = ()


# --- devices ----------------------------------------------------------------------------------

_DEVICE = re.compile(r"(GPU|MIG)-[A-Za-z0-9/-]{1,120}\Z")


def cuda_env(devices: Sequence[str]) -> dict[str, str]:
    """`CUDA_VISIBLE_DEVICES` naming the GPUs or MIG instances by UUID ("GPU-…", "MIG-…"): UUIDs, not
    indexes, because an index depends on CUDA_DEVICE_ORDER and on what else is visible.

    No Vulkan device variable is ever set, on MIG least of all: NVIDIA's Vulkan driver does not
    expose MIG instances, so a Vulkan build would see (and allocate on) the whole parent card,
    memory other instances own. MIG isolation holds only through CUDA.
    """
    if not devices:
        return {}
    for device in devices:
        if not isinstance(device, str) or not _DEVICE.match(device):
            raise EngineError("bad_devices", f"device {device!r} is not a GPU-… or MIG-… UUID")
    if len(set(devices)) != len(devices):
        raise EngineError("bad_devices", f"a device is named twice: {', '.join(devices)}")
    return {"CUDA_VISIBLE_DEVICES": ",".join(devices)}


def split_hostport(value: str, what: str) -> tuple[str, int]:
    """"host:port" or "[v6]:port" -> (host, port); EngineError("bad_group") otherwise."""
    host, sep, port = value.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isascii() or not port.isdigit() or not 0 < int(port) <= 65535:
        raise EngineError("bad_group", f"{what} {value!r} is not host:port")
    if any(c.isspace() or c in ",/" for c in host) or host.startswith("-"):
        raise EngineError("bad_group", f"{what} {value!r} has an impossible host")
    return host, int(port)


# --- binaries ---------------------------------------------------------------------------------


def find_binary(name: str, env_var: str, environ: Mapping[str, str]) -> str | None:
    """The engine binary `name`: at `environ[env_var]` when set (a configured path), else on PATH.
    None when absent; EngineError when configured but missing or not executable (the operator
    asked for that file, so silence would hide the mistake)."""
    configured = environ.get(env_var, "")
    if configured:
        if not os.path.isabs(configured):
            raise EngineError("engine_unavailable", f"{env_var}={configured}: must be an absolute path")
        if not os.path.isfile(configured):
            raise EngineError("engine_unavailable", f"{env_var}={configured}: no such file")
        if not os.access(configured, os.X_OK):
            raise EngineError("engine_unavailable", f"{env_var}={configured}: not executable (chmod +x it)")
        return configured
    import shutil

    return shutil.which(name, path=environ.get("PATH", os.defpath))


def binary_version(path: str, pattern: re.Pattern[str], argv: Sequence[str] = ()) -> str:
    """`path --version` (or `argv`, about the file `path`), bounded by `engine_version_s`: the first
    match of `pattern`'s group 1 in its output; "" when it says nothing recognisable. Cached per file
    (path, size, mtime), so an upgrade in place is seen and an inventory never runs it twice."""
    try:
        st = os.stat(path)
    except OSError:
        return ""
    return _binary_version(tuple(argv) or (path, "--version"), st.st_size, st.st_mtime_ns, pattern)


@cache
def _binary_version(argv: tuple[str, ...], _size: int, _mtime: int, pattern: re.Pattern[str]) -> str:
    try:
        done = subprocess.run(  # an argv list: the operator's own binary, no shell
            list(argv), capture_output=True, timeout=TIMEOUTS.engine_version_s,
            stdin=subprocess.DEVNULL, check=False, cwd="/",
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    found = pattern.search((done.stdout + done.stderr).decode("utf-8", "replace"))
    return found.group(1).strip() if found else ""


# --- this program, re-invoked -----------------------------------------------------------------

# Put the package's own root first, then run it: for a package that isolated mode would not find
# (a source checkout run through PYTHONPATH or from its directory).
_BOOT = "import runpy,sys;sys.path.insert(0,sys.argv.pop(1));runpy.run_module('llmgw',run_name='__main__',alter_sys=True)"


def self_command(argv0: str | None = None) -> list[str]:
    """The command that re-invokes this very program, in isolated mode (`-I`: no current directory,
    no PYTHONPATH, no user site on sys.path), so a folder named `llmgw` where the agent was started
    cannot shadow the package in its engines.

    A zipapp (shiv) is run as that file; the package as `-I -m llmgw` when isolated mode finds this
    same package (installed, or editable: its .pth stays in site-packages), otherwise through a
    bootstrap that puts this package's root first.
    """
    path = sys.argv[0] if argv0 is None else argv0
    if path and os.path.isfile(path) and zipfile.is_zipfile(path):
        return [sys.executable, "-I", os.path.abspath(path)]
    root = _package_root()
    if _isolated_finds(root):
        return [sys.executable, "-I", "-m", "llmgw"]
    return [sys.executable, "-I", "-c", _BOOT, root]


def _package_root() -> str:
    import llmgw

    return os.path.dirname(os.path.dirname(os.path.abspath(llmgw.__file__ or "")))


@cache
def _isolated_finds(root: str) -> bool:
    """Would `python -I -m llmgw` import the package under `root`? Through a meta-path finder an
    editable install registered, or from a site-packages directory (both survive -I)."""
    wanted = os.path.join(root, "llmgw", "__init__.py")
    for finder in sys.meta_path:
        if finder is importlib.machinery.PathFinder or not hasattr(finder, "find_spec"):
            continue
        try:
            spec = finder.find_spec("llmgw", None)
        except Exception as e:  # a third-party finder's own failure says nothing about ours
            _log.debug("import finder %r failed looking for llmgw (%s): ignored", finder, e)
            continue
        if spec is not None and spec.origin and os.path.abspath(spec.origin) == wanted:
            return True
    spec = importlib.machinery.PathFinder.find_spec("llmgw", site.getsitepackages())
    return spec is not None and spec.origin is not None and os.path.abspath(spec.origin) == wanted
