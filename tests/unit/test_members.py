"""Several control planes as one group, without processes: what a standby forwards and how,
the member table, membership changes and their refusals, announcements, and the pure parts
(the `member.*` commands, the member rows and warnings, the state hash)."""

from __future__ import annotations

import json
from typing import Any, Callable

import httpx
import pytest
import trio
import trio.testing
from pysyncobj import FAIL_REASON

from llmgw.control.api import make_app
from llmgw.control.context import Context
from llmgw.control.hub import AgentHub
from llmgw.control.members import ANSWERED_BY, FORWARDED_BY, Members, advertised_url
from llmgw.control.reconciler import Reconciler
from llmgw.domain import commands, summary
from llmgw.domain.codec import state_from_json, state_hash, state_to_json
from llmgw.domain.commands import CommandError
from llmgw.domain.keys import hash_key
from llmgw.domain.state import ClusterState
from llmgw.domain.timeouts import TIMEOUTS
from llmgw.store import StoreUnavailable
from llmgw.store.membership import MemberChanges, MembershipBusy, keep_a_group_of_one
from llmgw.store.snapshot import Snapshot, SnapshotFiles
from llmgw.testing.group import FakeGroup
from tests.support.processes import free_port

ADMIN = "sk-members-admin"
A, B, C = "10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7000"
LEADER_URL = "http://leader.test:8081"
Handler = Callable[[httpx.Request], httpx.Response]


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


def never(request: httpx.Request) -> httpx.Response:
    raise AssertionError(f"nothing should have been sent: {request.method} {request.url}")


def member(self_addr: str = B, *, leader: str | None = A, leader_url: str | None = LEADER_URL,
           partners: dict[str, int] | None = None, handler: Handler = never) -> tuple[FakeGroup, Any]:
    """A member (a standby of A by default) with the admin key, and its admin app."""
    group = FakeGroup(self_addr, leader=leader,
                      partners=partners if partners is not None else {a: 2 for a in (A, B, C) if a != self_addr})
    group.submit_nowait(commands.add_key(hash_key(ADMIN), "admin", "admin", 0.0))
    if leader is not None and leader_url is not None:  # the leader announced itself
        group.submit_nowait(commands.announce_member(leader, leader_url, "0.1", 0.0))
    members = Members(group, group, self_addr=self_addr, clock=lambda: 1000.0,
                      transport=httpx.MockTransport(handler))
    members.admin_url = f"http://{self_addr.split(':')[0]}:8081"
    deps = Context(store=group, hub=AgentHub(), reconciler=Reconciler(group, AgentHub()), clock=lambda: 1000.0,
                       self_id=self_addr, store_status=group.status, members=members)
    return group, make_app(deps)


def client(app: Any, **headers: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://member.test",
                             headers={"Authorization": f"Bearer {ADMIN}", **headers})


def error_of(r: httpx.Response) -> dict[str, str]:
    assert r.headers["content-type"] == "application/json", r.text
    doc = r.json()
    assert set(doc) == {"error"} and set(doc["error"]) == {"code", "message"} and doc["error"]["message"], doc
    return doc["error"]  # type: ignore[no-any-return]


# --- forwarding: a standby sends every admin request but its own to the leader -----------------------------------


