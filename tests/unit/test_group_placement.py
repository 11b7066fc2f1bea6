"""Multi-node replicas (groups): placement on whole free nodes of one fabric, the group command
and its state, and the reconciler's ordering (members first, rank 0 last to start and first to
stop, rank 0 the only endpoint, a member's failure fails the group)."""

from __future__ import annotations

import json
import pickle
from dataclasses import replace
from typing import Any, Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.domain import commands as C
from llmgw.domain.codec import state_from_json, state_to_json
from llmgw.domain.groups import group_port
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import Gpu, NodeInfo, Observed
from llmgw.domain.state import ClusterState, Placement
from llmgw.placement import NEVER, NOT_NOW, Member, PlacementResult, place
from llmgw.reconcile import AgentAction, Plan, decide, units
from llmgw.testing import MemoryStore
from llmgw.testing.builders import GIB, ReconcileLoop, model, node, observed, replica, state_with, store_with

NOW = 1000.0


def group_model(name: str = "big", *, nodes: int = 2, gpus: int = 8, engine: str = "vllm", **extra: Any) -> ModelDef:
    doc = model(name).vllm().doc() if engine == "vllm" else model(name).doc()
    profile = {"nodes": nodes, "gpus": gpus, "tp": gpus * nodes, "cpu": engine == "sim", **extra}
    return ModelDef.from_doc({**doc, "profile": profile})


def sim_group(name: str = "g", nodes: int = 3) -> ModelDef:
    return group_model(name, nodes=nodes, gpus=1, engine="sim")


def gpu_node(name: str, fabric: str, count: int = 8, **kw: Any) -> NodeInfo:
    return replace(node(name).gpus(count, **kw).engines("vllm", "sim").fabric(fabric).build(), address=f"10.0.0.{ord(name[-1]) % 250}")


def nodes_of(*infos: NodeInfo) -> dict[str, NodeInfo]:
    return {i.node: i for i in infos}


def on(node_name: str, *gpus: int, group: str = "", rank: int = 0) -> Placement:
    rid = f"{group}-r{rank}" if group else f"other-{node_name}-{'-'.join(map(str, gpus))}"
    return Placement(rid, "other", node_name, tuple(gpus), "h", 0, group=group, rank=rank, group_size=2 if group else 1)


# --- placement ------------------------------------------------------------------------


def test_a_group_takes_whole_free_nodes_in_one_fabric():
    infos = nodes_of(gpu_node("a", "ib-a"), gpu_node("b", "ib-a"), gpu_node("c", "ib-b"))
    result = place(group_model(), infos, [])
    choice = result.choice
    assert choice is not None and choice.fabric == "ib-a"
    assert choice.members == (Member("a", tuple(range(8)), "10.0.0.97"), Member("b", tuple(range(8)), "10.0.0.98"))
    assert (choice.node, choice.gpus) == ("a", tuple(range(8))), "the choice's node is rank 0's"
    assert result.refusals == () and choice.score == 100.0


def test_gpus_are_per_node_and_the_node_must_be_wholly_free():
    # tp * pp == gpus * nodes: profile.gpus is what each member takes on its node.
    infos = nodes_of(gpu_node("a", "ib"), gpu_node("b", "ib"), gpu_node("c", "ib"))
    m = group_model(gpus=4)
    first = place(m, infos, [])
    assert first.choice is not None
    assert [(x.node, x.gpus) for x in first.choice.members] == [("a", (0, 1, 2, 3)), ("b", (0, 1, 2, 3))]
    # One GPU placed on b: b is not whole any more, so the group takes a and c.
    result = place(m, infos, [on("b", 7)])
    assert result.choice is not None and [x.node for x in result.choice.members] == ["a", "c"]
    (busy,) = result.refusals
    assert (busy.node, busy.verdict, busy.code) == ("b", NOT_NOW, "node_busy")
    assert busy.message == "a multi-node replica takes whole free nodes: GPU 7 placed"


def test_no_fabric_with_enough_free_nodes_says_how_many_each_has():
    infos = nodes_of(gpu_node("a", "ib-a"), gpu_node("b", "ib-a"), gpu_node("c", "ib-b"), gpu_node("d", ""))
    result = place(group_model(), infos, [on("a", 0)])
    assert result.choice is None
    assert result.summary == "no fabric with 2 free whole nodes: ib-a has 1, ib-b has 1"
    codes = {r.node: (r.verdict, r.code) for r in result.refusals}
    assert codes == {"a": (NOT_NOW, "node_busy"), "d": (NEVER, "no_fabric")}
    assert result.reason().startswith("no fabric with 2 free whole nodes: ib-a has 1, ib-b has 1 — ")
    assert "d: node has no fabric configured" in result.reason()


