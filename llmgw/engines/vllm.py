"""vLLM (`vllm serve`): finding it and its version, its argv on one node and as one rank of a group.
Owns vLLM's start-failure patterns and the Ray alternative's argv (documented in docs/engines.md).

Found at `LLMGW_VLLM` (a `vllm` executable) when set, else `vllm` on PATH, else the `vllm` module
of this interpreter (run as `python -m vllm.entrypoints.cli.main`, the console script's target).
Its version is read from package metadata (never by importing vLLM: that loads torch).

Multi-node groups use vLLM's own launcher: `--nnodes N --node-rank R --master-addr H
--master-port P`, ranks >= 1 `--headless` (no API server), tensor parallel across one node's
GPUs and pipeline parallel across the nodes, as vLLM's distributed-serving docs say. That
launcher came with vLLM PR #23691 ("Support MP Executor for multi node distributed inference"),
first released in v0.11.1; older versions need Ray (`ray start --head --port P` on rank 0,
`ray start --address H:P` on the others, then `vllm serve … --distributed-executor-backend ray`
on rank 0 only), which `ray_argvs` builds and `launch_spec` refuses to run by itself (two
processes on rank 0: docs/engines.md says how to run it by hand).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from llmgw.engines.base import EngineError, EngineKind, Group, binary_version, find_binary, split_hostport
from llmgw.engines.sources import find_spec

__all__ = ["ENV_VAR", "FAILURES", "KIND", "NATIVE_MULTINODE", "SLEEP_MODE_ENV", "SLEEP_MODE_FLAG", "SLEEP_PATH",
           "WAKE_PATH", "Serve", "command", "ray_argvs", "serve_argv", "version"]

ENV_VAR = "LLMGW_VLLM"
# Fast wake (docs/models.md): a model with `sleep_level` starts with vLLM's sleep mode on, and its dev-mode
# endpoints served: `POST /sleep?level=1|2`, `POST /wake_up`, `GET /is_sleeping`
# (https://docs.vllm.ai/en/latest/features/sleep_mode/).
SLEEP_MODE_FLAG = "--enable-sleep-mode"
SLEEP_MODE_ENV = {"VLLM_SERVER_DEV_MODE": "1"}
SLEEP_PATH = "/sleep"
WAKE_PATH = "/wake_up"
NATIVE_MULTINODE = (0, 11, 1)  # --nnodes/--node-rank/--master-addr/--master-port/--headless (PR #23691)
_VERSION = re.compile(r"^\s*(\d+\.\d+[\w.+-]*)\s*$", re.MULTILINE)
_METADATA = "import importlib.metadata as m; print(m.version('vllm'))"


def _failure(pattern: str, reason: str) -> tuple[re.Pattern[str], str]:
    return re.compile(pattern, re.IGNORECASE), reason


# What vLLM prints when a start fails, most specific first.
FAILURES = (
    _failure(r"Model architectures \[([^\]]*)\] (?:are not supported|failed to be inspected)",
             "engine cannot load architecture {0}"),
    _failure(r"OutOfMemoryError: CUDA out of memory\. Tried to allocate ([\d.]+ [KMG]iB)",
             "engine ran out of GPU memory (tried to allocate {0})"),
    _failure(r"(No available memory for the cache blocks)",
             "engine has no GPU memory left for the KV cache: lower --max-model-len or raise --gpu-memory-utilization"),
    _failure(r"max seq len \((\d+)\) is larger than the maximum number of tokens that can be stored in KV cache",
             "engine cannot fit a context of {0} tokens in the KV cache: lower --max-model-len"),
    _failure(r"(Free memory on device[^|\n]*less than desired GPU memory utilization[^|\n]*)",
             "engine found its GPU memory already in use: {0}"),
    _failure(r"(Bfloat16 is only supported on GPUs with compute capability of at least 8\.0)",
             "engine cannot use bfloat16 on this GPU: pass --dtype half"),
    _failure(r"(no kernel image is available for execution on the device)", "engine build does not support this GPU ({0})"),
    _failure(r"unrecognized arguments: ([^|\n]+)", "engine does not know the arguments {0} (an older vLLM?)"),
    _failure(r"No module named '([^']+)'", "engine cannot start: Python module {0} is missing"),
    _failure(r"(\[Errno 98\][^|\n]*)", "engine cannot listen: {0}"),
    _failure(r"(OutOfMemoryError[^|\n]*)", "engine ran out of GPU memory: {0}"),
)


def command(environ: Mapping[str, str]) -> list[str] | None:
    """The command that is `vllm` here (its first words), or None when vLLM cannot start on this node."""
    path = find_binary("vllm", ENV_VAR, environ)
    if path is not None:
        return [path]
    if find_spec("vllm") is not None:
        return [sys.executable, "-I", "-m", "vllm.entrypoints.cli.main"]
    return None


def version(environ: Mapping[str, str]) -> str | None:
    """vLLM's version ("" unknown, None when absent): its package metadata, read by the Python that
    runs the `vllm` script (its shebang), else `vllm --version`."""
    try:
        cmd = command(environ)
    except EngineError:
        return None
    if cmd is None:
        return None
    if cmd[0] == sys.executable:
        from importlib.metadata import PackageNotFoundError
        from importlib.metadata import version as dist_version

        try:
            return dist_version("vllm")
        except PackageNotFoundError:
            return ""
    python = _shebang_python(cmd[0])
    if python is not None:
        found = binary_version(cmd[0], _VERSION, [python, "-I", "-c", _METADATA])
        if found:
            return found
    return binary_version(cmd[0], _VERSION)


def _shebang_python(script: str) -> str | None:
    try:
        with open(script, "rb") as f:
            first = f.readline(512)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode("utf-8", "replace").split()
    if words and "python" in os.path.basename(words[0]) and os.path.isabs(words[0]):
        return words[0]
    return None


KIND = EngineKind("vllm", "vllm", version, failures=FAILURES)


def version_tuple(text: str) -> tuple[int, ...] | None:
    """"0.11.1rc2+cu128" -> (0, 11, 1); None when unknown."""
    found = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if not found:
        return None
    return tuple(int(part) for part in found.groups(default="0"))


@dataclass(frozen=True)
class Serve:
    """What one `vllm serve` is asked, whichever launcher runs it: the weights (`source`), the name it answers
    as, where it listens, its tunables as tokens, and this node's GPUs."""

    source: str
    model: str
    host: str
    port: int
    tokens: Sequence[str]
    gpus: int
    role: str = "chat"


