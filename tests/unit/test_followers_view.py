"""What the member table says of the gateways, the agents and the floating address: the leader
lists who follows it (with their last contact), a standby does not guess, unknown is unknown
(never an empty list, never "no"), and `ctl members` / `ctl status` show it."""

from __future__ import annotations

from typing import Any

import httpx
import trio

from ctl_fakes import STATUS, FakeApi, columns, ctl
from llmgw.control.floating import FloatingDuty
from llmgw.control.gateway_stream import GatewayHub
from llmgw.control.hub import AgentHub
from llmgw.control.members import Members
from llmgw.domain import commands, summary
from llmgw.domain.observed import NodeInfo
from llmgw.testing.floating import FakeFloatingAddress
from llmgw.testing.group import FakeGroup

A, B, C = "10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7000"
NOW = 1000.0


def leader_member(floating: FloatingDuty | None = None) -> Members:
    group = FakeGroup(A, leader=A, partners={B: 2, C: 2})
    agents, now = AgentHub(clock=lambda: NOW - 2.0), [NOW - 2.0]
    send, _ = trio.open_memory_channel[dict[str, Any]](1)
    link = agents.connect("node-1", send)
    agents.report_inventory(link, NodeInfo("node-1", cpus=2))
    agents.report_replicas(link, [])
    gateways = GatewayHub(group, A, clock=lambda: now[0])
    gateways.connect("gw-1", "10.0.0.9")
    return Members(group, group, self_addr=A, clock=lambda: NOW, agents=agents, gateways=gateways, floating=floating)


def test_the_leader_lists_its_agents_and_gateways_and_a_standby_does_not_guess() -> None:
    doc = leader_member().self_doc()
    assert [(a["node"], a["connected"], a["replicas"], a["last_contact_age_s"]) for a in doc["agents"]] == [
        ("node-1", True, 0, 2.0)]
    assert [(g["name"], g["address"], g["connected"], g["last_contact_age_s"]) for g in doc["gateways"]] == [
        ("gw-1", "10.0.0.9", True, 2.0)]
    assert doc["floating"] == {"configured": False}
    group = FakeGroup(B, leader=A)
    standby = Members(group, group, self_addr=B, clock=lambda: NOW, agents=AgentHub(), gateways=GatewayHub(group, B))
    assert (standby.self_doc()["agents"], standby.self_doc()["gateways"]) == (None, None), "not [], unknown"


async def test_a_standbys_table_shows_the_leaders_followers_or_why_it_cannot() -> None:
    leader_doc = leader_member().self_doc()
    answering = [True]

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "10.0.0.1" and answering[0]:
            return httpx.Response(200, json=leader_doc)
        raise httpx.ConnectError("connection refused")

    group = FakeGroup(B, leader=A, partners={A: 2, C: 2})
    for addr in (A, B, C):
        group.submit_nowait(commands.announce_member(addr, f"http://{addr.split(':')[0]}:8081", "0.1", 0.0))
    standby = Members(group, group, self_addr=B, clock=lambda: NOW, transport=httpx.MockTransport(handler))
    table = await standby.table("Bearer k")
    assert [g["name"] for g in table["gateways"]] == ["gw-1"] and [a["node"] for a in table["agents"]] == ["node-1"]
    assert table["floating_address"]["state"] == "not configured" and table["followers_reason"] == ""
    answering[0] = False
    table = await standby.table("Bearer k")
    assert table["gateways"] is None and table["agents"] is None
    assert table["followers_reason"].startswith(f"the leader {A} did not answer (http://10.0.0.1:8081 is not "
                                                f"reachable (connection refused))")
    assert table["floating_address"]["state"] == "not configured", "the members that answered say so"


async def test_the_floating_address_is_on_the_leader_or_the_table_says_why_not() -> None:
    duty = FloatingDuty(FakeFloatingAddress(), lambda: True, clock=lambda: NOW)
    member = leader_member(duty)
    assert member.self_doc()["floating"]["held"] is None, "not checked yet"
    await duty.check()
    mine = member.self_doc()["floating"]
    assert mine["configured"] is True and mine["held"] is True and mine["address"] == "10.213.0.100/24 on fake0"

    def view(member_id: str, floating: Any, role: str = "standby") -> dict[str, Any]:
        return {"id": member_id, "answer": {"role": role, "floating": floating}}

    held = {"configured": True, "address": "10.213.0.100/24 on fake0", "held": True}
    free = {**held, "held": False}
    on = summary.floating_address([view(A, held, "leader"), view(B, free), view(C, free)], A)
    assert (on["state"], on["on_leader"], on["held_by"]) == ("on the leader", True, [A])
    assert summary.floating_warnings(on, A) == []
    failed = {**free, "error": "RTNETLINK answers: Operation not permitted"}
    off = summary.floating_address([view(A, failed, "leader"), {"id": B, "error": "down"}, view(C, held)], A)
    assert (off["state"], off["on_leader"], off["held_by"]) == ("not on the leader", False, [C])
    assert off["reason"] == "RTNETLINK answers: Operation not permitted"
    warned = summary.floating_warnings(off, A)
    assert len(warned) == 2 and "not on the leader" in warned[0] and C in warned[1]
    unknown = summary.floating_address([{"id": A, "error": "down"}, view(B, free)], A)
    assert (unknown["state"], unknown["on_leader"]) == ("unknown", None)
    none = summary.floating_address([view(A, {"configured": False}, "leader")], A)
    assert (none["configured"], none["state"]) == (False, "not configured")
    assert summary.floating_address([{"id": A, "error": "down"}], A)["configured"] is None