def test_a_node_without_a_fabric_never_hosts_a_member():
    infos = nodes_of(gpu_node("a", ""), gpu_node("b", ""))
    result = place(group_model(), infos, [])
    assert result.choice is None and {r.code for r in result.refusals} == {"no_fabric"}
    assert result.summary.endswith("no node has a fabric configured")


def test_the_smallest_fabric_that_suffices_and_the_snuggest_nodes_win():
    infos = nodes_of(gpu_node("a", "big"), gpu_node("b", "big"), gpu_node("c", "big"), gpu_node("d", "big"),
                     gpu_node("x", "small", count=8), gpu_node("y", "small", count=4), gpu_node("z", "small", count=4))
    choice = place(group_model(gpus=4), infos, []).choice
    assert choice is not None and choice.fabric == "small"
    assert [x.node for x in choice.members] == ["y", "z"], "nodes with no spare GPU before bigger ones"


def test_unhealthy_and_unplaceable_gpus_count_as_neither_used_nor_free():
    sick = gpu_node("a", "ib", count=4, unhealthy=[3])
    infos = nodes_of(sick, gpu_node("b", "ib", count=4))
    choice = place(group_model(gpus=3), infos, []).choice
    assert choice is not None and choice.members[0] == Member("a", (0, 1, 2), "10.0.0.97")
    refusal = next(r for r in place(group_model(gpus=4), infos, []).refusals if r.node == "a")
    assert (refusal.verdict, refusal.code) == (NOT_NOW, "gpus_unhealthy")


def test_mig_instances_never_host_a_member():
    mig = replace(node("m").mig(0, "a100-80g", ("3g.40gb", 40), ("3g.40gb", 40)).engines("vllm").fabric("ib").build())
    result = place(group_model(gpus=1), nodes_of(mig, gpu_node("b", "ib")), [])
    assert result.choice is None
    assert [(r.node, r.verdict, r.code) for r in result.refusals] == [("m", NEVER, "mig_single")]


def test_a_cpu_group_takes_nodes_running_no_other_member():
    infos = nodes_of(*(replace(node(n).engines("sim").fabric("lo").build(), address="127.0.0.1") for n in "abcd"))
    m = sim_group(nodes=3)
    first = place(m, infos, [])
    assert first.choice is not None
    assert [(x.node, x.gpus, x.host) for x in first.choice.members] == [(n, (), "127.0.0.1") for n in "abc"]
    taken = [on("a", group="g-g1"), on("b", group="g-g1", rank=1)]
    second = place(m, infos, taken)
    assert second.choice is None and second.summary == "no fabric with 3 free whole nodes: lo has 2"


def test_the_member_host_falls_back_to_the_hostname_then_the_name():
    infos = nodes_of(replace(gpu_node("a", "ib"), address="0.0.0.0", hostname="a.lan"),
                     replace(gpu_node("b", "ib"), address="", hostname=""))
    choice = place(group_model(), infos, []).choice
    assert choice is not None and [x.host for x in choice.members] == ["a.lan", "b"]


# --- placement properties ---------------------------------------------------------------

FABRICS = ["ib-a", "ib-b", ""]


@st.composite
def group_fleets(draw: st.DrawFn) -> dict[str, NodeInfo]:
    out = {}
    for name in draw(st.lists(st.sampled_from(["n1", "n2", "n3", "n4", "n5", "n6"]), unique=True, max_size=6)):
        gpus = []
        for index in range(draw(st.integers(0, 4))):
            cls = draw(st.sampled_from(["h100-80g", "a100-40g"]))
            usable = draw(st.integers(0, 4))
            gpus.append(Gpu(index, f"GPU-{name}-{index}", cls, cls, 80 * GIB if cls == "h100-80g" else 40 * GIB, 0,
                            healthy=usable != 0, placeable=usable != 1, reason="" if usable > 1 else "not now"))
        if draw(st.integers(0, 4)) == 0:  # a MIG instance
            gpus.append(Gpu(1000, f"MIG-{name}", "mig", "a100-80g-mig-3g.40gb", 40 * GIB, 0, parent_index=0))
        engines = tuple(draw(st.lists(st.sampled_from(["vllm", "sim"]), unique=True, min_size=1)))
        out[name] = NodeInfo(name, hostname=name, gpus=tuple(gpus), engines=engines,
                             fabric=draw(st.sampled_from(FABRICS)))
    return out


