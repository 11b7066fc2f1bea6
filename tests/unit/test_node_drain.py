"""Cordon and drain (issue 25, point 1): `node.cordon` (store level 3, `ClusterState.cordoned_nodes`); placement
refuses a cordoned node (`cordoned`); the reconciler moves a draining node's replicas elsewhere one at a time,
each replacement ready before the old one leaves the routes, the old one stopped after `drain_stop_grace_s`."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.domain import codec, commands
from llmgw.domain.state import ClusterState
from llmgw.domain.timeouts import TIMEOUTS
from llmgw.placement import NOT_NOW, REASONS, place
from llmgw.reconcile import Plan, decide
from llmgw.testing.builders import ReconcileLoop, cpu_node, model, node, store_with

GRACE = TIMEOUTS.drain_stop_grace_s


def applied(state: ClusterState, *cmds: dict[str, Any]) -> ClusterState:
    for c in cmds:
        state, _ = commands.apply(state, c)
    return state


# --- the command and the state ---------------------------------------------------------------------


def test_cordon_drain_and_uncordon_are_kept_per_node() -> None:
    s = applied(ClusterState(store_level=3), commands.cordon_nodes(["n1", "n2"], "cordon", 1.0))
    assert dict(s.cordoned_nodes) == {"n1": "cordon", "n2": "cordon"}
    s, result = commands.apply(s, commands.cordon_nodes(["n2"], "drain", 2.0))
    assert dict(s.cordoned_nodes) == {"n1": "cordon", "n2": "drain"} and result == {"changed": ["n2"]}
    s, result = commands.apply(s, commands.cordon_nodes(["n1", "n3"], "none", 3.0))
    assert dict(s.cordoned_nodes) == {"n2": "drain"} and result == {"changed": ["n1"]}
    assert commands.apply(s, commands.cordon_nodes(["n2"], "drain", 4.0))[1] == {"changed": []}


@pytest.mark.parametrize("bad", [{"mode": "off"}, {"mode": None}, {"nodes": ["../x"]}, {"nodes": []}])
def test_a_bad_cordon_is_refused_before_the_log(bad: dict[str, Any]) -> None:
    with pytest.raises(commands.CommandError) as e:
        commands.check({**commands.cordon_nodes(["n1"], "drain", 1.0), **bad})
    assert e.value.code == "bad_command"


def test_the_op_needs_level_3_and_the_field_is_a_later_one_kept_in_snapshots() -> None:
    command = commands.cordon_nodes(["n1"], "drain", 1.0)
    assert command["needs_level"] == 3
    with pytest.raises(commands.CommandError) as e:
        commands.apply(ClusterState(store_level=2), command)
    assert e.value.code == "upgrade_pending"
    state = applied(ClusterState(store_level=3), command)
    assert codec.later_level(state) == 3
    assert "cordoned_nodes" not in codec.state_to_json(ClusterState())
    assert dict(codec.state_from_json(codec.state_to_json(state)).cordoned_nodes) == {"n1": "drain"}


def test_status_warns_of_each_cordoned_and_draining_node() -> None:
    from llmgw.domain import summary

    loop = _loop(["m1"], ["a", "b", "c"])
    held = next(p.node for p in loop.state.placements.values())
    others = sorted({"a", "b", "c"} - {held})
    loop.store.submit_nowait(commands.cordon_nodes([held], "drain", loop.now))
    loop.store.submit_nowait(commands.cordon_nodes([others[0]], "cordon", loop.now))
    warnings = summary.summarize(loop.state, loop.observed(), {}, {}).warnings
    assert f"node {held} is draining: 1 replica(s) left" in warnings
    assert any(w.startswith(f"node {others[0]} is cordoned: nothing new is placed on it") for w in warnings)
    assert not any(w.startswith(f"node {others[1]} ") for w in warnings)


# --- placement ----------------------------------------------------------------------------------------


def test_a_cordoned_node_is_refused_with_its_reason() -> None:
    demo = model("demo").sim().build()
    nodes = {"a": cpu_node("a", "sim"), "b": cpu_node("b", "sim")}
    result = place(demo, nodes, (), cordoned={"a"})
    assert result.choice is not None and result.choice.node == "b"
    alone = place(demo, {"a": nodes["a"]}, (), cordoned={"a"})
    assert alone.choice is None and [r.code for r in alone.refusals] == ["cordoned"]
    assert "cordoned for maintenance" in alone.reason() and "ctl nodes uncordon a" in alone.reason()
    assert REASONS["cordoned"][0] == NOT_NOW
    from llmgw.control.ops.plan import plan_doc
    from llmgw.testing.builders import observed

    state = applied(ClusterState(store_level=3), commands.cordon_nodes(["a"], "cordon", 1.0))
    shown = plan_doc(demo, state, observed([nodes["a"]]))
    assert shown["choice"] is None and "cordoned for maintenance" in str(shown), "ctl plan says why"
    grouped = model("grp").vllm().build()
    multi = replace(grouped, profile=replace(grouped.profile, gpus=1, tp=2, nodes=2))
    fab = {n: node(n).gpus(1, "h100-80g").engines("vllm").fabric("ib").build() for n in ("x", "y", "z")}
    result = place(multi, fab, (), cordoned={"y"})
    assert result.choice is not None and {m.node for m in result.choice.members} == {"x", "z"}


# --- the reconciler, by example -------------------------------------------------------------------------


def _loop(models: list[str], nodes: list[str], replicas: int = 1) -> ReconcileLoop:
    store = store_with([model(m).sim().replicas(replicas, replicas) for m in models])
    loop = ReconcileLoop(store, [cpu_node(n, "sim") for n in nodes])
    loop.settle()
    return loop


def _on(loop: ReconcileLoop, name: str) -> list[str]:
    return sorted(p.model for p in loop.state.placements.values() if p.node == name)


def _ready(plan: Plan, name: str) -> int:
    return len(plan.routes[name].endpoints)


def test_cordon_keeps_what_runs_and_places_nothing_new() -> None:
    loop = _loop(["m1"], ["a"])
    assert _on(loop, "a") == ["m1"]
    loop.store.submit_nowait(commands.cordon_nodes(["a"], "cordon", loop.now))
    loop.store.submit_nowait(commands.put_model(model("m2").sim().build(), loop.now))
    plan = loop.tick()
    assert _on(loop, "a") == ["m1"] and _ready(plan, "m1") == 1, "a cordon moves nothing"
    assert "cordoned for maintenance" in plan.unplaceable["m2"]
    assert plan.drains == {}, "a cordon is no drain"
    loop.store.submit_nowait(commands.cordon_nodes(["a"], "none", loop.now))
    loop.settle()
    assert _on(loop, "a") == ["m1", "m2"], "uncordoned: it takes replicas again"


def test_drain_moves_one_replica_at_a_time_each_replaced_before_it_stops() -> None:
    loop = _loop(["m1", "m2"], ["a"])
    loop.nodes["b"] = cpu_node("b", "sim")
    loop.outcome = lambda action: "starting"  # replacements start, and are made ready by hand below
    loop.store.submit_nowait(commands.cordon_nodes(["a"], "drain", loop.now))
    plan = loop.tick()
    adds = [p for p in loop.state.placements.values() if p.node == "b"]
    assert [p.model for p in adds] == ["m1"], "one move at a time: m2 waits"
    assert plan.drains["a"].words() == "draining: 2 replicas left; moving m1 (waiting for its replacement to be ready)"
    plan = loop.tick()
    assert _ready(plan, "m1") == 1 and _on(loop, "a") == ["m1", "m2"], "the old one serves until the new is ready"
    new = adds[0].replica_id
    loop.replicas[new] = replace(loop.replicas[new], state="ready", url="http://b:1", since=loop.now)
    ready_at = loop.now
    plan = loop.tick()
    assert [e.replica_id for e in plan.routes["m1"].endpoints] == [new], "the old one left the routes at once"
    assert _on(loop, "a") == ["m1", "m2"], "but it runs on, its requests in flight finishing"
    assert sorted(p.model for p in loop.state.placements.values() if p.node == "b") == ["m1", "m2"], \
        "the next move began: m1's is no longer in flight"
    loop.now = ready_at + GRACE
    plan = loop.tick()
    assert _on(loop, "a") == ["m2"], "stopped after the grace"
    assert not any(a.kind == "stop" and a.node == "b" for a in plan.actions)
    loop.outcome = lambda action: "ready"
    for rid, obs in list(loop.replicas.items()):
        if obs.state == "starting":
            loop.replicas[rid] = replace(obs, state="ready", url="http://b:2", since=loop.now)
    loop.now += GRACE
    plan = loop.settle()
    assert _on(loop, "a") == [] and plan.drains["a"].words() == "drained: no replica left"
    assert _ready(plan, "m1") == 1 and _ready(plan, "m2") == 1


def test_a_drain_with_nowhere_to_go_waits_and_says_why_while_the_model_serves() -> None:
    loop = _loop(["m1"], ["a"])
    loop.store.submit_nowait(commands.cordon_nodes(["a"], "drain", loop.now))
    plan = loop.tick()
    assert _on(loop, "a") == ["m1"] and _ready(plan, "m1") == 1
    assert "m1" not in plan.unplaceable, "the model serves: no alarm of its own"
    words = plan.drains["a"].words()
    assert words.startswith("draining: 1 replica left; blocked: nowhere to go for m1: ") and "cordoned" in words
    loop.nodes["b"] = cpu_node("b", "sim")
    for _ in range(3):  # placed, started (ready at once here), then out of the routes
        loop.tick()
    assert _on(loop, "a") == ["m1"]
    loop.now += GRACE
    plan = loop.settle()
    assert _on(loop, "a") == [] and _ready(plan, "m1") == 1


def test_a_replica_that_does_not_serve_yet_moves_at_once() -> None:
    store = store_with([model("m1").sim()])
    loop = ReconcileLoop(store, [cpu_node("a", "sim"), cpu_node("b", "sim")])
    loop.outcome = lambda action: "starting"
    loop.tick()
    (p,) = loop.state.placements.values()
    drained = p.node
    loop.store.submit_nowait(commands.cordon_nodes([drained], "drain", loop.now))
    loop.tick()
    (q,) = loop.state.placements.values()
    assert q.node != drained


def test_a_draining_node_gone_quiet_keeps_its_placements_for_its_grace_and_is_replaced() -> None:
    loop = _loop(["m1"], ["a"])
    loop.nodes["b"] = cpu_node("b", "sim")
    loop.store.submit_nowait(commands.cordon_nodes(["a"], "drain", loop.now))
    del loop.nodes["a"]  # its agent restarts (its stream closed): nothing it runs is reported meanwhile
    loop.replicas = {k: v for k, v in loop.replicas.items() if v.node != "a"}
    loop.tick()
    assert _on(loop, "a") == ["m1"], "not removed while its node is within its grace period"
    assert [p.node for p in loop.state.placements.values() if p.node != "a"] == ["b"], "replaced meanwhile"


def test_an_asleep_replica_on_a_draining_node_stops_and_is_not_moved() -> None:
    loop = _loop(["m1"], ["a", "b"], replicas=2)
    asleep = next(p for p in loop.state.placements.values() if p.node == "a")
    loop.store.submit_nowait(commands.sleep_placement(asleep.replica_id, True, loop.now))
    loop.store.submit_nowait(commands.put_model(model("m1").sim().replicas(1, 1).build(), loop.now))
    loop.store.submit_nowait(commands.cordon_nodes(["a"], "drain", loop.now))
    plan = loop.tick()
    removed = [c for c in plan.commands if c["op"] == "placement.remove"]
    assert [(c["replica_id"], c["reason"]) for c in removed] == [(asleep.replica_id,
                                                                  "node draining: an asleep replica stops")]
    assert not any(c["op"].startswith("placement.add") for c in plan.commands)


# --- the property -----------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_a_drain_never_leaves_a_served_model_without_a_ready_replica_and_ends_empty(data: Any) -> None:
    names = [f"n{i}" for i in range(data.draw(st.integers(2, 4), label="nodes"))]
    models = [f"m{i}" for i in range(data.draw(st.integers(1, 4), label="models"))]
    store = store_with([model(m).sim().replicas(k, k) for m in models
                        for k in [data.draw(st.integers(1, 2), label=f"{m} replicas")]])
    loop = ReconcileLoop(store, [cpu_node(n, "sim") for n in names])
    loop.settle()
    victim = data.draw(st.sampled_from(names), label="drained")
    loop.store.submit_nowait(commands.cordon_nodes([victim], "drain", loop.now))
    loop.outcome = lambda action: "starting"
    for _ in range(600):
        plan = loop.tick(dt=data.draw(st.sampled_from([0.5, 5.0, GRACE]), label="dt"))
        for m in models:
            assert plan.routes[m].endpoints, f"{m} lost its last ready replica during the drain"
            assert any(o.model == m and o.state == "ready" for o in loop.replicas.values())
        moving = [p for p in loop.state.placements.values() if p.node != victim
                  and loop.replicas.get(p.replica_id) is not None and loop.replicas[p.replica_id].state == "starting"]
        assert len({p.model for p in moving}) <= 1, "one move at a time"
        for p in moving:  # an engine becomes ready after a while (at most ~5 s here), or not yet
            if loop.now - loop.replicas[p.replica_id].since > 5 or data.draw(st.booleans(), label="ready now"):
                loop.replicas[p.replica_id] = replace(loop.replicas[p.replica_id], state="ready",
                                                      url=f"http://{p.node}:1", since=loop.now)
        if not _on(loop, victim) and not moving:
            break
    assert _on(loop, victim) == [], "capacity exists elsewhere: the drain ends with the node empty"
    assert decide(loop.state, loop.observed(), loop.now).drains[victim].left == 0


# --- the admin API -------------------------------------------------------------------------------------------


async def test_the_routes_answer_404_for_an_unknown_node_and_409_below_level_3() -> None:
    from console_world import ADMIN, World

    from llmgw.testing import MemoryStore

    world = World(store=MemoryStore(ClusterState(store_level=2)), nodes=[cpu_node("n1", "sim")])
    async with world.client(ADMIN) as api:
        r = await api.post("/api/v1/nodes/n1/drain")
        assert r.status_code == 409 and r.json()["error"]["code"] == "upgrade_pending", r.text
        assert not world.store.snapshot().cordoned_nodes, "nothing was written"
        r = await api.post("/api/v1/nodes/nowhere/cordon")
        assert r.status_code == 404 and r.json()["error"]["code"] == "node_not_found"
        world.store.submit_nowait(commands.raise_level(3, 0.0))
        r = await api.post("/api/v1/nodes/n1/drain")
        assert r.status_code == 200 and r.json()["cordon"] == "drain" and r.json()["changed"] is True, r.text
        assert r.json()["drain"]["left"] == 0
        again = await api.post("/api/v1/nodes/n1/drain")
        assert again.status_code == 200 and again.json()["changed"] is False
        r = await api.post("/api/v1/nodes/n1/uncordon")
        assert r.json() == {"node": "n1", "cordon": "none", "changed": True, "drain": None}
