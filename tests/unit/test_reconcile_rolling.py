"""Rolling replacement when a definition changes, and placements that a new leader keeps: `decide`
is a function of the committed state, so a second pass (or a new leader's first) reshuffles nothing."""

from __future__ import annotations

from typing import Any

from llmgw.domain import commands as C
from llmgw.domain.state import ClusterState
from llmgw.reconcile import Plan, decide
from llmgw.testing import MemoryStore
from llmgw.testing.builders import ReconcileLoop, cpu_node, model, node, observed, replica, store_with

NOW = 1000.0


def ops(plan: Plan) -> list[tuple[Any, ...]]:
    return [(c["op"].split(".")[-1], c.get("replica_id") or c.get("node"), c.get("reason", "")) for c in plan.commands]


def change(loop: ReconcileLoop, definition: Any) -> None:
    loop.store.submit_nowait(C.put_model(definition.build(), loop.now))


def test_with_room_the_new_replica_serves_before_the_old_one_stops():
    loop = ReconcileLoop(store_with([model("m").vllm().gpus(1)]), [node("g").gpus(2).engines("vllm")])
    loop.settle()
    assert list(loop.state.placements) == ["m-r1"]
    change(loop, model("m").vllm().gpus(1).args("--new"))
    loop.outcome = lambda action: "starting"  # the new engine takes its time
    first = loop.tick()
    assert ops(first) == [("add", "g", "")], "the new one first, beside the old"
    second = loop.tick()
    assert [a.kind for a in second.actions] == ["start"] and second.commands == ()
    assert [e.replica_id for e in second.routes["m"].endpoints] == ["m-r1"], "the old one serves meanwhile"
    loop.replicas["m-r2"] = replica("m-r2", "g")  # the new one is ready
    third = loop.tick()
    assert ops(third) == [("remove", "m-r1", "definition changed")]
    assert [(a.kind, a.replica_id) for a in third.actions] == [("stop", "m-r1")]
    assert loop.settle().routes["m"].endpoints[0].replica_id == "m-r2"


def test_without_room_the_old_replica_makes_room_first():
    loop = ReconcileLoop(store_with([model("m").vllm().gpus(1)]), [node("g").gpus(1).engines("vllm")])
    loop.settle()
    change(loop, model("m").vllm().gpus(1).args("--new"))
    plan = loop.tick()
    assert ops(plan) == [("remove", "m-r1", "definition changed (no room to start the new replica first)"),
                         ("add", "g", "")]
    assert loop.settle().routes["m"].state == "ready"
    assert list(loop.state.placements) == ["m-r2"]


def test_an_old_replica_that_does_not_serve_goes_at_once_and_its_failure_is_not_counted():
    store = store_with([model("m").replicas(2)])
    loop = ReconcileLoop(store, [cpu_node("a")])
    loop.settle()
    change(loop, model("m").replicas(2).args("--new"))
    loop.replicas["m-r1"] = replica("m-r1", "a", "failed", error="old one died")
    loop.replicas["m-r2"] = replica("m-r2", "a", "starting")
    plan = loop.decide()
    assert sorted(o for o in ops(plan) if o[0] == "remove") == [
        ("remove", "m-r1", "definition changed"), ("remove", "m-r2", "definition changed")]
    assert not [c for c in plan.commands if c["op"] == "health.start_failed"]


def test_a_new_definition_that_fails_leaves_the_old_replica_serving_until_it_parks():
    loop = ReconcileLoop(store_with([model("m")]), [cpu_node("a")])
    loop.settle()
    change(loop, model("m").args("--broken"))
    loop.outcome = lambda action: "failed"
    for _ in range(80):
        plan = loop.tick()
        if plan.routes["m"].state == "ready":
            assert [e.replica_id for e in plan.routes["m"].endpoints] == ["m-r1"]
    assert loop.state.model_health("m").parked
    assert loop.state.placements == {}, "parked: the old one goes too (fix it, then `ctl model retry`)"


# --- a new leader does not reshuffle ------------------------------------------------------------


def settled() -> tuple[ReconcileLoop, ClusterState]:
    loop = ReconcileLoop(store_with([model("a").vllm().gpus(2).replicas(2), model("b").vllm().gpus(1).replicas(3),
                                     model("c").replicas(2)]),
                         [node(f"g{n}").gpus(4).engines("vllm") for n in range(3)] + [cpu_node("cpu")])
    loop.settle()
    return loop, loop.state


def test_deciding_twice_on_the_same_state_changes_nothing():
    loop, state = settled()
    seen = loop.observed()
    assert decide(state, seen, loop.now) == decide(state, seen, loop.now)
    assert decide(state, seen, loop.now).commands == ()


def test_a_new_leader_keeps_every_placement():
    """After a re-election the state (placements included) is the same Raft log; agents report again
    in another order, and perhaps not yet: no placement is added or removed either way."""
    loop, state = settled()
    new_leader_state = MemoryStore(state).snapshot()
    seen = loop.observed()
    reordered = observed(reversed(list(seen.nodes.values())), reversed(list(seen.replicas.values())),
                         since=loop.now)
    assert decide(new_leader_state, reordered, loop.now + 5).commands == ()
    not_yet = observed(reversed(list(seen.nodes.values())), since=loop.now)
    early = decide(new_leader_state, not_yet, loop.now + 1)
    assert early.commands == (), "placements are kept while agents have not reported their replicas"
    assert {a.replica_id for a in early.actions} <= set(state.placements)