@st.composite
def group_models(draw: st.DrawFn) -> ModelDef:
    extra: dict[str, Any] = {}
    if draw(st.booleans()):
        extra["classes"] = [draw(st.sampled_from(["h100-80g", "a100-40g"]))]
    if draw(st.booleans()):
        extra["memory_gib"] = draw(st.sampled_from([20, 60]))
    gpus = draw(st.integers(1, 3))
    return group_model("m", nodes=draw(st.integers(2, 3)), gpus=gpus, **extra)


def eligible(m: ModelDef, info: NodeInfo, used: set[int]) -> bool:
    """Brute force: can this node host a member now?"""
    prof = m.profile
    if not info.fabric or m.engine not in info.engines:
        return False
    if any(g.usable and g.index in used for g in info.gpus):
        return False
    fits = [g for g in info.gpus if g.usable and "-mig-" not in g.gpu_class
            and (not prof.classes or g.gpu_class in prof.classes)
            and room(m, g) >= prof.memory_gib * GIB / (prof.gpus * prof.nodes)]
    return len(fits) >= prof.gpus


def room(m: ModelDef, g: Gpu) -> float:
    """What of a GPU's memory the engine uses: vLLM takes 90% (memory_gib covers the whole replica)."""
    return g.memory_total * (0.9 if m.engine == "vllm" else 1.0)


def used_by(placements: list[Placement]) -> dict[str, set[int]]:
    used: dict[str, set[int]] = {}
    for p in placements:
        used.setdefault(p.node, set()).update(p.gpus)
    return used


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_groups_placed_one_by_one_never_over_commit_nor_span_fabrics(data: Any):
    nodes = data.draw(group_fleets())
    m = data.draw(group_models())
    placements: list[Placement] = []
    for n in range(4):
        used = used_by(placements)
        result = place(m, nodes, placements)
        by_fabric: dict[str, int] = {}
        for name, info in nodes.items():
            if eligible(m, info, used.get(name, set())):
                by_fabric[info.fabric] = by_fabric.get(info.fabric, 0) + 1
        assert (result.choice is not None) == any(c >= m.profile.nodes for c in by_fabric.values())
        assert result == place(m, dict(reversed(list(nodes.items()))), list(reversed(placements))), "deterministic"
        if result.choice is None:
            assert result.reason()
            break
        members = result.choice.members
        assert len(members) == m.profile.nodes and len({x.node for x in members}) == len(members)
        assert len({nodes[x.node].fabric for x in members}) == 1 and result.choice.fabric
        for x in members:
            info = nodes[x.node]
            assert eligible(m, info, used.get(x.node, set()))
            by_index = {g.index: g for g in info.gpus}
            assert len(x.gpus) == m.profile.gpus and len(set(x.gpus)) == len(x.gpus)
            for index in x.gpus:
                g = by_index[index]
                assert g.usable and "-mig-" not in g.gpu_class and index not in used.get(x.node, set())
                assert room(m, g) >= m.profile.memory_gib * GIB / (m.profile.gpus * m.profile.nodes)
        placements += [Placement(f"m-g{n}-r{r}", "m", x.node, x.gpus, "h", n, group=f"m-g{n}", rank=r,
                                 group_size=len(members)) for r, x in enumerate(members)]
    seen: set[tuple[str, int]] = set()
    for p in placements:
        assert not any((p.node, g) in seen for g in p.gpus)
        seen.update((p.node, g) for g in p.gpus)


# --- the command and the state -------------------------------------------------------------


def add_group(state: ClusterState, name: str, *members: tuple[str, tuple[int, ...], str]) -> tuple[ClusterState, Any]:
    return C.apply(state, C.add_group(name, members, "hash", 5.0))