async def test_a_write_to_a_standby_reaches_the_leader_as_sent_and_its_answer_comes_back_as_is() -> None:
    sent: list[httpx.Request] = []

    def leader(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(207, content=b'{"removed": "a/b"}', headers={"content-type": "application/json"})

    group, app = member(handler=leader)
    before = group.snapshot()
    async with client(app, **{"Idempotency-Key": "rm-1"}) as c:
        r = await c.request("DELETE", "/api/v1/models/a%2Fb?why=test", content=b"{}")
    assert (r.status_code, r.content, r.headers[ANSWERED_BY]) == (207, b'{"removed": "a/b"}', A)
    [request] = sent
    assert request.method == "DELETE" and request.content == b"{}"
    assert str(request.url) == LEADER_URL + "/api/v1/models/a%2Fb?why=test", "escapes and query kept"
    assert request.headers["authorization"] == f"Bearer {ADMIN}" and request.headers["idempotency-key"] == "rm-1"
    assert request.headers[FORWARDED_BY] == B
    assert group.snapshot() is before, "nothing applied on the standby"


async def test_reads_are_forwarded_too_and_so_is_a_request_the_leader_will_refuse() -> None:
    sent: list[httpx.Request] = []

    def leader(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        if request.headers.get("authorization") != f"Bearer {ADMIN}":
            return httpx.Response(401, json={"error": {"code": "unauthorized", "message": "not an admin key"}})
        return httpx.Response(200, json={"models": []})

    _, app = member(handler=leader)
    async with client(app) as c:
        assert (await c.get("/api/v1/models")).json() == {"models": []}
        assert (await c.get("/api/v1/status")).status_code == 200
        refused = await c.get("/api/v1/models", headers={"Authorization": "Bearer sk-other"})
    assert error_of(refused)["code"] == "unauthorized", "the leader decides who may, with the newest keys"
    assert [r.url.path for r in sent] == ["/api/v1/models", "/api/v1/status", "/api/v1/models"]


async def test_the_member_routes_are_answered_by_the_member_asked() -> None:
    group, app = member(partners={})  # a standby whose group it alone knows of
    async with client(app) as c:
        me = (await c.get("/api/v1/cluster/self")).json()
        listed = (await c.get("/api/v1/cluster/members")).json()
    assert me["raft_addr"] == B and me["role"] == "standby" and me["leader"] == A
    assert me["revision"] == group.snapshot().revision and me["state_hash"] == state_hash(group.snapshot())
    assert [row["id"] for row in listed["members"]] == [B] and listed["leader"] == A


@pytest.mark.parametrize(("leader", "url", "code", "words"), [
    (None, None, "no_leader", "no leader is elected now"),
    (A, None, "leader_unreachable", "has not announced its admin URL"),
])
async def test_without_a_leader_to_go_to_it_says_so_at_once(leader: str | None, url: str | None, code: str,
                                                            words: str) -> None:
    _, app = member(leader=leader, leader_url=url)
    async with client(app) as c:
        for method, path in (("GET", "/api/v1/status"), ("PUT", "/api/v1/settings/serving.stopped")):
            r = await c.request(method, path, content=b"true")
            assert r.status_code == 503
            err = error_of(r)
            assert err["code"] == code and words in err["message"], err


@pytest.mark.parametrize(("method", "failure", "code", "words"), [
    ("PUT", httpx.ConnectError("All connection attempts failed"), "leader_unreachable", "nothing was written"),
    ("GET", httpx.ConnectError("All connection attempts failed"), "leader_unreachable", "nothing was read"),
    ("PUT", httpx.ReadTimeout("timed out"), "commit_unknown", "may or may not have been applied"),
    ("GET", httpx.ReadTimeout("timed out"), "leader_unreachable", "did not come back"),
])
async def test_a_leader_that_does_not_answer_is_a_worded_503(method: str, failure: Exception, code: str,
                                                              words: str) -> None:
    def leader(request: httpx.Request) -> httpx.Response:
        raise failure

    _, app = member(handler=leader)
    async with client(app, **{"Idempotency-Key": "k"}) as c:
        r = await c.request(method, "/api/v1/settings/serving.stopped", content=b"true")
    assert r.status_code == 503
    err = error_of(r)
    assert err["code"] == code and words in err["message"] and A in err["message"], err


async def test_a_forwarded_request_is_never_forwarded_again() -> None:
    _, app = member()
    async with client(app, **{FORWARDED_BY: C}) as c:
        r = await c.put("/api/v1/settings/serving.stopped", content=b"true")
    err = error_of(r)
    assert r.status_code == 503 and err["code"] == "not_leader" and C in err["message"] and "retry" in err["message"]


# --- the member table ---------------------------------------------------------------------------------------------


async def test_the_table_asks_each_member_and_shows_one_that_does_not_answer_as_missing() -> None:
    asked: list[httpx.Request] = []

    def others(request: httpx.Request) -> httpx.Response:
        asked.append(request)
        if request.url.host == "10.0.0.2":
            return httpx.Response(200, json={"raft_addr": B, "role": "standby", "leader": A, "ready": True,
                                             "commit_index": 41, "applied_index": 38, "revision": 0,
                                             "state_hash": "sha256:x", "admin_url": "http://10.0.0.2:8081"})
        raise httpx.ConnectError("Connection refused")

    group, app = member(A, leader=A, handler=others)
    for addr in (B, C):
        group.submit_nowait(commands.announce_member(addr, f"http://{addr.split(':')[0]}:8081", "0.1", 1.0))
    async with client(app) as c:
        doc = (await c.get("/api/v1/cluster/members")).json()
    rows = {r["id"]: r for r in doc["members"]}
    assert [r.headers["authorization"] for r in asked] == [f"Bearer {ADMIN}"] * 2, "the caller's key, to each"
    assert rows[A]["state"] == "healthy" and rows[A]["role"] == "leader" and rows[A]["lag"] == 0
    assert rows[B]["state"] == "healthy" and rows[B]["last_contact"] == 1000.0
    assert rows[B]["lag"] == group.status()["commit_index"] - 38, "behind the leader's commit index"
    assert rows[C]["state"] == "missing" and "connection refused" in rows[C]["reason"]
    assert rows[C]["commit_index"] is None and rows[C]["state_hash"] is None and rows[C]["last_contact"] is None
    assert any(C in w and "missing" in w for w in doc["warnings"])


async def test_a_member_that_never_announced_or_answers_as_another_is_missing_with_why() -> None:
    def impostor(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"raft_addr": "10.9.9.9:7000"})

    group, app = member(A, leader=A, handler=impostor)
    group.submit_nowait(commands.announce_member(B, "http://10.0.0.2:8081", "0.1", 1.0))
    async with client(app) as c:
        rows = {r["id"]: r for r in (await c.get("/api/v1/cluster/members")).json()["members"]}
    assert rows[B]["state"] == "missing" and "is member '10.9.9.9:7000', not" in rows[B]["reason"]
    assert rows[C]["state"] == "missing" and "has not announced its admin URL" in rows[C]["reason"]


# --- membership changes, on the leader ---------------------------------------------------------------------------


async def test_adding_a_running_member_commits_the_change_and_a_retry_answers_the_same() -> None:
    group, app = member(A, leader=A)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, lambda stream: stream.aclose(), 0)
        port = listeners[0].socket.getsockname()[1]
        addr = f"127.0.0.1:{port}"
        async with client(app, **{"Idempotency-Key": "add-1"}) as c:
            r = await c.post("/api/v1/cluster/members", json={"raft_addr": addr})
            again = await c.post("/api/v1/cluster/members", json={"raft_addr": addr})
        nursery.cancel_scope.cancel()
    assert r.status_code == 201 and r.json() == {"added": addr, "members": sorted([A, B, C, addr])}
    assert (again.status_code, again.content) == (201, r.content)
    assert group.changes == [("add", addr)], "applied once"


