"""A forgotten node stays forgotten across leader changes (issue 25, point 7): `node.forget` (store level 3)
removes the node's placements in the same command as the forgetting, so a new leader, which rebuilds its
nodes from the placements (`AgentHub.take_office`), never finds it again; before it, the node came back as
"waiting for node …" and then lost after every leader change."""

from __future__ import annotations

from typing import Any

import pytest

from llmgw.control.hub import AgentHub
from llmgw.domain import commands
from llmgw.domain.model import ModelDef
from llmgw.domain.state import ClusterState
from llmgw.domain.timeouts import TIMEOUTS
from llmgw.testing import MemoryStore
from llmgw.testing.builders import cpu_node, model

BASE = ClusterState(store_level=3)
DEMO = model("demo").sim().build()
BIG = ModelDef.from_doc({**model("big").doc(), "profile": {"nodes": 2, "gpus": 1, "tp": 2, "cpu": True}})


def placed(state: ClusterState = BASE) -> ClusterState:
    for c in (commands.put_model(DEMO, 0.0), commands.put_model(BIG, 0.0),
              commands.add_placement("demo", "gone", (), DEMO.launch_hash(), 1.0),
              commands.add_placement("demo", "n1", (), DEMO.launch_hash(), 1.0),
              commands.add_group("big", [("gone", (), "10.0.0.9"), ("n1", (), "10.0.0.1")], BIG.launch_hash(), 1.0)):
        state, _ = commands.apply(state, c)
    return state


def test_forget_removes_the_nodes_placements_and_its_groups_whole() -> None:
    state = placed()
    assert {p.node for p in state.placements.values()} == {"gone", "n1"}
    after, result = commands.apply(state, commands.forget_node("gone", 2.0))
    assert result == {"forgotten": "gone", "removed": ["big-g3-r0", "big-g3-r1", "demo-r1"]}
    assert [(rid, p.node) for rid, p in after.placements.items()] == [("demo-r2", "n1")], \
        "the other node's lone replica stays; the group's member there goes with the group"
    assert commands.apply(after, commands.forget_node("gone", 3.0))[1] == {"forgotten": "gone", "removed": []}


def test_the_op_needs_store_level_3_and_a_node_name() -> None:
    command = commands.forget_node("gone", 1.0)
    assert command["needs_level"] == 3
    with pytest.raises(commands.CommandError) as e:
        commands.apply(placed(ClusterState(store_level=2)), command)
    assert e.value.code == "upgrade_pending"
    with pytest.raises(commands.CommandError) as e:
        commands.check({**command, "node": "../etc"})
    assert e.value.code == "bad_command"


def new_leader(store: MemoryStore, now: float) -> AgentHub:
    """What a member that starts leading knows of nodes: the placements in the state (as the reconciler's
    `_take_office` tells its hub)."""
    hub = AgentHub(lambda: now)
    hub.take_office(p.node for p in store.snapshot().placements.values())
    return hub


@pytest.mark.parametrize("level", [3, 2])
async def test_a_forgotten_node_stays_forgotten_after_a_leader_change(level: int) -> None:
    from console_world import ADMIN, World

    store = MemoryStore(placed(ClusterState(store_level=level)))
    world = World(store=store, nodes=[cpu_node("n1", "sim")])
    world.hub.take_office(p.node for p in store.snapshot().placements.values())  # this leader's first term
    world.now += TIMEOUTS.lost_node_grace_s  # "gone" never came back: lost
    assert world.hub.node_state("gone") == "lost"
    async with world.client(ADMIN) as api:
        r = await api.delete("/api/v1/nodes/gone", headers={"idempotency-key": "forget-gone-1"})
        assert r.status_code == 200, r.text
        body: dict[str, Any] = r.json()
        assert body["forgotten"] == "gone" and set(body["removed_placements"]) >= {"demo-r1"}
        assert world.hub.node_state("gone") == "unknown"
        nodes = [n["node"] for n in (await api.get("/api/v1/nodes")).json()["nodes"]]
        assert "gone" not in nodes
    if level == 3:
        assert [c["op"] for c in store.log].count("node.forget") == 1, "one command, the placements with it"
    assert all(p.node != "gone" for p in store.snapshot().placements.values())
    hub = new_leader(store, world.now)
    assert hub.node_state("gone") == "unknown", "the next leader does not find it again"
    assert "gone" not in hub.observed().lost


def test_a_member_leading_again_does_not_bring_back_a_node_another_leader_forgot() -> None:
    now = 0.0
    hub = AgentHub(lambda: now)
    hub.take_office(["gone", "n1"])  # its first term: "gone" never came back, and was lost
    now += TIMEOUTS.lost_node_grace_s
    assert hub.node_state("gone") == "lost"
    state, _ = commands.apply(placed(), commands.forget_node("gone", now))  # forgotten under another leader
    hub.take_office(p.node for p in state.placements.values())  # this member leads again
    assert hub.node_state("gone") == "unknown" and [a["node"] for a in hub.agents()] == ["n1"]


def test_ctl_says_which_placements_went_with_the_node() -> None:
    from ctl_fakes import FakeApi, ctl

    api = FakeApi().on("DELETE", "/api/v1/nodes/gone", json_body={"forgotten": "gone",
                                                                 "removed_placements": ["demo-r1", "big-g3-r0"]})
    r = ctl(["nodes", "forget", "gone"], api)
    assert r.rc == 0 and r.out.strip() == "forgot node gone and its placements demo-r1, big-g3-r0"
