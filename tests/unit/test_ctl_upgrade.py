"""`llmgw ctl upgrade` against a fake cluster (the admin API of three members, a gateway and two agents, as
`httpx.MockTransport`): the order (standbys, the leader, the gateway, agents one at a time), judged by sha256
alone, each machine waited for, a machine already on the release skipped and said so, the first failure (an
agent's or a gateway's refusal too) stopping the run with its reason and the rest untouched, progress as lines or
JSON events, and the rollback."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from ctl_fakes import ENV, ctl

OLD = "0" * 64


def zipapp(path: Path, words: str) -> Path:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        z.writestr("__main__.py", f"print({words!r})\n")
    path.write_bytes(buffer.getvalue())
    return path


@dataclass
class Machine:
    sha: str
    previous: str | None = None
    started: int = 0
    refuse: str | None = None  # an agent that refuses the upgrade, with this reason
    stays_away: bool = False  # a machine that never comes back


@dataclass
class FakeCluster:
    """Members m1 (leader), m2, m3 at http://mN.test; nodes n1, n2; what each runs, and every ask in order."""

    members: dict[str, Machine] = field(default_factory=lambda: {m: Machine(OLD) for m in ("m1", "m2", "m3")})
    nodes: dict[str, Machine] = field(default_factory=lambda: {n: Machine(OLD) for n in ("n1", "n2")})
    gateways: dict[str, Machine] = field(default_factory=lambda: {"gw-1": Machine(OLD)})
    leader: str = "m1"
    uploads: dict[str, bytes] = field(default_factory=dict)
    asked: list[str] = field(default_factory=list)

    def self_doc(self, m: str) -> dict[str, Any]:
        machine = self.members[m]
        return {"id": m, "role": "leader" if m == self.leader else "standby", "leader": self.leader, "ready": True,
                "started_at": machine.started, "release_sha256": machine.sha}

    def __call__(self, request: httpx.Request) -> httpx.Response:
        host, path, method = request.url.host.split(".")[0], request.url.path, request.method
        if path == "/api/v1/cluster/members":
            return httpx.Response(200, json={"members": [
                {**self.self_doc(m), "admin_url": f"http://{m}.test", "state": "healthy"} for m in self.members],
                "gateways": [{"name": g, "connected": True, "release_sha256": m.sha}
                             for g, m in self.gateways.items()]})
        if path == "/api/v1/gateways":
            return httpx.Response(200, json={"gateways": [
                {"name": g, "connected": True, "restartable": True, "started_at": m.started, "pid": 7,
                 "release_sha256": m.sha, "upgrade_refused": m.refuse if m.started else None}
                for g, m in self.gateways.items()]})
        if path.startswith("/api/v1/gateways/") and path.endswith("/upgrade"):
            name = path.split("/")[4]
            return self._upgrade(f"gateway {name}", self.gateways[name], json.loads(request.content))
        if path == "/api/v1/cluster/self":
            if self.members[host].stays_away and self.members[host].started:
                raise httpx.ConnectError("connection refused")
            return httpx.Response(200, json=self.self_doc(host))
        if path.startswith("/api/v1/releases/") and method == "PUT":
            self.uploads[host] = request.read()
            return httpx.Response(200, json={"sha256": path.rsplit("/", 1)[1]})
        if path == "/api/v1/cluster/self/upgrade":
            return self._upgrade(f"member {host}", self.members[host], json.loads(request.content))
        if path == "/api/v1/nodes":
            return httpx.Response(200, json={"nodes": [
                {"node": n, "state": "connected", "connected_at": m.started, "replicas": ["demo-r1"],
                 "release_sha256": m.sha, "upgrade_refused": m.refuse if m.started else None}
                for n, m in self.nodes.items()]})
        if path.startswith("/api/v1/nodes/") and path.endswith("/upgrade"):
            name = path.split("/")[4]
            return self._upgrade(f"node {name}", self.nodes[name], json.loads(request.content))
        return httpx.Response(404, json={"error": {"code": "not_found", "message": path}})

    def _upgrade(self, who: str, machine: Machine, body: dict[str, Any]) -> httpx.Response:
        self.asked.append(who)
        before = machine.sha
        to = body.get("sha256") or machine.previous
        machine.started += 1  # asked: a node marks a refusal, the others restart into the file
        if machine.refuse is None and not machine.stays_away:
            machine.previous, machine.sha = before, str(to)
        if who.startswith("member") and who.endswith(self.leader) and machine.refuse is None:
            self.leader = "m2"  # the leader hands over first
        return httpx.Response(200, json={"upgrading": who, "to": to, "from": before,
                                         "connected_at": machine.started - 1, "started_at": machine.started - 1})


@pytest.fixture(autouse=True)
def quick_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMGW_TIMEOUTS", "ctl_poll_s=0.001,upgrade_machine_s=60")


def run(cluster: FakeCluster, *argv: str) -> Any:
    return ctl(["upgrade", *argv], transport=httpx.MockTransport(cluster), env={**ENV, "LLMGW_URL": "http://m1.test"})