@pytest.mark.parametrize(("body", "status", "code", "words"), [
    ({"raft_addr": B}, 409, "member_exists", "already a member"),
    ({"raft_addr": "0.0.0.0:7000"}, 400, "invalid_member", "names no machine"),
    ({"raft_addr": "no-port"}, 400, "invalid_member", "is not HOST:PORT"),
    ({"addr": "x:1"}, 400, "invalid_member", "raft_addr"),
    ({"raft_addr": "127.0.0.1:PORT"}, 409, "member_unreachable", "start the new member first"),
])
async def test_an_add_that_cannot_work_is_refused_with_words(body: dict[str, str], status: int, code: str,
                                                             words: str) -> None:
    group, app = member(A, leader=A)
    if body.get("raft_addr") == "127.0.0.1:PORT":
        body = {"raft_addr": f"127.0.0.1:{free_port()}"}  # nothing listens there
    async with client(app) as c:
        r = await c.post("/api/v1/cluster/members", json=body)
    err = error_of(r)
    assert (r.status_code, err["code"]) == (status, code) and words in err["message"], err
    assert group.changes == []


async def test_no_change_that_would_leave_the_group_without_a_majority() -> None:
    group, app = member(A, leader=A, partners={B: 2, C: 0})
    async with client(app) as c:
        r = await c.delete(f"/api/v1/cluster/members/{B}")
    err = error_of(r)
    assert r.status_code == 409 and err["code"] == "would_lose_quorum" and "needs 2 up" in err["message"], err
    assert group.changes == []