def test_add_group_places_every_member_with_its_rank_and_the_leader_address():
    s = state_with([group_model()])
    s, result = add_group(s, "big", ("a", (0, 1), "10.0.0.1"), ("b", (0, 1), "10.0.0.2"))
    port = group_port("big-g1", 29500, 29999)
    assert 29500 <= port <= 29999
    assert result == {"group": "big-g1", "replica_ids": ["big-g1-r0", "big-g1-r1"], "leader": f"10.0.0.1:{port}"}
    r0, r1 = s.placements["big-g1-r0"], s.placements["big-g1-r1"]
    assert (r0.node, r0.gpus, r0.rank, r0.group_size, r0.group) == ("a", (0, 1), 0, 2, "big-g1")
    assert (r1.node, r1.rank, r1.leader, r1.address) == ("b", 1, f"10.0.0.1:{port}", f"10.0.0.2:{port}")
    assert r0.serves and not r1.serves
    assert s.next_replica == 2, "one id for the whole group"
    s, again = add_group(s, "big", ("c", (), "c"), ("d", (), "d"))
    assert again["group"] == "big-g2"


def test_the_port_range_is_a_setting_and_ipv6_hosts_are_bracketed():
    s = state_with([group_model()], settings={"groups.ports": [40000, 40000]})
    s, result = add_group(s, "big", ("a", (), "fd00::1"), ("b", (), "fd00::2"))
    assert result["leader"] == "[fd00::1]:40000"
    assert s.placements["big-g1-r1"].address == "[fd00::2]:40000"
    with pytest.raises(C.CommandError):
        C.apply(s, C.put_setting("groups.ports", [30000, 20000], 1.0))


def test_add_group_never_double_books_a_gpu():
    s = state_with([group_model()])
    s, _ = C.apply(s, C.add_placement("big", "b", (1,), "hash", 1.0))
    with pytest.raises(C.CommandError) as refused:
        add_group(s, "big", ("a", (0, 1), "a"), ("b", (0, 1), "b"))
    assert refused.value.code == "gpu_taken" and "on b" in refused.value.message


@pytest.mark.parametrize("members, words", [
    ([{"node": "a", "gpus": [], "host": "a"}], "2..64 members"),
    ([{"node": "a", "gpus": [], "host": "a"}, {"node": "a", "gpus": [], "host": "a"}], "distinct nodes"),
    ([{"node": "a", "gpus": [], "host": "a b"}, {"node": "b", "gpus": [], "host": "b"}], "not a host"),
    ([{"node": "a", "gpus": [1, 1], "host": "a"}, {"node": "b", "gpus": [], "host": "b"}], "distinct device"),
    (["a", "b"], "an object"),
])
def test_add_group_refuses_malformed_members(members: Any, words: str):
    with pytest.raises(C.CommandError) as refused:
        C.check(C.make("placement.add_group", 1.0, model="big", members=members, launch_hash="h"))
    assert refused.value.code == "bad_command" and words in refused.value.message


def test_group_placements_survive_snapshots_and_old_snapshots_still_load():
    s = state_with([group_model()])
    s, _ = add_group(s, "big", ("a", (0,), "a"), ("b", (0,), "b"))
    doc = json.loads(json.dumps(state_to_json(s)))
    assert state_from_json(doc) == s
    assert pickle.loads(pickle.dumps(s)) == s
    # Written before groups existed: a placement without the fields is a lone replica.
    for p in doc["state"]["placements"].values():
        for key in ("group", "rank", "group_size", "leader", "address"):
            del p[key]
    old = state_from_json(doc)
    assert {(p.group, p.rank, p.group_size, p.leader) for p in old.placements.values()} == {("", 0, 1, "")}


# --- the reconciler ---------------------------------------------------------------------

LO = [replace(node(n).engines("sim").fabric("lo").build(), address="127.0.0.1") for n in ("a", "b", "c")]


def grouped_state(m: ModelDef | None = None, **settings_: Any) -> ClusterState:
    m = m or sim_group()
    s = state_with([m], settings=settings_ or None)
    s, _ = C.apply(s, C.add_group(m.name, [(n.node, (), n.address) for n in LO], m.launch_hash(), 0.0))
    return s


def starts(plan: Plan) -> dict[str, AgentAction]:
    return {a.replica_id: a for a in plan.actions if a.kind == "start"}


def test_decide_places_one_group_with_one_command():
    m = sim_group()
    plan = decide(state_with([m]), observed(LO), NOW)
    assert plan.commands == (C.add_group("g", [(n, (), "127.0.0.1") for n in "abc"], m.launch_hash(), NOW, slot=0),)


