"""Engine registry: which engines this node can run, how to launch one, and what its failure means.
Owns `launch_spec`, `detect_engines` and `start_failure`; each engine's allowlisted tunables (`ENGINE_ARGS`)
are in `args.py`, which the engine processes read too.

Each engine module describes itself (an `EngineKind`: how to find it and its version, its readiness
probe, its start-failure patterns): `llamacpp` (llama.cpp's server through the xllamacpp wheel, on
CPU), `llama_server` (llama.cpp's own binary, GPUs and RPC groups), `vllm`, and the simulator
(described here: its process is this very program, `llmgw engine sim`). Nothing here imports an
engine's own code or a weights package: `importlib.util.find_spec` only locates them.
"""

from __future__ import annotations

import importlib
import os
import re
import signal
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from functools import cache
from typing import Any

from llmgw.domain.model import ROLES
from llmgw.domain.timeouts import TIMEOUTS
from llmgw.engines.base import (
    HEALTH_PATH,
    EngineArg,
    EngineError,
    EngineKind,
    Group,
    LaunchSpec,
    cuda_env,
    self_command,
    split_hostport,
)
from llmgw.engines.args import ENGINE_ARGS, engine_args_help, engine_parser, engine_tokens, parse_engine_args
from llmgw.engines.sources import checkpoint_bytes, check_model_name, resolve_source

__all__ = [
    "ENGINE_ARGS",
    "HEALTH_PATH",
    "PARENT_ENV",
    "EngineArg",
    "EngineError",
    "EngineKind",
    "Group",
    "LaunchSpec",
    "available_engines",
    "detect_engines",
    "engine_args_help",
    "engine_kinds",
    "engine_parser",
    "engine_tokens",
    "launch_spec",
    "parse_engine_args",
    "resolve_source",
    "self_command",
    "start_failure",
    "watch_parent",
]

_PROCESS_ENV = {"PYTHONUNBUFFERED": "1"}


# --- what this node can run -------------------------------------------------------------------


def _sim_version(_environ: Mapping[str, str]) -> str:
    from llmgw import __version__

    return __version__


SIM = EngineKind("sim", "sim", _sim_version)


@cache
def engine_kinds() -> tuple[EngineKind, ...]:
    """Every way of running an engine that llmgw knows, in the order tried."""
    from llmgw.engines import llama_server, llamacpp, vllm

    return (SIM, llamacpp.KIND, llama_server.KIND, vllm.KIND)


