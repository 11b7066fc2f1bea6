"""Three `llmgw control` processes on loopback as one group: a write sent to a standby is
forwarded to the leader and read back on another standby; the leader is SIGKILLed and the
group goes on; the killed member comes back and catches up to the same state hash; a fourth
member is added and removed at run time."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import httpx
import pytest

from llmgw.cli.ctl import run_ctl
from tests.support.cluster import Member
from tests.support.trust import create_token
from tests.support.processes import free_port

pytestmark = pytest.mark.slow

ADMIN = "sk-cluster-admin"
T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T | None], timeout: float, logs: list[Member]) -> T:
    deadline = time.monotonic() + timeout
    while True:
        try:
            found = probe()
        except httpx.HTTPError:
            found = None
        if found is not None and found is not False:
            return found
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {m.name}\n{m.log.read_text()[-3000:]}" for m in logs if m.log.exists())
            raise AssertionError(f"{what} not within {timeout:g} s\n{tails}")
        time.sleep(0.1)


def get(url: str, path: str) -> httpx.Response:
    return httpx.get(url + path, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=5)


def members_of(m: Member) -> dict[str, dict[str, Any]]:
    doc = get(m.url, "/api/v1/cluster/members").json()
    return {row["id"]: row for row in doc["members"]}


def all_healthy(ask: Member, expected: list[Member]) -> dict[str, dict[str, Any]] | None:
    rows = members_of(ask)
    if sorted(rows) != sorted(m.raft_addr for m in expected):
        return None
    if not all(r["state"] == "healthy" and r["admin_url"] for r in rows.values()):
        return None
    return rows


def settled(ask: Member, expected: list[Member]) -> dict[str, dict[str, Any]] | None:
    """Every member healthy and at one revision (nothing in flight)."""
    rows = all_healthy(ask, expected)
    if rows is None or len({r["revision"] for r in rows.values()}) != 1:
        return None
    return rows


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Member]]:
    root = tmp_path_factory.mktemp("cluster")
    members = [Member(f"m{i}", root / f"m{i}") for i in (1, 2, 3)]
    addrs = [m.raft_addr for m in members]
    first = members[0]
    # The first start of the first member makes the group's secret; the others get a copy, and
    # only the first gets LLMGW_ADMIN_KEY (it seeds through whichever member leads).
    first.start([a for a in addrs if a != first.raft_addr], env={"LLMGW_ADMIN_KEY": ADMIN})
    secret = wait_for("the first member's cluster secret", lambda: (first.state_dir / "cluster.secret").exists()
                      and first.state_dir / "cluster.secret", 20, members)
    for m in members[1:]:
        m.start([a for a in addrs if a != m.raft_addr], extra=["--cluster-secret-file", str(secret)])
    try:
        wait_for("three healthy, announced members", lambda: all_healthy(members[1], members), 30, members)
        yield members
    finally:
        for m in members:
            m.stop()


def roles(cluster: list[Member]) -> tuple[Member, list[Member]]:
    rows = members_of(cluster[0])
    leader = [m for m in cluster if rows[m.raft_addr]["role"] == "leader"]
    assert len(leader) == 1, rows
    return leader[0], [m for m in cluster if m is not leader[0]]


def test_a_write_to_a_standby_is_forwarded_and_read_on_another(cluster: list[Member]) -> None:
    leader, (one, other) = roles(cluster)
    model = {"name": "fwd", "engine": "sim", "source": "sim://fwd"}
    key = {"Authorization": f"Bearer {ADMIN}", "Idempotency-Key": "fwd-1"}
    r = httpx.post(one.url + "/api/v1/models", json=model, headers=key, timeout=10)
    assert r.status_code == 201, r.text
    assert r.headers["x-llmgw-answered-by"] == leader.raft_addr
    read = get(other.url, "/api/v1/models/fwd")
    assert read.status_code == 200 and read.json()["model"]["source"] == "sim://fwd", read.text
    # A retry with the same key through the other standby answers as the first and applies nothing.
    revision = get(leader.url, "/api/v1/status").json()["cluster"]["revision"]
    again = httpx.post(other.url + "/api/v1/models", json=model, headers=key, timeout=10)
    assert (again.status_code, again.json()) == (201, r.json())
    assert get(leader.url, "/api/v1/status").json()["cluster"]["revision"] == revision
    # The leader checks the key, and its refusal is relayed as is.
    bad = httpx.delete(one.url + "/api/v1/models/fwd", headers={"Authorization": "Bearer sk-wrong"}, timeout=10)
    assert bad.status_code == 401 and bad.json()["error"]["code"] == "unauthorized"


def test_every_member_is_listed_with_the_same_state_hash(cluster: list[Member]) -> None:
    leader, standbys = roles(cluster)
    for i in range(3):
        assert httpx.put(standbys[i % 2].url + f"/api/v1/settings/placement.warn_interval_s", json=60 + i,
                         headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10).status_code == 200
    rows = wait_for("the members at one revision", lambda: settled(standbys[0], cluster), 10, cluster)
    assert len({r["state_hash"] for r in rows.values()}) == 1, rows
    assert next(iter(rows.values()))["state_hash"].startswith("sha256:")
    for m in cluster:
        row = rows[m.raft_addr]
        assert row["role"] == ("leader" if m is leader else "standby")
        assert row["admin_url"] == m.url and row["leader"] == leader.raft_addr
        assert row["lag"] == 0 and row["applied_index"] == row["commit_index"]
        assert row["last_contact_age_s"] is not None and row["last_contact_age_s"] < 5
    # `ctl status` through a standby shows the same table (the standby forwards; the leader asks each).
    out = subprocess.run([sys.executable, "-m", "llmgw", "ctl", "--url", standbys[1].url, "--key", ADMIN, "status"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert f"leader: {leader.raft_addr}" in out.stdout and "CONTROL PLANES" in out.stdout
    assert out.stdout.count("healthy") == 3, out.stdout


def test_the_group_survives_a_sigkill_of_its_leader(cluster: list[Member]) -> None:
    leader, survivors = roles(cluster)
    assert leader.proc is not None
    leader.proc.send_signal(signal.SIGKILL)
    leader.proc.wait()
    killed_at = time.monotonic()

    def write_through(member: Member, name: str) -> bool:
        r = httpx.post(member.url + "/api/v1/models", json={"name": name, "engine": "sim", "source": f"sim://{name}"},
                       headers={"Authorization": f"Bearer {ADMIN}", "Idempotency-Key": f"after-kill-{name}"},
                       timeout=10)
        return r.status_code in (200, 201)

    wait_for("a write through a survivor", lambda: write_through(survivors[0], "after-kill-a"), 10, cluster)
    assert time.monotonic() - killed_at < 10
    assert write_through(survivors[1], "after-kill-b"), "a write through the other survivor"
    rows = members_of(survivors[1])
    assert rows[leader.raft_addr]["state"] == "missing", rows
    assert rows[leader.raft_addr]["reason"] and rows[leader.raft_addr]["state_hash"] is None
    assert {rows[m.raft_addr]["role"] for m in survivors} == {"leader", "standby"}

    # Back with its state dir: it catches up, and its state is the others'.
    leader.start([m.raft_addr for m in survivors])
    rows = wait_for("the killed member back and caught up", lambda: settled(survivors[0], cluster), 30, cluster)
    assert len({r["state_hash"] for r in rows.values()}) == 1, rows
    assert get(leader.url, "/api/v1/models/after-kill-b").status_code == 200


def test_a_member_is_added_and_removed_at_run_time(cluster: list[Member]) -> None:
    leader, (standby, _) = roles(cluster)
    addrs = [m.raft_addr for m in cluster]
    fourth = Member("m4", cluster[0].state_dir.parent / "m4")
    nobody = f"127.0.0.1:{free_port()}"
    refused = httpx.post(standby.url + "/api/v1/cluster/members", json={"raft_addr": nobody},
                         headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10)
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "member_unreachable", refused.text
    # The members speak TLS to each other: the fourth gets its certificate first, with a token for the control
    # role (docs/security.md, "Between control planes").
    token = create_token(standby.url, ADMIN, "control", fourth.raft_addr)
    fourth.start(addrs, extra=["--join", "--cluster-secret-file", str(cluster[0].state_dir / "cluster.secret"),
                               "--join-token", token["token"], "--ca-hash", token["ca_hash"], "--join-via", standby.url])
    try:
        wait_for("the fourth member listening", lambda: "raft member" in fourth.log.read_text(), 20, [fourth])
        assert run_ctl(["--url", standby.url, "--key", ADMIN, "members", "add", fourth.raft_addr]) == 0
        group = [*cluster, fourth]
        rows = wait_for("four settled members", lambda: settled(leader, group), 30, group)
        assert len({r["state_hash"] for r in rows.values()}) == 1, rows
        assert rows[fourth.raft_addr]["admin_url"] == fourth.url
        # The leader cannot remove itself; the fourth member goes.
        own = httpx.delete(standby.url + f"/api/v1/cluster/members/{leader.raft_addr}",
                           headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10)
        assert own.status_code == 409 and own.json()["error"]["code"] == "member_leads", own.text
        assert run_ctl(["--url", standby.url, "--key", ADMIN, "members", "remove", fourth.raft_addr]) == 0
        assert sorted(members_of(standby)) == sorted(addrs)
        listed = get(leader.url, "/api/v1/status").json()["cluster"]["members"]
        assert sorted(m["id"] for m in listed) == sorted(addrs)
    finally:
        fourth.stop()
    r = httpx.put(standby.url + "/api/v1/settings/serving.stopped", json=False,
                  headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10)
    assert r.status_code == 200, "the group of three still commits"