def serve_argv(cmd: Sequence[str], serve: Serve, group: Group | None = None) -> list[str]:
    """`vllm serve SOURCE` answering as `model`; tensor parallel over this node's `gpus`; one rank
    of `group` through vLLM's own multi-node launcher (rank 0 serves the API, the others headless)."""
    argv = [*cmd, "serve", serve.source]
    if group is None or group.rank == 0:
        argv += ["--host", serve.host, "--port", str(serve.port)]
    argv += ["--served-model-name", serve.model]
    if serve.gpus > 1 or group is not None:
        argv += ["--tensor-parallel-size", str(max(serve.gpus, 1))]
    if group is not None:
        master, master_port = split_hostport(group.leader, "group leader")
        argv += [
            "--pipeline-parallel-size", str(group.size),
            "--distributed-executor-backend", "mp",
            "--nnodes", str(group.size),
            "--node-rank", str(group.rank),
            "--master-addr", master,
            "--master-port", str(master_port),
        ]
        if group.rank > 0:
            argv.append("--headless")
    return argv + _role_flags(serve) + list(serve.tokens)


def _role_flags(serve: Serve) -> list[str]:
    """A rerank model runs vLLM's pooling runner (`--runner pooling`, vLLM >= 0.10.1): its cross-encoder's score
    task serves `/v1/rerank`. Generation and embeddings keep vLLM's choice from the architecture."""
    return ["--runner", "pooling"] if serve.role == "rerank" else []


def ray_argvs(cmd: Sequence[str], ray: str, serve: Serve, group: Group) -> list[list[str]]:
    """The Ray path for a vLLM older than v0.11.1, in start order: rank 0 runs a Ray head, then (once
    every other rank has joined) `vllm serve … --distributed-executor-backend ray`; each rank >= 1
    runs one `ray start --address` and nothing else."""
    leader_host, ray_port = split_hostport(group.leader, "group leader")
    if group.rank > 0:
        return [[ray, "start", "--block", "--address", f"{leader_host}:{ray_port}", "--node-ip-address", serve.host]]
    argv = [*cmd, "serve", serve.source, "--host", serve.host, "--port", str(serve.port), "--served-model-name",
            serve.model, "--tensor-parallel-size", str(max(serve.gpus, 1)), "--pipeline-parallel-size",
            str(group.size), "--distributed-executor-backend", "ray", *_role_flags(serve), *serve.tokens]
    return [[ray, "start", "--block", "--head", "--port", str(ray_port), "--node-ip-address", leader_host], argv]