def test_members_start_first_and_rank_0_once_every_member_runs():
    s = grouped_state()
    leader = s.placements["g-g1-r0"].leader
    first = decide(s, observed(LO), NOW)
    assert sorted(starts(first)) == ["g-g1-r1", "g-g1-r2"], "rank 0 waits for its members"
    port = leader.rsplit(":", 1)[1]
    assert starts(first)["g-g1-r2"].message()["group"] == {"rank": 2, "size": 3, "leader": leader,
                                                           "address": f"127.0.0.1:{port}"}
    one = decide(s, observed(LO, [replica("g-g1-r1", "b", "starting", model="g")]), NOW)
    assert sorted(starts(one)) == ["g-g1-r2"]
    both = decide(s, observed(LO, [replica("g-g1-r1", "b", "ready", model="g"),
                                   replica("g-g1-r2", "c", "starting", model="g")]), NOW)
    assert sorted(starts(both)) == ["g-g1-r0"]
    message = starts(both)["g-g1-r0"].message()
    assert message["group"] == {"rank": 0, "size": 3, "leader": leader, "address": leader,
                                "members": [f"127.0.0.1:{port}", f"127.0.0.1:{port}"]}
    assert message["type"] == "start_replica" and message["gpus"] == []


def test_a_lone_replica_start_carries_no_group():
    assert "group" not in AgentAction("a", "start", "x-r1", {}, ()).message()


def running(state: str = "ready", failed: str = "", error: str = "boom", since: float = 0.0) -> Observed:
    reps = [replica(f"g-g1-r{k}", n, "failed" if failed == f"r{k}" else state, model="g", error=error,
                    since=since) for k, n in enumerate("abc")]
    return observed(LO, reps)


def test_only_rank_0_is_an_endpoint_and_the_group_counts_once():
    plan = decide(grouped_state(), running(), NOW)
    route, view = plan.routes["g"], plan.views["g"]
    assert route.state == "ready" and [e.replica_id for e in route.endpoints] == ["g-g1-r0"]
    assert (view.placed, view.ready, view.starting) == (1, 1, 0)
    members_only = observed(LO, [replica(f"g-g1-r{k}", n, "ready", model="g") for k, n in ((1, "b"), (2, "c"))])
    waiting = decide(grouped_state(), members_only, NOW)
    assert waiting.routes["g"].state == "starting" and waiting.routes["g"].endpoints == ()
    assert (waiting.views["g"].ready, waiting.views["g"].starting) == (0, 1)


def test_a_failed_member_fails_the_whole_group_once_and_rank_0_stops_first():
    s = grouped_state()
    plan = decide(s, running(failed="r2", error="engine exited with status 4"), NOW)
    removes = [(c["replica_id"], c["reason"]) for c in plan.commands if c["op"] == "placement.remove"]
    assert removes == [(f"g-g1-r{k}", "start failed") for k in range(3)]
    failures = [c for c in plan.commands if c["op"] == "health.start_failed"]
    assert len(failures) == 1
    assert failures[0]["error"] == "rank 2 of g-g1 (on c) failed: engine exited with status 4"
    assert [(a.kind, a.replica_id) for a in plan.actions] == [("stop", "g-g1-r0"), ("stop", "g-g1-r1"),
                                                              ("stop", "g-g1-r2")]
    assert plan.routes["g"].endpoints == ()


def test_the_first_member_to_fail_is_named():
    reps = [replica("g-g1-r0", "a", "failed", model="g", error="rank 1 left the group", since=5.0),
            replica("g-g1-r1", "b", "failed", model="g", error="out of memory", since=4.0),
            replica("g-g1-r2", "c", "failed", model="g", error="group leader gone", since=6.0)]
    plan = decide(grouped_state(), observed(LO, reps), NOW)
    (failure,) = [c for c in plan.commands if c["op"] == "health.start_failed"]
    assert failure["error"] == "rank 1 of g-g1 (on b) failed: out of memory" and failure["replica_id"] == "g-g1-r1"


def test_stops_of_replicas_already_unplaced_still_go_to_rank_0_first():
    s = state_with([sim_group()])  # no placement left: the ids say the ranks
    reps = [replica(f"g-g7-r{k}", n, "ready", model="g") for k, n in zip((2, 1, 0), "cba")]
    plan = decide(s, observed(LO, reps), NOW)
    stops = [a.replica_id for a in plan.actions if a.kind == "stop"]
    assert stops == ["g-g7-r0", "g-g7-r1", "g-g7-r2"]


