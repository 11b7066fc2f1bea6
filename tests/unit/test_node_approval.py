"""Node approval (issue 25, point 2): with `nodes.require_approval` on, a node nobody approved is pending:
placement refuses it (`awaiting_approval`, "waiting for approval") and the reconciler places nothing there
until `node.approve` (store level 3, kept in `ClusterState.approved_nodes`) names it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.domain import codec, commands
from llmgw.domain.state import ClusterState
from llmgw.placement import NOT_NOW, REASONS, FleetView, place
from llmgw.reconcile import decide
from llmgw.testing.builders import cpu_node, model, node, observed

BASE = ClusterState(store_level=3)


def applied(state: ClusterState, *cmds: dict[str, Any]) -> ClusterState:
    for c in cmds:
        state, _ = commands.apply(state, c)
    return state


# --- the command and the state ---------------------------------------------------------------------


def test_approve_records_each_node_once_with_its_first_time() -> None:
    s = applied(BASE, commands.approve_nodes(["n2", "n1"], 10.0))
    assert dict(s.approved_nodes) == {"n1": 10.0, "n2": 10.0}
    s2, result = commands.apply(s, commands.approve_nodes(["n1", "n3"], 20.0))
    assert dict(s2.approved_nodes) == {"n1": 10.0, "n2": 10.0, "n3": 20.0}, "an approval keeps its first time"
    assert result == {"approved": ["n3"]}
    assert commands.apply(s2, commands.approve_nodes(["n3"], 30.0))[1] == {"approved": []}


@pytest.mark.parametrize("names", [[], ["../etc"], [""], [7], "n1", ["-n"]])
def test_a_bad_node_list_is_refused_before_the_log(names: Any) -> None:
    command = {**commands.approve_nodes(["n1"], 1.0), "nodes": names}
    with pytest.raises(commands.CommandError) as e:
        commands.check(command)
    assert e.value.code == "bad_command"


def test_the_op_needs_store_level_3_and_the_field_is_a_later_one() -> None:
    command = commands.approve_nodes(["n1"], 1.0)
    assert command["needs_level"] == 3
    with pytest.raises(commands.CommandError) as e:
        commands.apply(ClusterState(store_level=2), command)
    assert e.value.code == "upgrade_pending"
    state = applied(BASE, command)
    assert codec.later_level(state) == 3, "a state holding approvals needs level 3 to be read"
    assert "approved_nodes" not in codec.state_to_json(ClusterState()), "none: omitted, an older member reads it"


def test_approvals_survive_a_snapshot() -> None:
    state = applied(BASE, commands.approve_nodes(["n1"], 5.0))
    assert dict(codec.state_from_json(codec.state_to_json(state)).approved_nodes) == {"n1": 5.0}
    again = ClusterState()
    again.__setstate__(state.__getstate__())
    assert dict(again.approved_nodes) == {"n1": 5.0}


def test_pending_nodes_follow_the_setting_and_the_approvals() -> None:
    s = applied(BASE, commands.approve_nodes(["n1"], 1.0))
    assert s.pending_nodes(["n1", "n2"]) == frozenset(), "setting off: nothing is pending"
    s = applied(s, commands.put_setting("nodes.require_approval", True, 2.0))
    assert s.pending_nodes(["n1", "n2"]) == {"n2"}
    s = applied(s, commands.approve_nodes(["n2"], 3.0))
    assert s.pending_nodes(["n1", "n2"]) == frozenset()


# --- placement's verdict ---------------------------------------------------------------------------


def test_a_pending_node_is_refused_with_awaiting_approval() -> None:
    demo = model("demo").sim().build()
    nodes = {"new": cpu_node("new", "sim")}
    result = place(demo, nodes, (), pending={"new"})
    assert result.choice is None
    (refusal,) = result.refusals
    assert (refusal.node, refusal.verdict, refusal.code) == ("new", NOT_NOW, "awaiting_approval")
    assert "waiting for approval" in result.reason() and "llmgw ctl nodes approve new" in result.reason()
    assert REASONS["awaiting_approval"][0] == NOT_NOW
    assert place(demo, nodes, ()).choice is not None, "the same node, approved, fits"


def test_a_pending_node_of_a_shape_shared_with_approved_ones_is_refused_alone() -> None:
    gpu = model("big").vllm().gpus(1).build()
    nodes = {n: node(n).gpus(2, "h100-80g").engines("vllm").build() for n in ("a", "b")}
    view = FleetView(nodes, (), {"big": gpu}, pending={"a"})
    verdicts = {v.node: (v.verdict, v.code) for v in view.verdicts(gpu)}
    assert verdicts["a"] == (NOT_NOW, "awaiting_approval")
    assert verdicts["b"][0] == "fits"
    for r in range(2):  # b's two GPUs, then nothing: a stays out
        choice = view.place(gpu).choice
        assert choice is not None and choice.node == "b"
        view.take(gpu, choice, f"big-r{r}")
    assert view.place(gpu).choice is None
    grouped = model("grp").vllm().build()
    multi = replace(grouped, profile=replace(grouped.profile, gpus=1, tp=2, nodes=2))
    fab = {n: node(n).gpus(1, "h100-80g").engines("vllm").fabric("ib").build() for n in ("a", "b", "c")}
    result = place(multi, fab, (), pending={"b"})
    assert result.choice is not None and {m.node for m in result.choice.members} == {"a", "c"}
    assert any(r.node == "b" and r.code == "awaiting_approval" for r in result.refusals)


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_placement_never_chooses_a_pending_node(data: Any) -> None:
    names = [f"n{i}" for i in range(data.draw(st.integers(1, 6)))]
    nodes = {n: node(n).gpus(data.draw(st.integers(0, 4)), "h100-80g").engines("vllm", "sim")
             .memory_gib(64).build() for n in names}
    pending = set(data.draw(st.lists(st.sampled_from(names), unique=True)))
    wanted = [model("g").vllm().gpus(data.draw(st.sampled_from([1, 2]))).build(), model("c").sim().build()]
    view = FleetView(nodes, (), {m.name: m for m in wanted}, pending=pending)
    for m in wanted:
        for r in range(4):
            choice = view.place(m).choice
            if choice is None:
                break
            assert choice.node not in pending
            view.take(m, choice, f"{m.name}-r{r}")
        fresh = place(m, nodes, view.placements.values(), models={w.name: w for w in wanted}, pending=pending)
        assert fresh.choice is None or fresh.choice.node not in pending


# --- the reconciler ----------------------------------------------------------------------------------


def test_decide_places_nothing_on_a_pending_node_until_it_is_approved() -> None:
    s = applied(BASE, commands.put_setting("nodes.require_approval", True, 1.0),
                commands.put_model(model("demo").sim().build(), 1.0))
    seen = observed([cpu_node("n1", "sim")])
    plan = decide(s, seen, 100.0)
    assert not any(c["op"].startswith("placement.") for c in plan.commands)
    assert "waiting for approval" in plan.unplaceable["demo"]
    assert "waiting for approval" in plan.views["demo"].reason
    s = applied(s, commands.approve_nodes(["n1"], 101.0))
    plan = decide(s, seen, 102.0)
    adds = [c for c in plan.commands if c["op"] == "placement.add"]
    assert [c["node"] for c in adds] == ["n1"] and not plan.unplaceable


def test_eviction_makes_room_among_approved_nodes_only() -> None:
    """A two-node replica fits on b + c, but c is pending: the idle replica on a is evicted so that it goes
    on a + b (were c counted, b + c would fit "without evicting anything", and nothing would ever place it)."""
    idle = model("idle").sim().gpus(1).on_demand().build()
    base = model("wanted").vllm().build()
    wanted = replace(base, profile=replace(base.profile, gpus=1, tp=2, nodes=2))
    s = applied(BASE, commands.put_setting("nodes.require_approval", True, 1.0), commands.put_model(idle, 1.0),
                commands.put_model(wanted, 1.0), commands.approve_nodes(["a", "b"], 1.0))
    s = applied(s, commands.add_placement("idle", "a", (0,), s.models["idle"].launch_hash(), 1.0))
    nodes = [node(n).gpus(gpus, "h100-80g").engines("vllm", "sim").fabric("ib").build()
             for n, gpus in (("a", 2), ("b", 1), ("c", 1))]
    plan = decide(s, observed(nodes, demand={"wanted": 9_999.0, "idle": 9_600.0}), 10_000.0)  # idle 400 s
    assert [e.model for e in plan.evictions] == ["idle"]
    groups = [c for c in plan.commands if c["op"] == "placement.add_group"]
    assert len(groups) == 1 and sorted(m["node"] for m in groups[0]["members"]) == ["a", "b"]


def test_the_console_shows_a_pending_node_with_how_to_approve_it() -> None:
    from llmgw.console.nodes import state_html

    html = state_html({"node": "gpu-09", "state": "connected", "approval": "pending"})
    assert 'data-testid="node-pending"' in html and "llmgw ctl nodes approve gpu-09" in html
    assert "pending" not in state_html({"node": "gpu-01", "state": "connected", "approval": "approved"})


def test_status_warns_of_the_nodes_waiting_for_approval() -> None:
    from llmgw.domain import summary

    s = applied(BASE, commands.put_setting("nodes.require_approval", True, 1.0), commands.approve_nodes(["n1"], 1.0))
    seen = observed([cpu_node(n, "sim") for n in ("n1", "n2", "n3")])
    warnings = summary.summarize(s, seen, {}, {}).warnings
    assert ("2 node(s) waiting for approval: n2, n3 (nothing is placed on them until `llmgw ctl nodes approve "
            "NAME`)") in warnings


async def test_turning_the_setting_on_approves_the_nodes_known_then_and_waits_for_level_3() -> None:
    from console_world import ADMIN, World

    from llmgw.testing import MemoryStore

    store = MemoryStore(ClusterState(store_level=2))  # a group not yet all on this release
    demo = model("demo").sim().build()
    store.submit_nowait(commands.put_model(demo, 0.0))
    store.submit_nowait(commands.add_placement("demo", "gone", (), demo.launch_hash(), 0.0))
    world = World(store=store, nodes=[cpu_node("n1", "sim")])
    async with world.client(ADMIN) as api:
        r = await api.put("/api/v1/settings/nodes.require_approval", json=True)
        assert r.status_code == 409 and r.json()["error"]["code"] == "upgrade_pending", r.text
        assert "nodes.require_approval" not in world.store.snapshot().settings, "nothing was written"
        world.store.submit_nowait(commands.raise_level(3, 0.0))
        r = await api.put("/api/v1/settings/nodes.require_approval", json=True)
        assert r.status_code == 200, r.text
        # n1 is connected; "gone" holds a placement: both approved, each from the moment the setting was turned on.
        assert set(world.store.snapshot().approved_nodes) == {"n1", "gone"}
        docs = {n["node"]: n["approval"] for n in (await api.get("/api/v1/nodes")).json()["nodes"]}
        assert docs == {"n1": "approved", "gone": "approved"}
        assert (await api.put("/api/v1/settings/nodes.require_approval", json=True)).status_code == 200