async def test_one_change_at_a_time(autojump_clock: trio.testing.MockClock) -> None:
    group, app = member(A, leader=A)
    group.hold = trio.Event()
    with trio.fail_after(5):  # a second change let through would wait on the first: fail, not hang
        await one_change_at_a_time(group, app)
    assert group.changes == [("remove", C)]


async def one_change_at_a_time(group: FakeGroup, app: Any) -> None:
    assert group.hold is not None
    async with client(app) as c, trio.open_nursery() as nursery:
        first: list[httpx.Response] = []

        async def remove_c() -> None:
            first.append(await c.delete(f"/api/v1/cluster/members/{C}"))

        nursery.start_soon(remove_c)
        await trio.testing.wait_all_tasks_blocked()
        second = await c.delete(f"/api/v1/cluster/members/{B}")
        err = error_of(second)
        assert second.status_code == 409 and err["code"] == "membership_change_in_progress"
        assert f"remove {C}" in err["message"]
        group.hold.set()
    assert first[0].status_code == 200 and first[0].json() == {"removed": C, "members": [A, B]}


async def test_removing_forgets_the_announcement_and_the_leader_cannot_remove_itself() -> None:
    group, app = member(A, leader=A)
    group.submit_nowait(commands.announce_member(C, "http://10.0.0.3:8081", "0.1", 1.0))
    async with client(app) as c:
        own = await c.delete(f"/api/v1/cluster/members/{A}")
        ghost = await c.delete("/api/v1/cluster/members/10.9.9.9:1")
        gone = await c.delete(f"/api/v1/cluster/members/{C}")
    assert own.status_code == 409 and error_of(own)["code"] == "member_leads"
    assert ghost.status_code == 404 and error_of(ghost)["code"] == "member_not_found"
    assert gone.status_code == 200 and C not in group.snapshot().members


async def test_member_changes_refuse_a_second_one_while_the_first_is_in_flight() -> None:
    changes = MemberChanges()
    token = trio.lowlevel.current_trio_token()
    callbacks: list[Callable[[Any, Any], None]] = []
    async with trio.open_nursery() as nursery:
        results: list[Any] = []

        async def first() -> None:
            results.append(await changes.run("adding x:1", callbacks.append, token, 5.0))

        nursery.start_soon(first)
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(MembershipBusy, match=r"in progress \(adding x:1\)"):
            await changes.run("adding y:1", callbacks.append, token, 5.0)
        callbacks[0](None, FAIL_REASON.SUCCESS)
    assert results == [FAIL_REASON.SUCCESS] and changes.pending is None
    with pytest.raises(MembershipBusy, match="previous membership change is not committed"):
        await changes.run("adding y:1", lambda cb: cb(None, FAIL_REASON.REQUEST_DENIED), token, 5.0)


async def test_a_change_without_an_answer_in_time_is_unknown_not_failed(autojump_clock: Any) -> None:
    changes = MemberChanges()
    assert await changes.run("adding x:1", lambda cb: None, trio.lowlevel.current_trio_token(), 5.0) is None
    assert changes.pending is None


@pytest.mark.parametrize(("members", "after"), [
    ((A,), (C,)),  # a group of one at a new address (`llmgw up` takes a free port): still a group of one
    ((A, B, C), (A, B, C)),  # a group's list stays as it is: an address is a member's name there
    ((C,), (C,)),
])
def test_a_group_of_one_follows_its_member_to_a_new_address(members: tuple[str, ...], after: tuple[str, ...],
                                                             tmp_path: Any) -> None:
    files = SnapshotFiles(tmp_path / "snapshot.json")
    files.loaded = Snapshot(ClusterState(), (b"x", 2, 1), (b"y", 1, 1), members)
    keep_a_group_of_one(files, C)
    assert files.loaded.members == after