def test_standbys_then_the_leader_then_each_agent_all_on_the_new_hash(tmp_path: Path) -> None:
    new = zipapp(tmp_path / "new.pyz", "new")
    sha = hashlib.sha256(new.read_bytes()).hexdigest()
    cluster = FakeCluster()
    r = run(cluster, str(new))
    assert r.rc == 0, r.err
    assert cluster.asked == ["member m2", "member m3", "member m1", "gateway gw-1", "node n1", "node n2"]
    assert set(cluster.uploads) == {"m1", "m2", "m3"} and all(u == new.read_bytes() for u in cluster.uploads.values())
    assert {m.sha for m in [*cluster.members.values(), *cluster.gateways.values(), *cluster.nodes.values()]} == {sha}
    lines = [line for line in r.out.splitlines() if line.startswith("[")]
    assert [line.split("] ")[1].split(":")[0] for line in lines] == [
        "1/6 member m2", "2/6 member m3", "3/6 member m1", "4/6 gateway gw-1", "5/6 node n1", "6/6 node n2"]
    assert "gateways: not upgraded" not in r.out

    # Again with the same file: every machine is skipped, said so, and none is asked anything (nor uploaded to).
    cluster.uploads.clear()
    again = run(cluster, str(new))
    assert again.rc == 0, again.err
    assert cluster.asked == ["member m2", "member m3", "member m1", "gateway gw-1", "node n1", "node n2"]
    assert again.out.count("already runs") == 6 and cluster.uploads == {}


def test_a_machine_is_judged_by_its_hash_never_its_version(tmp_path: Path) -> None:
    """A machine whose binary was installed by hand says the new version, but runs another file: upgraded."""
    new = zipapp(tmp_path / "new.pyz", "new")
    sha = hashlib.sha256(new.read_bytes()).hexdigest()
    cluster = FakeCluster()
    cluster.members["m3"].sha = sha  # this one already runs the very file: skipped
    r = run(cluster, str(new))
    assert r.rc == 0, r.err
    assert "member m3" not in cluster.asked and "member m2" in cluster.asked
    assert "m3: already runs" in r.out


def test_the_first_failure_stops_the_run_and_leaves_the_rest(tmp_path: Path) -> None:
    new = zipapp(tmp_path / "new.pyz", "new")
    cluster = FakeCluster()
    cluster.nodes["n1"].refuse = "fetch_failed: the control plane answered 404"
    r = run(cluster, "--json", str(new))
    assert r.rc == 1
    assert "node n1: its agent refused: fetch_failed" in r.err and "the 1 machine(s) after it were left" in r.err
    assert cluster.asked[-1] == "node n1" and cluster.nodes["n2"].sha == OLD and cluster.nodes["n2"].started == 0
    events = [json.loads(line) for line in r.out.splitlines()]
    assert events[0]["event"] == "start" and events[-1]["outcome"] == "failed" and events[-1]["machine"] == "n1"


def test_a_machine_that_does_not_come_back_in_its_time_stops_the_run(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMGW_TIMEOUTS", "ctl_poll_s=0.001,upgrade_machine_s=0.05")
    new = zipapp(tmp_path / "new.pyz", "new")
    cluster = FakeCluster()
    cluster.members["m2"].stays_away = True
    r = run(cluster, str(new))
    assert r.rc == 1
    assert "member m2: not back within 0.05 s" in r.err and "connection refused" in r.err
    assert cluster.asked == ["member m2"]


def test_rollback_returns_the_agents_to_the_file_they_ran_before(tmp_path: Path) -> None:
    new = zipapp(tmp_path / "new.pyz", "new")
    cluster = FakeCluster()
    assert run(cluster, str(new)).rc == 0
    cluster.asked.clear()
    r = run(cluster, "--rollback")
    assert r.rc == 0, r.err
    assert cluster.asked == ["gateway gw-1", "node n1", "node n2"]  # control planes only with --members
    assert {m.sha for m in [*cluster.gateways.values(), *cluster.nodes.values()]} == {OLD}


def test_what_is_not_a_release_is_refused_before_anything_is_asked(tmp_path: Path) -> None:
    cluster = FakeCluster()
    (tmp_path / "script.sh").write_text("#!/bin/sh\n")
    for argv in ([str(tmp_path / "script.sh")], [str(tmp_path / "missing.pyz")], [], ["--members"],
                 [str(zipapp(tmp_path / "x.pyz", "x")), "--rollback"]):
        r = run(cluster, *argv)
        assert r.rc == 2, (argv, r.err)
    assert cluster.asked == [] and cluster.uploads == {}


def test_an_agent_that_runs_no_release_file_stops_the_run_before_it_is_asked(tmp_path: Path) -> None:
    new = zipapp(tmp_path / "new.pyz", "new")
    cluster = FakeCluster()
    cluster.nodes["n1"].sha = None  # type: ignore[assignment]
    r = run(cluster, str(new))
    assert r.rc == 1 and "node n1: its agent runs no release file" in r.err, r.err
    assert "node n1" not in cluster.asked and cluster.nodes["n2"].started == 0


def test_a_gateway_that_refuses_stops_the_run_before_the_agents(tmp_path: Path) -> None:
    new = zipapp(tmp_path / "new.pyz", "new")
    cluster = FakeCluster()
    cluster.gateways["gw-1"].refuse = "fetch_failed: the control plane answered 404"
    r = run(cluster, str(new))
    assert r.rc == 1
    assert "gateway gw-1: it refused: fetch_failed" in r.err and "the 2 machine(s) after it were left" in r.err
    assert cluster.asked[-1] == "gateway gw-1" and {m.started for m in cluster.nodes.values()} == {0}
    assert cluster.gateways["gw-1"].sha == OLD


def test_a_gateway_that_runs_no_release_file_stops_the_run_before_it_is_asked(tmp_path: Path) -> None:
    new = zipapp(tmp_path / "new.pyz", "new")
    cluster = FakeCluster()
    cluster.gateways["gw-1"].sha = None  # type: ignore[assignment]
    r = run(cluster, str(new))
    assert r.rc == 1 and "gateway gw-1: it runs no release file" in r.err, r.err
    assert "gateway gw-1" not in cluster.asked and {m.started for m in cluster.nodes.values()} == {0}
