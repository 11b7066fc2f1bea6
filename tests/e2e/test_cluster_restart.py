"""Control planes restarted in place, as an operator does it: `llmgw ctl members restart` on a standby, and
`llmgw restart` on the whole group (standbys first, the leader last, handing over), on three real
`llmgw control` processes, while a writer keeps writing through whichever member answers: every member
runs on as the same process (same pid, a new start), the old leader says to whom it handed over, and
every acknowledged write is there at the end."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import trio

from tests.support.cluster import Cluster

pytestmark = pytest.mark.slow


def ctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmgw", *args], capture_output=True, text=True, timeout=300)


def test_members_restart_in_place_and_the_group_keeps_every_write(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, 3)
    acked: list[str] = []
    stop = threading.Event()
    try:
        trio.run(cluster.start)
        leader = trio.run(cluster.wait_for, "a leader", cluster.leader, 30.0)
        assert leader is not None
        pids = {m.name: m.proc.pid for m in cluster.members}
        key = ["--key", cluster.admin_key]

        def writer() -> None:  # an operator's script, retrying on whichever member answers
            n = 0
            with httpx.Client(timeout=5, headers=cluster.headers) as http:
                while not stop.is_set():
                    n += 1
                    body = {"name": f"w{n}", "engine": "sim", "source": f"sim://w{n}"}
                    for m in cluster.members:
                        try:
                            r = http.post(m.url + "/api/v1/models", json=body,
                                          headers={"Idempotency-Key": f"w{n}"})
                        except httpx.HTTPError:
                            continue
                        if r.status_code == 201:
                            acked.append(f"w{n}")
                            break
                    time.sleep(0.05)

        thread = threading.Thread(target=writer, daemon=True)
        thread.start()
        standby = next(m for m in cluster.members if m is not leader)
        r = ctl("ctl", "members", "restart", standby.raft_addr, "--url", leader.url, *key)
        assert r.returncode == 0 and f"member {standby.raft_addr}: restarted (pid {pids[standby.name]})" in r.stdout, \
            r.stdout + r.stderr

        r = ctl("restart", "--url", leader.url, *key)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "restarting 0 agent(s)" in r.stderr and "the leader last" in r.stderr
        for m in cluster.members:
            assert f"member {m.raft_addr}: restarted (pid {pids[m.name]})" in r.stdout, r.stdout
            assert m.proc.poll() is None, f"{m.name} runs on as the same process"
        assert "leadership handed over to" in leader.log_tail(200_000), leader.log_tail()
        stop.set()
        thread.join(30)
        assert acked
        now = trio.run(cluster.wait_for, "a leader", cluster.leader, 30.0)
        assert now is not None
        with httpx.Client(timeout=10, headers=cluster.headers) as http:
            names = {m["name"] for m in http.get(now.url + "/api/v1/models").json()["models"]}
        assert set(acked) <= names, sorted(set(acked) - names)
    finally:
        stop.set()
        cluster.close()