# --- announcements ------------------------------------------------------------------------------------------------


class FlakyGroup(FakeGroup):
    def __init__(self, failures: int) -> None:
        super().__init__(B, leader=A)
        self.failures = failures

    async def submit(self, command: dict[str, Any], *, through_leader: bool = False) -> Any:
        if self.failures:
            self.failures -= 1
            raise StoreUnavailable("commit failed: no leader")
        return await super().submit(command, through_leader=through_leader)


async def test_a_member_announces_itself_through_the_leader_and_again_when_the_state_differs(
    autojump_clock: trio.testing.MockClock,
) -> None:
    group = FlakyGroup(failures=2)
    members = Members(group, group, self_addr=B, clock=lambda: 5.0, timeouts=TIMEOUTS)
    members.admin_url = "http://10.0.0.2:8081"
    async with trio.open_nursery() as nursery:
        nursery.start_soon(members.announce_forever)
        await trio.sleep(2 * TIMEOUTS.member_announce_retry_s + 0.1)
        assert group.snapshot().members[B].admin_url == "http://10.0.0.2:8081"
        assert len(group.through_leader) == 1, "retried after each failure, then sent once"
        await trio.sleep(10)
        assert len(group.through_leader) == 1, "nothing more while the state says what it should"
        group.submit_nowait(commands.announce_member(B, "http://old:8081", "0.0", 6.0))  # a stale announcement
        await trio.testing.wait_all_tasks_blocked()
        assert group.snapshot().members[B].admin_url == "http://10.0.0.2:8081" and len(group.through_leader) == 2
        nursery.cancel_scope.cancel()


async def test_a_leader_has_announced_itself_when_it_starts(autojump_clock: trio.testing.MockClock) -> None:
    group = FakeGroup(A, leader=A)
    members = Members(group, group, self_addr=A, clock=lambda: 5.0)
    members.admin_url = "http://10.0.0.1:8081"
    async with trio.open_nursery() as nursery:
        await nursery.start(members.announce_forever)
        assert group.snapshot().members[A].admin_url == "http://10.0.0.1:8081"
        nursery.cancel_scope.cancel()


def test_the_advertised_url_names_a_machine() -> None:
    assert advertised_url("http://127.0.0.1:8081", "10.0.0.2:7000") == "http://127.0.0.1:8081"
    assert advertised_url("http://0.0.0.0:8081", "10.0.0.2:7000") == "http://10.0.0.2:8081"
    assert advertised_url("http://[::]:8081", "[fd00::2]:7000") == "http://[fd00::2]:8081"
    assert advertised_url("http://cp1.lan:8081/", "cp1.lan:7000") == "http://cp1.lan:8081"


# --- the pure parts -----------------------------------------------------------------------------------------------


def test_member_commands_announce_replace_and_forget() -> None:
    s, result = commands.apply(ClusterState(), commands.announce_member(A, "http://a:1", "0.1", 1.0))
    assert result == {"announced": A} and s.members[A].admin_url == "http://a:1" and s.members[A].announced_at == 1.0
    s, _ = commands.apply(s, commands.announce_member(A, "https://a.example", "0.2", 2.0))
    assert (s.members[A].admin_url, s.members[A].version) == ("https://a.example", "0.2")
    s, result = commands.apply(s, commands.forget_member(A, 3.0))
    assert result == {"forgotten": True} and A not in s.members
    assert commands.apply(s, commands.forget_member(A, 4.0))[1] == {"forgotten": False}