def test_a_group_is_scaled_down_and_replaced_whole():
    stopped = decide(grouped_state(**{"serving.stopped": True}), running(), NOW)
    assert [c["replica_id"] for c in stopped.commands] == ["g-g1-r0", "g-g1-r1", "g-g1-r2"]
    assert {c["reason"] for c in stopped.commands} == {"scaled down"}
    assert [a.replica_id for a in stopped.actions] == ["g-g1-r0", "g-g1-r1", "g-g1-r2"]
    s = grouped_state()
    changed = ModelDef.from_doc({**s.models["g"].to_doc(), "args": ["--tokens-per-s", "5"]})
    s, _ = C.apply(s, C.put_model(changed, 1.0))
    plan = decide(s, running(), NOW)
    reasons = [(c.get("replica_id"), c.get("reason")) for c in plan.commands if c["op"] == "placement.remove"]
    # No room for a second group beside it: the old one makes room (a rolling change needs room).
    assert reasons == [(f"g-g1-r{k}", "definition changed (no room to start the new replica first)")
                       for k in range(3)]
    assert plan.commands[-1]["op"] == "placement.add_group", "placed again at once, on the nodes just freed"


def test_a_member_node_lost_past_grace_removes_the_group_without_a_failure():
    obs = observed(LO[:2], [replica(f"g-g1-r{k}", n, "ready", model="g") for k, n in enumerate("ab")],
                   lost={"c": NOW - 31})
    plan = decide(grouped_state(), obs, NOW)
    assert [(c["op"], c.get("reason")) for c in plan.commands] == [("placement.remove", "node c lost")] * 3
    within = observed(LO[:2], obs.replicas.values(), lost={"c": NOW - 5})
    assert decide(grouped_state(), within, NOW).commands == ()


def test_an_incomplete_group_is_removed():
    s, _ = C.apply(grouped_state(), C.remove_placement("g-g1-r1", 1.0))
    plan = decide(s, running(), NOW)
    assert [(c["replica_id"], c["reason"]) for c in plan.commands[:2]] == [
        ("g-g1-r0", "group g-g1 is incomplete"), ("g-g1-r2", "group g-g1 is incomplete")]


def test_ready_members_do_not_clear_failures_only_rank_0_does():
    s = grouped_state()
    s, _ = C.apply(s, C.start_failed("g", "g-g0-r1", "earlier", 1.0, slot=0, node="b"))
    members = observed(LO, [replica(f"g-g1-r{k}", n, "ready", model="g") for k, n in ((1, "b"), (2, "c"))])
    assert not any(c["op"] == "health.ready" for c in decide(s, members, NOW).commands)
    assert any(c["op"] == "health.ready" for c in decide(s, running(), NOW).commands)


def test_units_group_members_in_rank_order():
    s = grouped_state()
    lone = Placement("a-r9", "a", "x", (), "h", 0)
    found = units([*reversed(list(s.placements.values())), lone])
    assert [[p.replica_id for p in u] for u in found] == [["a-r9"], ["g-g1-r0", "g-g1-r1", "g-g1-r2"]]


def test_a_loop_of_obedient_agents_converges_and_a_failing_group_parks():
    loop = ReconcileLoop(store_with([sim_group()]), LO)
    order: list[str] = []
    outcome = loop.outcome

    def record(action: AgentAction) -> str | None:
        order.append(action.replica_id)
        return outcome(action)

    loop.outcome = record
    plan = loop.settle()
    assert order == ["g-g1-r1", "g-g1-r2", "g-g1-r0"]
    assert [e.replica_id for e in plan.routes["g"].endpoints] == ["g-g1-r0"]

    parking = ReconcileLoop(store_with([sim_group()], settings={"health.park_after_failures": 2}), LO)
    parking.outcome = lambda action: "failed" if action.replica_id.endswith("-r2") else "starting"
    for _ in range(40):
        parking.tick(dt=60.0)
    assert parking.state.model_health("g").parked and parking.state.model_health("g").failures_in_row == 2
    assert "rank 2 of g-g" in parking.state.model_health("g").last_error
    assert not parking.state.placements
