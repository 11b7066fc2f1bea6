"""A cluster of real processes for end-to-end tests: `llmgw control`, `llmgw agent` and a remote `llmgw gateway`,
each its own process on free ports, with the models given; and `Target`, where clients point (the same shape for
a `llmgw up`). Shared by the SDK and README tests (imported by name: tests/e2e is on pytest's path)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.support.processes import free_port, kill_engines_under
from tests.support.trust import ca_root_args, join_token

SIM_MODELS = ({"name": "demo", "engine": "sim", "source": "sim://demo"},
              {"name": "demo-embed", "engine": "sim", "source": "sim://demo-embed", "role": "embedding"})


@dataclass
class Target:
    """Where the SDK points, and how the operator's commands reach the same cluster."""

    gateway_url: str  # .../v1
    client_key: str
    admin_key: str
    admin_url: str
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def credentials(self) -> dict[str, str]:
        """What `llmgw up` writes to credentials.json (the README's curl lines read it)."""
        return {"gateway_url": self.gateway_url, "client_key": self.client_key, "admin_key": self.admin_key,
                "admin_url": self.admin_url}


@contextmanager
def remote_cluster(root: Path, models: Sequence[dict[str, Any]] = SIM_MODELS) -> Iterator[Target]:
    """Control, agent and a remote gateway as three processes (logs in `root`), serving `models`; stopped
    with SIGTERM on exit, and any engine left under `root` killed."""
    target = _start(root, models)
    try:
        yield target
    finally:
        for p in target.procs:
            p.send_signal(signal.SIGTERM)
        for p in target.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        kill_engines_under(root)


def _start(root: Path, models: Sequence[dict[str, Any]]) -> Target:
    admin_port, gw_port = free_port(), free_port()
    target = Target(f"http://127.0.0.1:{gw_port}/v1", "sk-sdk-client", "sk-sdk-admin", f"https://127.0.0.1:{admin_port}")

    def start(args: list[str], env: dict[str, str], name: str) -> None:
        with (root / f"{name}.log").open("wb") as out:
            target.procs.append(subprocess.Popen([sys.executable, "-m", "llmgw", *args], stdout=out,
                                                 stderr=subprocess.STDOUT, env={**os.environ, **env}))

    start(["control", "--state-dir", str(root / "control"), "--raft-addr", f"127.0.0.1:{free_port()}",
           "--admin-addr", f"127.0.0.1:{admin_port}", *ca_root_args()],
          {"LLMGW_ADMIN_KEY": target.admin_key, "LLMGW_CLIENT_KEY": target.client_key}, "control")
    # The agent and the gateway join as an operator joins machines: a token each, made with the admin key.
    try:
        tokens = {role: join_token(target.admin_url, target.admin_key, role, name, wait_s=60, proc=target.procs[0])
                  for role, name in (("agent", "worker-1"), ("gateway", "gw-e2e"))}
    except AssertionError as e:
        target.procs[0].kill()
        raise AssertionError(f"{e}\n{(root / 'control.log').read_text()}") from None
    start(["agent", "--stop-engines-on-exit", "--control", target.admin_url, "--state-dir", str(root / "agent"),
           "--node", "worker-1", "--join-token", tokens["agent"]], {}, "agent")
    start(["gateway", "--control", target.admin_url, "--listen", f"127.0.0.1:{gw_port}", "--state-dir",
           str(root / "gateway"), "--name", "gw-e2e", "--join-token", tokens["gateway"]], {}, "gateway")
    with httpx.Client(base_url=target.admin_url, headers={"Authorization": f"Bearer {target.admin_key}"},
                      timeout=5) as api:
        for model in models:
            deadline = time.monotonic() + 30
            while True:
                assert all(p.poll() is None for p in target.procs), f"a process of the remote cluster died ({root})"
                try:
                    if api.post("/api/v1/models", json=model).status_code in (200, 201):
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, "the control plane never took the models"
                time.sleep(0.2)
        # The agent too: a request before it connects is answered `model_unplaceable` (no node), at once.
        deadline = time.monotonic() + 30
        while True:
            assert all(p.poll() is None for p in target.procs), f"a process of the remote cluster died ({root})"
            try:
                nodes = api.get("/api/v1/nodes")
                if nodes.status_code == 200 and any(n["node"] == "worker-1" and n["state"] == "connected"
                                                    for n in nodes.json()["nodes"]):
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the agent never connected to control"
            time.sleep(0.2)
    _wait_synced(target, {str(m["name"]) for m in models})
    return target


def _wait_synced(target: Target, names: set[str]) -> None:
    """Until the gateway lists every model: it has its table from control (before, it answers 503
    `gateway_not_synced`). A model not ready yet is waited for by the request itself (its activation)."""
    deadline = time.monotonic() + 30
    with httpx.Client(headers={"Authorization": f"Bearer {target.client_key}"}, timeout=5) as gateway:
        while True:
            assert all(p.poll() is None for p in target.procs), "a process of the remote cluster died"
            try:
                listed = gateway.get(target.gateway_url + "/models")
                if listed.status_code == 200 and names <= {m.get("id") for m in listed.json()["data"]}:
                    return
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the remote gateway never listed the models"
            time.sleep(0.2)
