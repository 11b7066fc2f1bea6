"""llama.cpp's own `llama-server` binary (GPU nodes, and any node without xllamacpp), and its RPC backend.
Owns finding the binary and its version, its argv (one node, or rank 0 of an RPC group), `rpc-server`'s argv.

The binary is the operator's build (CUDA, ROCm, Metal…): found at `LLMGW_LLAMA_SERVER` when set,
else on PATH; `rpc-server` is looked for beside it (the two come from one build). Flags used are
llama.cpp's documented ones (tools/server/README.md, tools/rpc/README.md): `--model --host --port
--alias --n-gpu-layers --ctx-size --threads --parallel --embedding --reranking --pooling --no-webui
--rpc`, and `rpc-server --host --port`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence

from llmgw.engines.base import EngineError, EngineKind, find_binary, binary_version

__all__ = ["ENV_VAR", "FAILURES", "KIND", "find", "rpc_argv", "rpc_server_beside", "server_argv"]

ENV_VAR = "LLMGW_LLAMA_SERVER"
# `llama-server --version` prints "version: 6490 (3f1e5b9d)" then "built with … for …" (on stderr).
_VERSION = re.compile(r"version:\s*(\d+ \([0-9a-f]+\)|\S+)")
# Every layer on the GPUs unless the definition says otherwise (llama.cpp caps it at the model's count).
ALL_LAYERS = "999"


def _failure(pattern: str, reason: str) -> tuple[re.Pattern[str], str]:
    return re.compile(pattern, re.IGNORECASE), reason


# What llama.cpp prints when a start fails, most specific first (xllamacpp shares them: same core).
FAILURES = (
    _failure(r"unknown model architecture: '([^']*)'", "engine cannot load architecture {0}"),
    _failure(r"allocating ([\d.]+ [MG]iB) on device \d+: cudaMalloc failed: out of memory",
             "engine ran out of GPU memory (allocating {0})"),
    _failure(r"(cudaMalloc failed: out of memory|CUDA error: out of memory)", "engine ran out of GPU memory"),
    _failure(r"(ggml_aligned_malloc: insufficient memory|failed to allocate [\w ]*buffer|std::bad_alloc)",
             "engine ran out of memory ({0})"),
    _failure(r"(no CUDA-capable device is detected|failed to initialize CUDA[^|\n]*)",
             "engine found no usable GPU ({0})"),
    _failure(r"error while loading shared libraries: ([^:\s]+)", "engine cannot start: library {0} is missing"),
    _failure(r"(?:error: )?invalid argument: (\S+)", "engine does not know the argument {0} (an older llama.cpp build?)"),
    _failure(r"(couldn't bind HTTP server socket[^|\n]*)", "engine cannot listen: {0}"),
    _failure(r"gguf_init_from_file[\w]*: ([^|\n]+)", "engine cannot read the GGUF file: {0}"),
    _failure(r"error loading model: ([^|\n]+)", "engine cannot load the model: {0}"),
)


def find(environ: Mapping[str, str]) -> str | None:
    """The `llama-server` binary to run, or None; EngineError when `LLMGW_LLAMA_SERVER` names a bad file."""
    return find_binary("llama-server", ENV_VAR, environ)


def _detect(environ: Mapping[str, str]) -> str | None:
    try:
        path = find(environ)
    except EngineError:
        return None  # configured but unusable: it cannot start here (launch_spec says why)
    return None if path is None else binary_version(path, _VERSION)


KIND = EngineKind("llama-server", "llama.cpp", _detect, failures=FAILURES)


def rpc_server_beside(server: str) -> str:
    """`rpc-server` from the same build as `server`; EngineError when it is not there."""
    path = os.path.join(os.path.dirname(server), "rpc-server")
    if not os.path.isfile(path):
        raise EngineError("engine_unavailable", f"llama.cpp group member needs rpc-server beside {server} "
                                                "(build llama.cpp with -DGGML_RPC=ON)")
    if not os.access(path, os.X_OK):
        raise EngineError("engine_unavailable", f"{path}: not executable (chmod +x it)")
    return path


def server_argv(
    binary: str,
    *,
    weights: str,
    model: str,
    host: str,
    port: int,
    role: str,
    tokens: Sequence[str],
    gpu: bool,
    rpc: Sequence[str] = (),
    lora: Sequence[str] = (),
) -> list[str]:
    """`llama-server` serving `weights` as `model`; `tokens` are the definition's checked args.
    `rpc` ("host:port" of each rpc-server) makes this rank 0 of a group: its layers spread over them."""
    argv = [binary, "--model", weights, "--host", host, "--port", str(port), "--alias", model]
    if (gpu or rpc) and "--n-gpu-layers" not in tokens:
        argv += ["--n-gpu-layers", ALL_LAYERS]
    if role == "embedding" and "--embedding" not in tokens:
        argv.append("--embedding")
    if role == "rerank":  # llama.cpp's switch for /v1/rerank: embeddings with rank pooling (a cls.output head)
        argv.append("--reranking")
    argv += tokens
    if rpc:
        argv += ["--rpc", ",".join(rpc)]
    if lora:  # LoRA adapters, each at scale 0 until a request names it (its `lora` field)
        argv += [token for file in lora for token in ("--lora", file)] + ["--lora-init-without-apply"]
    # An engine serves the gateway, not browsers: no web UI.
    argv.append("--no-webui")
    return argv


def rpc_argv(rpc_server: str, *, host: str, port: int) -> list[str]:
    """A rank >= 1 of a llama.cpp group: `rpc-server` lends this node's devices (CUDA_VISIBLE_DEVICES)
    to rank 0. It has no authentication: it listens on the node's engine address only."""
    return [rpc_server, "--host", host, "--port", str(port)]
