"""`llmgw gateway --workers 2` as the operator runs it, beside `llmgw control` and `llmgw agent`: new
connections are spread over both workers (request ids name each), control's request log asks both;
a SIGKILLed worker leaves the port serving and is started again; SIGTERM stops all, port released."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from llmgw.cli import _ports
from llmgw.wire.logquery import ID_RE
from tests.support.processes import alive, children_of, free_port, kill_engines_under
from tests.support.trust import ca_root_args, create_token

pytestmark = pytest.mark.slow

ADMIN = "sk-gwworkers-admin"
CLIENT = "sk-gwworkers-client"
T = TypeVar("T")
CHAT = {"model": "remote", "messages": [{"role": "user", "content": "which worker?"}]}


def start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, "-m", "llmgw", *args], stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, **env})


def wait_for(what: str, check: Callable[[], T | None], said: Callable[[], str], timeout: float = 40.0) -> T:
    """`check()` until it gives something true; failing after `timeout` with `what` and every log."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what}\n{said()}"
        time.sleep(0.1)


def fresh_calls(gw_url: str, n: int, key: str = CLIENT) -> list[httpx.Response]:
    """`n` chat requests, each on a new connection (so the kernel picks a worker for each)."""
    out = []
    for _ in range(n):
        with httpx.Client(base_url=gw_url, headers={"Authorization": f"Bearer {key}"}, timeout=10) as client:
            out.append(client.post("/v1/chat/completions", json=CHAT))
    return out


def tags(responses: list[httpx.Response]) -> set[str]:
    return {m.group(1) for r in responses if (m := ID_RE.match(r.headers.get("x-request-id", "")))}