def detect_engines(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Engines this node can start now -> version ("" when unknown). Cheap: no engine is imported,
    binaries' `--version` run once per file (cached); llama.cpp's version names its form(s)."""
    env = os.environ if environ is None else environ
    # Not cached as a whole: an engine installed or upgraded while the agent runs shows at the next
    # inventory (binaries' versions are cached per file, so this stays cheap). The import system
    # caches directory listings: forget them, or a package installed since start stays unseen.
    importlib.invalidate_caches()
    return dict(_detect(env.get("PATH", ""), env.get("LLMGW_LLAMA_SERVER", ""), env.get("LLMGW_VLLM", "")))


def _detect(path: str, llama_server: str, vllm: str) -> tuple[tuple[str, str], ...]:
    environ = {"PATH": path, "LLMGW_LLAMA_SERVER": llama_server, "LLMGW_VLLM": vllm}
    found: dict[str, list[str]] = {}
    for kind in engine_kinds():
        version = kind.detect(environ)
        if version is None:
            continue
        words = found.setdefault(kind.engine, [])
        if kind.engine == "llama.cpp":
            version = f"{kind.name} {version}".strip()
        if version:
            words.append(version)
    return tuple((engine, ", ".join(words)) for engine, words in found.items())


def available_engines() -> list[str]:
    """Engines this node can start now, without installing anything."""
    return list(detect_engines())


def start_failure(engine: str, output_tail: str) -> str:
    """Why an engine did not start, for the operator, from the last lines it printed: a known line
    becomes its reason ("engine cannot load architecture X", out of memory, …); else those lines."""
    for kind in engine_kinds():
        if kind.engine != engine:
            continue
        for pattern, reason in kind.failures:
            found = pattern.search(output_tail)
            if found:
                said = found.group(1) if found.groups() else found.group(0)
                return reason.format(re.sub(r"['\"]", "", said).strip())
    lines = [line.strip() for line in re.split(r"\n| \| ", output_tail) if line.strip()]
    if not lines:
        return f"{engine} engine exited before serving and printed nothing"
    return ("engine failed to start: " + " | ".join(lines[-3:]))[-400:]


# --- launching ----------------------------------------------------------------------------------


def launch_spec(
    engine: str,
    *,
    model: str,
    role: str,
    source: str,
    host: str,
    port: int,
    args: Sequence[str],
    devices: Sequence[str] = (),
    group: Group | None = None,
    roots: Sequence[str] = (),
    cwd: str | None = None,
    environ: Mapping[str, str] | None = None,
    lora: Sequence[str] = (),
    sleep_mode: bool = False,
) -> LaunchSpec:
    """The process to start for one replica (or one rank of a group); EngineError when it cannot run here.

    `devices`: GPU or MIG UUIDs, the only ones it may see (none: no GPU at all). `roots`: the
    node's storage directories a path source must lie in (none: any absolute path). `cwd`: where
    it starts, a directory the agent owns ("/" when not given), never the agent's own. `lora`: LoRA adapter
    files a llama.cpp replica loads at launch (scale 0 until a request names one); one that cannot be used is
    left out, with why (`LaunchSpec.lora_skipped`), and the engine starts without it. Other engines ignore it.
    `sleep_mode`: the model may sleep (fast wake, `ModelDef.sleep_level`): vLLM starts with `--enable-sleep-mode`
    and its dev-mode endpoints (`VLLM_SERVER_DEV_MODE=1`: `/sleep`, `/wake_up`); the sim always answers them.
    Every check happens here, before any process starts: engine, role, name, args, source, weights.
    """
    if engine not in ENGINE_ARGS:
        raise EngineError("unknown_engine", f"unknown engine {engine!r} (known: {', '.join(ENGINE_ARGS)})")
    if role not in ROLES:
        raise EngineError("bad_role", f"unknown role {role!r} (known: {', '.join(ROLES)})")
    if not isinstance(port, int) or not 0 <= port <= 65535:
        raise EngineError("bad_port", f"port {port} is outside 0..65535")
    check_model_name(model)
    values = parse_engine_args(engine, args)
    env_in = os.environ if environ is None else environ
    # No devices: no GPU either (a CUDA build would otherwise take GPU 0 from whoever holds it).
    env = {"CUDA_VISIBLE_DEVICES": "", **cuda_env(devices), **_PROCESS_ENV}
    if group is not None:
        _check_group(engine, group)
    common = ["--host", host, "--port", str(port), "--model", model, "--role", role]
    where = cwd or "/"
    if engine == "sim":
        # The simulator reads no weights; a file it is given (a mirror file the agent fetched) must exist, though.
        if source.startswith("/") and not os.path.isfile(source):
            raise EngineError("weights_missing", f"model weights not found at {source}")
        ranks = [] if group is None else ["--group-rank", str(group.rank), "--group-size", str(group.size),
                                          "--group-leader", group.leader]
        return LaunchSpec(self_command() + ["engine", "sim", *common, *ranks, *args], env, cwd=where)
    weights = resolve_source(source, roots)
    if weights.startswith("sim://"):
        raise EngineError("bad_source", f"engine {engine} needs weights, not {source!r}")
    loras, skipped = _lora_files(lora, roots) if engine == "llama.cpp" else ([], {})
    spec = _weights_engine(engine, weights, values, model=model, role=role, host=host, port=port, devices=devices,
                           group=group, env=env, common=common, args=args, where=where, environ=env_in, lora=loras)
    if sleep_mode and engine == "vllm":
        from llmgw.engines import vllm

        spec = replace(spec, argv=[*spec.argv, vllm.SLEEP_MODE_FLAG], env={**spec.env, **vllm.SLEEP_MODE_ENV})
    # What the replica reports while loading; the adapters left out, for its report.
    return replace(spec, weights_bytes=checkpoint_bytes(weights), lora_skipped=skipped)


def _lora_files(files: Sequence[str], roots: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """The LoRA adapter files llama.cpp can load (inside the storage roots, a GGUF that says it is an adapter),
    and those left out with why: a bad adapter must not keep its base from starting."""
    from llmgw.weights.gguf import WeightsError, check_gguf

    found, skipped = [], {}
    for file in files:
        try:
            path = resolve_source(file, roots)
            kind = check_gguf(path).metadata.get("general.type")
            if kind != "adapter":
                raise EngineError("bad_source", f"{file} is not a LoRA adapter GGUF (general.type is {kind!r})")
            found.append(path)
        except EngineError as e:
            skipped[file] = e.message
        except (WeightsError, OSError) as e:
            skipped[file] = f"{file} is not a readable GGUF: {e}"
    return found, skipped


def _weights_engine(engine: str, weights: str, values: dict[str, Any], *, model: str, role: str, host: str,
                    port: int, devices: Sequence[str], group: Group | None, env: dict[str, str], common: list[str],
                    args: Sequence[str], where: str, environ: Mapping[str, str], lora: Sequence[str] = ()) -> LaunchSpec:
    """`launch_spec` for an engine that reads `weights` (a resolved, checked path)."""
    env_in = environ
    tokens = engine_tokens(engine, values)
    if engine == "vllm":
        return _vllm(weights, model=model, host=host, port=port, tokens=tokens, devices=devices, group=group,
                     env=env, cwd=where, environ=env_in, role=role)
    if not os.path.isfile(weights):
        raise EngineError("bad_source", f"llama.cpp needs a GGUF file, and {weights} is not a file")
    from llmgw.engines import llama_server, llamacpp

    if not devices and group is None and llamacpp.KIND.detect(env_in) is not None:
        loras = [token for file in lora for token in ("--lora", file)]
        argv = self_command() + ["engine", "llama-cpp", *common, "--weights", weights, *loras, *args]
        return LaunchSpec(argv, env, cwd=where)
    server = llama_server.find(env_in)
    if server is None:
        need = "on GPUs" if devices else "in a group" if group is not None else "here"
        raise EngineError("engine_unavailable", f"llama.cpp {need} needs llama.cpp's llama-server binary: it is not "
                                                f"on PATH; install it or set {llama_server.ENV_VAR}=/path/to/llama-server"
                                                + ("" if devices or group else " (or pip install 'llmgw[llamacpp]')"))
    if group is not None and group.rank > 0:
        rpc = llama_server.rpc_server_beside(server)
        if group.address:  # rank 0 dials the address control gave it for this rank
            port = split_hostport(group.address, "group address")[1]
        return LaunchSpec(llama_server.rpc_argv(rpc, host=host, port=port), env, health_path=None, probe="tcp",
                          cwd=where, port=port)
    argv = llama_server.server_argv(server, weights=weights, model=model, host=host, port=port, role=role,
                                    tokens=tokens, gpu=bool(devices), rpc=group.members if group else (), lora=lora)
    return LaunchSpec(argv, env, cwd=where)


def _vllm(weights: str, *, model: str, host: str, port: int, tokens: list[str], devices: Sequence[str],
          group: Group | None, env: dict[str, str], cwd: str, environ: Mapping[str, str],
          role: str = "chat") -> LaunchSpec:
    from llmgw.engines import vllm

    cmd = vllm.command(environ)
    if cmd is None:
        raise EngineError("engine_unavailable", f"vLLM is not installed on this node: pip install vllm, or set "
                                                f"{vllm.ENV_VAR}=/path/to/vllm")
    if group is not None:
        version = vllm.version(environ) or ""
        known = vllm.version_tuple(version)
        if known is not None and known < vllm.NATIVE_MULTINODE:
            raise EngineError("engine_too_old", f"vLLM {version} has no multi-node launcher (--nnodes/--headless "
                                                "came in 0.11.1): upgrade vLLM, or run the Ray path by hand "
                                                "(docs/engines.md)")
        env["VLLM_HOST_IP"] = host  # the address vLLM's ranks tell each other
    if "--enable-lora" in tokens:  # LoRA adapters loaded at run time (llmgw/agent/adapters.py)
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    argv = vllm.serve_argv(cmd, vllm.Serve(weights, model, host, port, tokens, len(devices), role), group)
    if group is not None and group.rank > 0:
        return LaunchSpec(argv, env, health_path=None, probe="process", cwd=cwd)
    return LaunchSpec(argv, env, cwd=cwd)


def _check_group(engine: str, group: Group) -> None:
    if not (isinstance(group.size, int) and isinstance(group.rank, int) and group.size >= 2
            and 0 <= group.rank < group.size):
        raise EngineError("bad_group", f"group rank {group.rank} of size {group.size}: needs 0 <= rank < size, size >= 2")
    split_hostport(group.leader, "group leader")
    for member in group.members:
        split_hostport(member, "group member")
    if engine == "llama.cpp" and group.rank == 0 and len(group.members) != group.size - 1:
        raise EngineError("bad_group", f"llama.cpp's rank 0 needs the address of each of the {group.size - 1} other "
                                       f"ranks (rpc-server), got {len(group.members)}")


# --- engine arguments ---------------------------------------------------------------------------


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