MEMBERS = {
    "self": B, "leader": A, "leader_url": "http://10.0.0.1:8081", "member_change": None,
    "members": [{"id": A, "role": "leader", "state": "healthy"}],
    "floating_address": {"configured": True, "address": "10.0.0.100/24 on eth0", "state": "not on the leader",
                         "on_leader": False, "reason": "ip: permission denied"},
    "gateways": [{"name": "gw-1", "address": "10.0.0.9", "connected": True, "last_contact_age_s": 0.4}],
    "agents": [{"node": "node-1", "connected": False, "replicas": None, "last_contact_age_s": 31.0}],
    "followers_reason": "",
    "warnings": [],
}


def test_ctl_members_shows_the_floating_address_gateways_and_agents() -> None:
    r = ctl(["members"], FakeApi().on("GET", "/api/v1/cluster/members", json_body=MEMBERS))
    assert r.rc == 0, r.err
    assert "floating address: 10.0.0.100/24 on eth0 NOT on the leader: ip: permission denied" in r.out
    assert columns(r.out, "GATEWAY ")[1] == ["gw-1", "10.0.0.9", "yes", "0.4 s ago"]
    assert columns(r.out, "NODE ")[1] == ["node-1", "no", "-", "31.0 s ago"], "replicas not reported: -, not 0"
    unknown = {**MEMBERS, "floating_address": {"configured": False, "state": "not configured"}, "gateways": None,
               "agents": None, "followers_reason": "the leader did not answer"}
    r = ctl(["members"], FakeApi().on("GET", "/api/v1/cluster/members", json_body=unknown))
    assert "floating address: not configured" in r.out
    assert r.out.count("unknown: the leader did not answer") == 2 and "GATEWAY " not in r.out


def test_ctl_status_shows_the_floating_address_and_each_followers_last_contact() -> None:
    cluster = {**STATUS["cluster"], "floating_address": {"configured": True, "address": "10.0.0.100/24 on eth0",
                                                         "state": "on the leader", "on_leader": True, "reason": ""},
               "gateways": [], "agents": [{"node": "gpu-01", "connected": True, "last_contact_age_s": 1.5}]}
    r = ctl(["status"], FakeApi().on("GET", "/api/v1/status", json_body={**STATUS, "cluster": cluster}))
    assert r.rc == 0, r.err
    assert "floating address: 10.0.0.100/24 on eth0 on the leader" in r.out
    nodes = columns(r.out, "NODE ")
    assert nodes[0][-1] == "LAST CONTACT" and nodes[1][-1] == "1.5 s ago", nodes
    assert nodes[2][-1] == "-", "a node the leader's agents list does not name: unknown"
    assert "no gateway follows the leader" in r.out


def test_the_gateway_inside_the_leaders_process_is_listed_as_one_that_follows_it() -> None:
    """`llmgw up`'s gateway follows the table in memory, never over a stream: it is listed all the same."""
    group = FakeGroup(A, leader=A)
    now = [NOW]
    gateways = GatewayHub(group, A, clock=lambda: now[0])
    gateways.add_local("http://127.0.0.1:8080", pid=42)
    now[0] += 30
    doc = Members(group, group, self_addr=A, clock=lambda: now[0], agents=AgentHub(), gateways=gateways).self_doc()
    assert [(g["name"], g["address"], g["connected"], g["in_process"], g["restartable"], g["last_contact_age_s"])
            for g in doc["gateways"]] == [("local (in-process)", "http://127.0.0.1:8080", True, True, False, 0.0)]
    r = ctl(["members"], FakeApi().on("GET", "/api/v1/cluster/members", json_body={**MEMBERS, **{
        k: doc[k] for k in ("gateways", "agents")}}))
    assert "no gateway follows the leader" not in r.out
    assert columns(r.out, "GATEWAY ")[1][:2] == ["local (in-process)", "http://127.0.0.1:8080"]
    r = ctl(["gateways"], FakeApi().on("GET", "/api/v1/gateways", json_body={"gateways": gateways.gateways()}))
    assert r.rc == 0 and "local (in-process)" in r.out and "with llmgw up" in r.out, r.err