@pytest.mark.parametrize("bad", [
    commands.announce_member("no-port", "http://a:1", "0.1", 1.0),
    commands.announce_member("a:99999", "http://a:1", "0.1", 1.0),
    commands.announce_member(A, "ftp://a", "0.1", 1.0),
    commands.make("member.announce", 1.0, raft_addr=A, admin_url="http://a:1", version=1),
    commands.make("member.forget", 1.0, raft_addr=""),
])
def test_a_malformed_member_command_is_refused_before_the_log(bad: dict[str, Any]) -> None:
    with pytest.raises(CommandError) as e:
        commands.decode(commands.encode(bad))
    assert e.value.code in ("invalid_member", "bad_command")


def view(addr: str, **answer: Any) -> dict[str, Any]:
    base = {"raft_addr": addr, "role": "standby", "leader": A, "ready": True, "term": 2, "commit_index": 500,
            "applied_index": 500, "revision": 9, "state_hash": "sha256:h"}
    return {"id": addr, "admin_url": f"http://{addr}", "answer": {**base, **answer}, "last_contact": 990.0}


def test_member_rows_count_the_lag_against_the_leader_and_never_guess() -> None:
    rows = summary.member_rows([
        view(A, role="leader", commit_index=700, applied_index=700),
        view(B, commit_index=650, applied_index=650),  # behind by 50: still healthy
        view(C, commit_index=700, applied_index=450),
        {"id": "10.0.0.4:7000", "admin_url": None, "error": "no answer within 1 s", "last_contact": None},
        view("10.0.0.5:7000", ready=False),
        view("10.0.0.6:7000", leader=None),
    ], now=1000.0)
    states = {r["id"]: (r["state"], r["lag"]) for r in rows}
    assert states == {A: ("healthy", 0), B: ("healthy", 50), C: ("catching up", 250),
                      "10.0.0.4:7000": ("missing", None), "10.0.0.5:7000": ("catching up", 200),
                      "10.0.0.6:7000": ("catching up", 200)}
    missing = rows[3]
    assert missing["reason"] == "no answer within 1 s" and missing["last_contact_age_s"] is None
    assert all(missing[k] is None for k in ("role", "commit_index", "applied_index", "revision", "state_hash"))
    assert rows[0]["last_contact_age_s"] == 10.0
    assert "250 entries behind" in rows[2]["reason"]


def test_member_warnings_say_how_many_more_failures_the_group_survives() -> None:
    three = summary.member_rows([view(A, role="leader"), view(B), view(C)], 1000.0)
    assert summary.member_warnings(three) == []
    one_down = summary.member_rows([view(A, role="leader"), view(B), {"id": C, "error": "refused"}], 1000.0)
    assert summary.member_warnings(one_down) == [f"control plane {C} is missing: refused",
                                                 "2 of 3 control planes are healthy: one more failure stops writes"]
    two_down = summary.member_rows([view(A), {"id": B, "error": "x"}, {"id": C, "error": "y"}], 1000.0)
    assert "only 1 of 3 control planes are healthy: writes need 2 (a majority)" in summary.member_warnings(two_down)
    four = summary.member_rows([view(a) for a in (A, B, C, "10.0.0.4:7000")], 1000.0)
    assert any("the group has 4 members" in w for w in summary.member_warnings(four))
    split = summary.member_rows([view(A, role="leader"), view(B, role="leader", state_hash="sha256:other"),
                                 view(C)], 1000.0)
    words = summary.member_warnings(split)
    assert any("more than one member says it leads" in w for w in words)
    assert any("different states at revision 9" in w for w in words)
    assert summary.member_warnings(summary.member_rows([view(A, role="leader")], 1000.0)) == [], "a group of one"


def test_the_state_hash_is_the_states_and_survives_the_codec() -> None:
    s, _ = commands.apply(ClusterState(), commands.put_setting("serving.stopped", True, 1.0))
    t, _ = commands.apply(ClusterState(), commands.put_setting("serving.stopped", True, 1.0))
    assert state_hash(s) == state_hash(t) and state_hash(s).startswith("sha256:")
    assert state_hash(state_from_json(json.loads(json.dumps(state_to_json(s))))) == state_hash(s)
    u, _ = commands.apply(ClusterState(), commands.put_setting("serving.stopped", False, 1.0))
    assert state_hash(u) != state_hash(s)
