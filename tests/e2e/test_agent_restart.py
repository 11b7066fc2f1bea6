"""`llmgw ctl nodes restart`: a real `llmgw agent` process, asked by the leader over its stream, restarts in
place (same pid, same flags), leaves its engine serving and adopts it: the replica id, its URL and the
engine's pid unchanged, the engine answering throughout; then the refusals (an unknown node, one not
connected)."""

from __future__ import annotations

import signal
import subprocess
import sys
import ssl
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.test_roles import ADMIN, start
from tests.support.processes import alive, children_of, free_port, until
from tests.support.trust import ca_root_args, create_token

pytestmark = pytest.mark.slow




def test_an_agent_restarts_in_place_and_keeps_its_engine(tmp_path: Path) -> None:
    admin_port = free_port()
    url = f"https://127.0.0.1:{admin_port}"
    control = start(["control", "--state-dir", str(tmp_path / "control"), "--raft-addr", f"127.0.0.1:{free_port()}",
                     "--admin-addr", f"127.0.0.1:{admin_port}", *ca_root_args()], {"LLMGW_ADMIN_KEY": ADMIN},
                    tmp_path / "control.log")
    agent = None
    try:
        token = create_token(url, ADMIN, "agent", "worker-1", wait_s=60, proc=control)
        agent = start(["agent", "--stop-engines-on-exit", "--control", url, "--state-dir", str(tmp_path / "agent"),
                       "--node", "worker-1", "--join-token", token["token"], "--ca-hash", token["ca_hash"]],
                      {}, tmp_path / "agent.log")
        ca = str(tmp_path / "control" / "tls" / "ca.pem")
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10,
                          verify=ssl.create_default_context(cafile=ca)) as api:
            def node() -> dict[str, object] | None:
                nodes = api.get("/api/v1/nodes").json()["nodes"]
                return next((n for n in nodes if n["node"] == "worker-1"), None)

            until("the agent connected", lambda: (n := node()) is not None and n["state"] == "connected")
            assert api.post("/api/v1/models", json={"name": "kept", "engine": "sim",
                                                    "source": "sim://kept"}).status_code == 201
            status = until("the replica ready", lambda: (s := api.get("/api/v1/models/kept").json()["model"]
                                                         ["status"])["ready"] == 1 and s)
            [replica] = status["replicas"]
            [engine] = children_of(agent.pid)
            before = node()
            assert before is not None

            answered, failed = [], []
            stop = threading.Event()

            def load() -> None:  # a client of the engine, throughout the restart
                with httpx.Client(timeout=5) as c:
                    while not stop.is_set():
                        try:
                            r = c.post(f"{replica['url']}/v1/chat/completions",
                                       json={"model": "kept", "messages": [{"role": "user", "content": "hi"}]})
                            (answered if r.status_code == 200 else failed).append(r.status_code)
                        except httpx.HTTPError as e:
                            failed.append(repr(e))
                        time.sleep(0.02)

            client = threading.Thread(target=load, daemon=True)
            client.start()
            ctl = subprocess.run([sys.executable, "-m", "llmgw", "ctl", "nodes", "restart", "worker-1", "--url", url,
                                  "--key", ADMIN, "--ca-file", ca], capture_output=True, text=True, timeout=120)
            stop.set()
            client.join(10)
            assert ctl.returncode == 0, ctl.stdout + ctl.stderr
            assert "restarted, back on a new stream with 1 replica(s)" in ctl.stdout
            after = node()
            assert after is not None and after["connected_at"] != before["connected_at"]
            log = (tmp_path / "agent.log").read_text()
            assert "restarting in place" in log and "asked by an operator" in log, log
            assert agent.poll() is None, "the same process runs on (exec in place)"
            assert children_of(agent.pid) == {engine} and alive(engine), "the engine was adopted, not replaced"
            now = api.get("/api/v1/models/kept").json()["model"]["status"]
            assert [(r["replica_id"], r["url"]) for r in now["replicas"]] == [(replica["replica_id"], replica["url"])]
            assert answered and not failed, (len(answered), failed[:5])

            r = api.post("/api/v1/nodes/nobody/restart")
            assert r.status_code == 404 and r.json()["error"]["code"] == "node_not_found"
            agent.send_signal(signal.SIGTERM)
            agent.wait(30)
            until("the node disconnected", lambda: (n := node()) is not None and n["state"] != "connected")
            r = api.post("/api/v1/nodes/worker-1/restart")
            assert r.status_code == 409 and r.json()["error"]["code"] == "node_not_connected", r.text
    finally:
        for proc in (agent, control):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in (agent, control):
            if proc is not None:
                proc.wait(30)