def test_workers_share_the_port_are_restarted_and_stop_together(tmp_path: Path) -> None:
    admin_port, gw_port = free_port(), free_port()
    admin_url, gw_url = f"https://127.0.0.1:{admin_port}", f"http://127.0.0.1:{gw_port}"
    logs = {name: tmp_path / f"{name}.log" for name in ("control", "agent", "gateway")}

    def said() -> str:
        return "\n".join(f"--- {n}\n{p.read_text()}" for n, p in logs.items() if p.exists())

    control = start(["control", "--state-dir", str(tmp_path / "control"), "--raft-addr", f"127.0.0.1:{free_port()}",
                     "--admin-addr", f"127.0.0.1:{admin_port}", *ca_root_args()],
                    {"LLMGW_ADMIN_KEY": ADMIN, "LLMGW_CLIENT_KEY": CLIENT}, logs["control"])
    try:  # each machine joins with a token of its own; the workers use the certificate their parent got
        tokens = {role: create_token(admin_url, ADMIN, role, name, wait_s=60, proc=control)
                  for role, name in (("agent", "worker-1"), ("gateway", "gw"))}
    except AssertionError as e:
        control.kill()
        raise AssertionError(f"{e}\n{said()}") from None
    agent = start(["agent", "--stop-engines-on-exit", "--control", admin_url, "--state-dir", str(tmp_path / "agent"),
                   "--node", "worker-1", "--join-token", tokens["agent"]["token"]], {}, logs["agent"])
    gateway = start(["gateway", "--workers", "2", "--control", admin_url, "--listen", f"127.0.0.1:{gw_port}",
                     "--state-dir", str(tmp_path / "gateway"), "--name", "gw", "--join-token", tokens["gateway"]["token"],
                     "--ca-hash", tokens["gateway"]["ca_hash"]], {}, logs["gateway"])
    procs = (gateway, agent, control)

    try:
        ready = wait_for("the gateway's ready line", lambda: re.search(
            r"^llmgw gateway ready url=(\S+) workers=(\d+),(\d+)$", logs["gateway"].read_text(), re.M), said)
        assert ready.group(1) == f"{gw_url}/v1"
        w1, w2 = int(ready.group(2)), int(ready.group(3))
        assert children_of(gateway.pid) == {w1, w2}
        # A worker follows the leader from its start, so it opens with a table: it never waits out
        # gateway_open_wait_s and then answers gateway_not_synced.
        assert "no table from control after" not in said(), said()
        with httpx.Client(base_url=admin_url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10) as api:
            def model_taken() -> bool:
                assert all(p.poll() is None for p in procs), said()
                try:
                    return api.post("/api/v1/models", json={"name": "remote", "engine": "sim",
                                                            "source": "sim://remote"}).status_code in (200, 201)
                except httpx.HTTPError:
                    return False

            wait_for("control never took the model", model_taken, said)
            # Both workers follow the leader on their own: wait until each has the route.
            wait_for("the model never served through both workers",
                     lambda: all(r.status_code == 200 for r in fresh_calls(gw_url, 8)), said)

            # New connections land on both workers; every one is answered.
            calls = fresh_calls(gw_url, 30)
            assert [r.status_code for r in calls] == [200] * 30, [r.text for r in calls if r.status_code != 200]
            assert tags(calls) == {"gww1", "gww2"}

            # A revoked key is refused by every worker (each follows the leader itself) within 2 s.
            made = api.post("/api/v1/keys", json={"name": "short-lived"}).json()
            wait_for("the new key never reached both workers", lambda: tags(
                [r for r in fresh_calls(gw_url, 8, made["key"]) if r.status_code == 200]) == {"gww1", "gww2"}, said)
            assert api.delete(f"/api/v1/keys/{made['id']}").status_code == 200
            wait_for("a worker still took the revoked key", lambda: all(
                r.status_code == 401 for r in fresh_calls(gw_url, 8, made["key"])), said, 2)
            refused = fresh_calls(gw_url, 12, made["key"])
            assert {r.status_code for r in refused} == {401} and tags(refused) == {"gww1", "gww2"}

            # Control lists each worker's records and names no gateway as unreachable (once each worker
            # wrote every call's record: its request log writes after the answer is sent).
            ids = {r.headers["x-request-id"] for r in calls}

            def both_logged() -> dict[str, Any] | None:
                doc: dict[str, Any] = api.get("/api/v1/requests", params={"limit": "200"}).json()
                held = {r["gateway"] for r in doc["requests"]}
                return doc if held >= {"gw-w1", "gw-w2"} and ids <= {r["id"] for r in doc["requests"]} else None

            doc = wait_for("control's request log never held both workers' records", both_logged, said)
            assert doc["gateways"]["unavailable"] == [], doc["gateways"]
            assert {"gw-w1", "gw-w2"} <= set(doc["gateways"]["answered"])
            # Each worker answers for its own log (on a port of its own: on the shared one the kernel
            # would pick the worker, and half of these would be asked of the wrong one).
            for call in calls:
                rid = call.headers["x-request-id"]
                one = api.get(f"/api/v1/requests/{rid}")
                assert one.status_code == 200, one.text
                assert one.json()["gateway"] == f"gw-w{rid.split('-')[1][-1]}", one.json()

            # A worker killed: the other serves the port on its own (before the first is back).
            os.kill(w1, signal.SIGKILL)
            # Gone means reaped by the parent (its warning is written after the wait): a worker's main thread
            # shows as a zombie while its other threads still exit holding the listening socket, whose close
            # then resets the connections queued on it (1 run in 5 under load).
            wait_for("the killed worker never went", lambda: f"gateway worker w1 (pid {w1}) killed by SIGKILL after"
                     in logs["gateway"].read_text(), said, 10)
            assert not alive(w1)
            calls = fresh_calls(gw_url, 12)
            assert [r.status_code for r in calls] == [200] * 12, [r.text for r in calls if r.status_code != 200]
            assert tags(calls) <= {"gww1", "gww2"}
            # ... and the parent starts it again: a new pid, serving under the same name (and log).
            new = wait_for("the killed worker was never started again", lambda: children_of(gateway.pid) - {w1, w2},
                           said)
            assert len(new) == 1
            # Calls go on while it restarts, and none fails: a worker takes connections on the shared
            # port only once it has its table (else its share of clients would get `gateway_not_synced`).
            def restarted_serves() -> bool:
                calls = fresh_calls(gw_url, 8)
                assert [r.status_code for r in calls] == [200] * 8, [r.text for r in calls if r.status_code != 200]
                return "gww1" in tags(calls)

            wait_for("the restarted worker never served", restarted_serves, said)
            assert wait_for("control never asked the restarted worker", lambda: api.get(
                "/api/v1/requests", params={"limit": "5"}).json()["gateways"]["unavailable"] == [], said, 15)
            workers = children_of(gateway.pid)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        kill_engines_under(tmp_path)
    assert [p.returncode for p in procs] == [0, 0, 0], said()
    assert not any(alive(pid) for pid in workers), workers
    _ports.check_free("gateway", "127.0.0.1", gw_port, "--listen")  # the port is released
    assert "Traceback" not in logs["gateway"].read_text()
    for i in (1, 2):  # each worker kept its own log and request log
        assert (tmp_path / "gateway" / "workers" / f"w{i}" / "logs" / "gateway.log").exists()
        assert list((tmp_path / "gateway" / "workers" / f"w{i}" / "requests").glob("seg-*.log"))
