"""The data plane does not notice a control failover: three `llmgw control` processes, one
`llmgw agent` running a sim engine, one `llmgw gateway`, and a client sending 20 requests a
second through the gateway while the leader is SIGKILLed. No request fails; a new leader is
elected; the agent and the gateway re-attach to it (the agent within 5 s of the election); the
new leader adopts the running replica (same replica id, same engine process) and lists the
agent and the gateway with their last contact."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from tests.support.processes import alive, children_of, free_port
from tests.support.trust import ca_root_args, join_token

pytestmark = pytest.mark.slow

ADMIN, CLIENT = "sk-failover-admin", "sk-failover-client"
RATE, LOAD_S, KILL_AT_S = 20, 7.0, 2.0  # requests a second; how long; when the leader dies
T = TypeVar("T")


@dataclass
class Proc:
    name: str
    argv: list[str]
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "llmgw", *self.argv], stdout=out,
                                         stderr=subprocess.STDOUT, env={**os.environ, **self.env})

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@dataclass
class Member(Proc):
    raft_addr: str = ""
    url: str = ""


def said(procs: list[Proc]) -> str:
    return "\n".join(f"--- {p.name}\n{p.log.read_text()[-3000:]}" for p in procs if p.log.exists())


def wait_for(what: str, probe: Callable[[], T | None], timeout: float, procs: list[Proc]) -> T:
    deadline = time.monotonic() + timeout
    while True:
        try:
            found = probe()
        except httpx.HTTPError:
            found = None
        if found is not None and found is not False:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not within {timeout:g} s\n{said(procs)}")
        time.sleep(0.05)


def get(url: str, path: str, timeout: float = 5) -> Any:
    return httpx.get(url + path, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=timeout).json()


@dataclass
class Cluster:
    members: list[Member]
    agent: Proc
    gateway: Proc
    gateway_url: str

    @property
    def procs(self) -> list[Proc]:
        return [*self.members, self.agent, self.gateway]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    members = []
    for i in (1, 2, 3):
        raft, admin = f"127.0.0.1:{free_port()}", free_port()
        members.append(Member(f"m{i}", [], tmp_path / f"m{i}.log", raft_addr=raft, url=f"https://127.0.0.1:{admin}"))
    urls = [a for m in members for a in ("--control", m.url)]
    for m in members:
        m.argv = ["control", "--state-dir", str(tmp_path / m.name), "--raft-addr", m.raft_addr,
                  "--admin-addr", m.url.removeprefix("https://"), *ca_root_args(),
                  *[a for o in members if o is not m for a in ("--peer", o.raft_addr)]]
    gw_port = free_port()
    agent = Proc("agent", ["agent", "--stop-engines-on-exit", *urls, "--state-dir", str(tmp_path / "agent"), "--node", "worker-1"],
                 tmp_path / "agent.log")
    gateway = Proc("gateway", ["gateway", *urls, "--listen", f"127.0.0.1:{gw_port}", "--name", "gw-1",
                               "--state-dir", str(tmp_path / "gateway")], tmp_path / "gateway.log")
    c = Cluster(members, agent, gateway, f"http://127.0.0.1:{gw_port}")
    # The first member's first start makes the secret and, from the environment, both first keys.
    members[0].env = {"LLMGW_ADMIN_KEY": ADMIN, "LLMGW_CLIENT_KEY": CLIENT}
    members[0].start()
    secret = tmp_path / "m1" / "cluster.secret"
    wait_for("the cluster secret", lambda: secret.exists(), 20, c.procs)
    for m in members[1:]:
        m.argv += ["--cluster-secret-file", str(secret)]
        m.start()
    # The agent and the gateway join once the group has a leader (and so its CA), each with its own token.
    try:
        for proc, role, name in ((agent, "agent", "worker-1"), (gateway, "gateway", "gw-1")):
            proc.argv += ["--join-token", join_token(members[0].url, ADMIN, role, name, wait_s=60)]
    except AssertionError as e:
        for m in members:
            m.stop()
        raise AssertionError(f"{e}\n{said(c.procs)}") from None
    agent.start()
    gateway.start()
    try:
        yield c
    finally:
        for p in c.procs:
            p.stop()


def leader_of(members: list[Member]) -> Member | None:
    for m in members:
        try:
            if get(m.url, "/api/v1/cluster/self", timeout=1)["role"] == "leader":
                return m
        except (httpx.HTTPError, KeyError, ValueError):
            continue
    return None


def replicas(url: str) -> list[str]:
    return sorted(r["replica_id"] for r in get(url, "/api/v1/models/demo")["model"]["status"]["replicas"])


class Load(threading.Thread):
    """RATE requests a second through the gateway for LOAD_S seconds; every failure is kept."""

    def __init__(self, gateway_url: str) -> None:
        super().__init__(daemon=True)
        self.url = gateway_url
        self.sent = 0
        self.failures: list[str] = []

    def run(self) -> None:
        start = time.monotonic()
        body = {"model": "demo", "messages": [{"role": "user", "content": "still there?"}]}
        with httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {CLIENT}"}, timeout=10) as http:
            for i in range(int(RATE * LOAD_S)):
                time.sleep(max(0.0, start + i / RATE - time.monotonic()))
                self.sent += 1
                try:
                    r = http.post("/v1/chat/completions", json=body)
                    if r.status_code != 200:
                        self.failures.append(f"{time.monotonic() - start:.2f} s: {r.status_code} {r.text[:200]}")
                except httpx.HTTPError as e:
                    self.failures.append(f"{time.monotonic() - start:.2f} s: {type(e).__name__}: {e}")


def test_a_leader_sigkill_fails_no_request_through_a_remote_gateway(cluster: Cluster) -> None:
    c, members = cluster, cluster.members
    leader = wait_for("a leader", lambda: leader_of(members), 30, c.procs)
    r = httpx.post(leader.url + "/api/v1/models", json={"name": "demo", "engine": "sim", "source": "sim://demo"},
                   headers={"Authorization": f"Bearer {ADMIN}", "Idempotency-Key": "demo-1"}, timeout=10)
    assert r.status_code == 201, r.text

    def answers() -> bool:
        return httpx.post(c.gateway_url + "/v1/chat/completions", headers={"Authorization": f"Bearer {CLIENT}"},
                          json={"model": "demo", "messages": [{"role": "user", "content": "hi"}]},
                          timeout=10).status_code == 200
    wait_for("a chat answer through the gateway (with the client key LLMGW_CLIENT_KEY made)", answers, 30, c.procs)
    before = replicas(leader.url)
    engines = children_of(c.agent.pid)
    assert len(before) == 1 and engines, (before, engines)
    # The leader lists the agent and the gateway it serves, with their last contact.
    view = get(leader.url, "/api/v1/cluster/members")
    assert [(a["node"], a["connected"]) for a in view["agents"]] == [("worker-1", True)], view
    assert [(g["name"], g["connected"]) for g in view["gateways"]] == [("gw-1", True)], view
    assert view["floating_address"]["state"] == "not configured"

    load = Load(c.gateway_url)
    load.start()
    time.sleep(KILL_AT_S)
    assert leader.proc is not None
    leader.proc.send_signal(signal.SIGKILL)
    leader.proc.wait()
    killed = time.monotonic()
    survivors = [m for m in members if m is not leader]
    new = wait_for("a new leader", lambda: leader_of(survivors), 10, c.procs)
    elected = time.monotonic()

    def agent_attached() -> bool:
        agents = get(new.url, "/api/v1/cluster/members", timeout=3)["agents"]
        return bool(agents) and agents[0]["connected"] is True
    wait_for("the agent attached to the new leader", agent_attached, 10, c.procs)
    attached = time.monotonic()
    load.join(LOAD_S + 30)
    assert not load.is_alive()

    assert load.failures == [], f"{len(load.failures)} of {load.sent} requests failed: {load.failures[:10]}"
    assert load.sent == int(RATE * LOAD_S)
    assert attached - elected < 5, f"the agent re-attached {attached - elected:.1f} s after the election"
    health = httpx.get(c.gateway_url + "/health", timeout=5).json()
    assert health["leader"] in {m.url for m in survivors}, health
    assert health["table_age_s"] is not None and health["table_age_s"] < 3, health
    # Adopted, not replaced: the same replica, served by the same engine process all along.
    assert replicas(new.url) == before
    assert children_of(c.agent.pid) == engines and all(alive(pid) for pid in engines)
    view = get(new.url, "/api/v1/cluster/members")
    assert view["leader"] == new.raft_addr
    assert {r["id"]: r["state"] for r in view["members"]}[leader.raft_addr] == "missing"
    assert [(g["name"], g["connected"]) for g in view["gateways"]] == [("gw-1", True)], view
    assert all(g["last_contact_age_s"] < 5 for g in view["gateways"] + view["agents"]), view
    print(f"failover: elected {elected - killed:.2f} s after the kill, agent attached {attached - elected:.2f} s "
          f"later; {load.sent} requests, 0 failed")
