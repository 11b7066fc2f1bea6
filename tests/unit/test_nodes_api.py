"""`GET /api/v1/nodes/{name}` (`llmgw ctl nodes show`): one node as the list has it, the replicas the state places
there with what its agent says of each, and the replicas its agent runs that no placement puts there."""

from __future__ import annotations

from typing import Any

from console_world import VIEWER, World

from llmgw.domain import commands
from llmgw.domain.observed import ReplicaObs
from llmgw.testing import MemoryStore
from llmgw.testing.builders import cpu_node, model

DEMO = model("demo").sim().build()


def world() -> World:
    store = MemoryStore()
    for c in (commands.put_model(DEMO, 0.0),
              commands.add_placement("demo", "n1", (), DEMO.launch_hash(), 1.0),
              commands.add_placement("demo", "n1", (), DEMO.launch_hash(), 1.0),
              commands.add_placement("demo", "n2", (), DEMO.launch_hash(), 1.0)):
        store.submit_nowait(c)
    return World(store=store, nodes=[cpu_node("n1", "sim"), cpu_node("n2", "sim")])


async def test_a_node_is_shown_with_its_placements_and_what_its_agent_says_of_each() -> None:
    w = world()
    placed = sorted(rid for rid, p in w.store.snapshot().placements.items() if p.node == "n1")
    w.hub.report_replicas(w.links["n1"], [
        ReplicaObs(placed[0], "demo", "n1", "ready", url="http://127.0.0.1:1", since=5.0),
        ReplicaObs("demo-r99", "demo", "n1", "failed", error="exit 1", since=6.0)])  # no placement puts it here
    async with w.client(VIEWER) as api:
        r = await api.get("/api/v1/nodes/n1")
        assert r.status_code == 200, r.text
        body: dict[str, Any] = r.json()
        listed = [n for n in (await api.get("/api/v1/nodes")).json()["nodes"] if n["node"] == "n1"]
    assert body["node"] == listed[0], "the node as the list has it"
    assert body["agent_reported"] is True
    assert [(p["replica_id"], p["placed"], p["state"], p["error"]) for p in body["placements"]] == [
        (placed[0], True, "ready", None), (placed[1], True, None, None), ("demo-r99", False, "failed", "exit 1")]
    assert body["placements"][0]["gpus"] == [] and body["placements"][2]["gpus"] is None


async def test_an_unknown_node_is_404_and_a_node_whose_agent_said_nothing_yet_says_so() -> None:
    w = world()
    async with w.client(VIEWER) as api:
        r = await api.get("/api/v1/nodes/nope")
        assert r.status_code == 404 and r.json()["error"]["code"] == "node_not_found"
        body = (await api.get("/api/v1/nodes/n2")).json()
    assert body["agent_reported"] is False, "no replica report yet: unknown, not 'nothing runs'"
    assert [(p["placed"], p["state"]) for p in body["placements"]] == [(True, None)]
