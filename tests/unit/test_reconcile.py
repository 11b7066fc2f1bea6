"""S3 reconciler: `decide(state, observed, now)` by example, and convergence as a property."""

from __future__ import annotations

import json
import shlex
from datetime import datetime, timezone
from dataclasses import replace
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.cli.ctl.definitions import schedule_from_flag
from llmgw.domain import commands as C
from llmgw.domain.model import DefinitionError, ModelDef
from llmgw.domain.observed import Endpoint, NodeInfo, Observed
from llmgw.domain.state import ClusterState
from llmgw.domain.timeouts import TIMEOUTS
from llmgw.placement import place
from llmgw.reconcile import AgentAction, Plan, decide, desired_replicas, retry_backoff
from llmgw.testing import MemoryStore
from llmgw.testing.builders import (
    ReconcileLoop,
    quiet,
    cpu_node,
    model,
    node,
    observed,
    placed,
    replica,
    state_with,
    store_with,
)

NOW = 1000.0


def ops(plan: Plan) -> list[tuple[Any, ...]]:
    """Commands as short tuples, for readable assertions."""
    out: list[tuple[Any, ...]] = []
    for c in plan.commands:
        if c["op"] == "placement.add":
            out.append(("add", c["model"], c["node"], tuple(c["gpus"])))
        elif c["op"] == "placement.remove":
            out.append(("remove", c["replica_id"], c["reason"]))
        elif c["op"] == "health.start_failed":
            out.append(("start_failed", c["model"], c["replica_id"], c["error"]))
        elif c["op"] == "health.ready":
            out.append(("ready", c["model"]))
        else:  # pragma: no cover - decide issues nothing else today
            out.append((c["op"],))
    return out


def acts(plan: Plan) -> list[tuple[str, str, str]]:
    return [(a.kind, a.node, a.replica_id) for a in plan.actions]


def commit(state: ClusterState, plan: Plan) -> ClusterState:
    store = MemoryStore(state)
    for cmd in plan.commands:
        store.submit_nowait(cmd)
    return store.snapshot()


def fail(state: ClusterState, name: str, times: int, at: float) -> ClusterState:
    for n in range(times):
        state, _ = C.apply(state, C.start_failed(name, f"{name}-r{n}", f"error {n + 1}", at, slot=0))
    return state


# --- from nothing to serving --------------------------------------------------------


def test_from_empty_places_always_models_only():
    s = state_with([model("demo"), model("lazy").on_demand()])
    plan = decide(s, observed([cpu_node("local")]), NOW)
    m = s.models["demo"]
    assert plan.commands == (C.add_placement("demo", "local", (), m.launch_hash(), NOW, slot=0),)
    assert plan.actions == ()
    assert plan.routes["demo"].state == "starting" and plan.routes["demo"].reason == "waiting for a placement"
    assert plan.routes["lazy"].state == "absent"
    assert plan.views["demo"].desired == 1 and plan.views["lazy"].desired == 0


def test_nothing_to_do_for_an_empty_cluster():
    plan = decide(ClusterState(), observed([cpu_node()]), NOW)
    assert plan == Plan((), (), {}, {}, {})


def test_committed_placement_is_started_on_its_node():
    gpu_model = model("big").vllm().gpus(2)
    s = state_with([model("demo"), gpu_model])
    nodes = [cpu_node("local", "sim"), node("g1").gpus(8).engines("vllm")]
    s = commit(s, decide(s, observed(nodes), NOW))
    assert sorted((p.model, p.node, p.gpus) for p in s.placements.values()) == [
        ("big", "g1", (0, 1)),
        ("demo", "local", ()),
    ]
    plan = decide(s, observed(nodes), NOW + 1)
    assert plan.commands == ()
    # Models are visited by name, so "big" got the first replica id.
    assert plan.actions == (
        AgentAction("g1", "start", "big-r1", s.models["big"].to_doc(), (0, 1)),
        AgentAction("local", "start", "demo-r2", s.models["demo"].to_doc(), ()),
    )
    assert plan.actions[0].message() == {
        "type": "start_replica", "replica_id": "big-r1", "model": s.models["big"].to_doc(), "gpus": [0, 1]}
    assert plan.views["big"].starting == 1 and plan.routes["big"].state == "starting"


def test_start_is_repeated_until_the_agent_reports_the_replica():
    s = state_with([model("demo")], [placed("demo", "local")])
    for now in (NOW, NOW + 1):
        assert acts(decide(s, observed([cpu_node("local")]), now)) == [("start", "local", "demo-r1")]
    starting = observed([cpu_node("local")], [replica("demo-r1", "local", "starting")])
    assert decide(s, starting, NOW).actions == ()
    stopped = observed([cpu_node("local")], [replica("demo-r1", "local", "stopped")])
    assert acts(decide(s, stopped, NOW)) == [("start", "local", "demo-r1")]


def test_no_start_while_the_node_is_away():
    s = state_with([model("demo")], [placed("demo", "local")])
    plan = decide(s, observed([], since=NOW), NOW + 1)
    assert plan.actions == () and plan.commands == ()


def test_ready_replica_routes_to_its_endpoint():
    s = state_with([model("demo")], [placed("demo", "local")])
    ready = replica("demo-r1", "local", "ready", url="http://10.0.0.5:40123")
    plan = decide(s, observed([cpu_node("local")], [ready]), NOW)
    assert plan.commands == () and plan.actions == ()
    route = plan.routes["demo"]
    assert (route.state, route.role, route.reason) == ("ready", "chat", "")
    assert route.endpoints == (Endpoint("demo-r1", "http://10.0.0.5:40123", "local"),)
    view = plan.views["demo"]
    assert (view.desired, view.placed, view.ready, view.starting) == (1, 1, 1, 0)


def test_only_ready_replicas_with_a_url_are_endpoints():
    s = state_with([model("demo").replicas(3)], [placed("demo", "a", at=1), placed("demo", "a", at=2),
                                                  placed("demo", "a", at=3)])
    reps = [replica("demo-r1", "a", "ready", url="http://a:1"), replica("demo-r2", "a", "ready", url=""),
            replica("demo-r3", "a", "starting")]
    plan = decide(s, observed([cpu_node("a")], reps), NOW)
    assert plan.routes["demo"].endpoints == (Endpoint("demo-r1", "http://a:1", "a"),)
    assert plan.views["demo"].starting == 1


# --- scaling, removal, replacement -------------------------------------------------------


def test_scale_up_places_the_missing_replicas_spread_over_nodes():
    s = state_with([model("demo").replicas(3)], [placed("demo", "a")])
    plan = decide(s, observed([cpu_node("a"), cpu_node("b")]), NOW)
    assert ops(plan) == [("add", "demo", "b", ()), ("add", "demo", "a", ())]


def test_scale_down_removes_the_newest():
    s = state_with(
        [model("demo").replicas(3)],
        [placed("demo", "a", at=30), placed("demo", "b", at=10), placed("demo", "a", at=20)],
    )
    s = commit(s, Plan((C.put_model(model("demo").replicas(1).build(), NOW),), (), {}, {}, {}))
    reps = [replica(f"demo-r{n}", "a" if n != 2 else "b") for n in (1, 2, 3)]
    plan = decide(s, observed([cpu_node("a"), cpu_node("b")], reps), NOW)
    assert ops(plan) == [("remove", "demo-r1", "scaled down"), ("remove", "demo-r3", "scaled down")]
    assert acts(plan) == [("stop", "a", "demo-r1"), ("stop", "a", "demo-r3")]
    assert plan.routes["demo"].endpoints == (Endpoint("demo-r2", reps[1].url, "b"),)


def test_removed_model_loses_its_placement_then_its_replica_is_stopped():
    store = store_with([model("demo")], [placed("demo", "local")])
    store.submit_nowait(C.remove_model("demo", NOW))
    seen = observed([cpu_node("local")], [replica("demo-r1", "local")])
    plan = decide(store.snapshot(), seen, NOW)
    assert ops(plan) == [("remove", "demo-r1", "model removed")]
    assert "demo" not in plan.routes
    for cmd in plan.commands:
        store.submit_nowait(cmd)
    assert store.snapshot().placements == {}
    again = decide(store.snapshot(), seen, NOW + 1)
    assert again.commands == () and acts(again) == [("stop", "local", "demo-r1")]
    assert again.actions[0].message() == {"type": "stop_replica", "replica_id": "demo-r1"}
    gone = observed([cpu_node("local")], [replica("demo-r1", "local", "stopped")])
    assert decide(store.snapshot(), gone, NOW + 2).actions == ()


def test_stray_replica_on_a_lost_node_is_not_stopped_until_it_returns():
    s = state_with([model("demo")], [placed("demo", "a")])
    stray = replica("ghost-r9", "b", model="ghost")
    assert ("stop", "b", "ghost-r9") not in acts(decide(s, observed([cpu_node("a")], [stray]), NOW))
    assert ("stop", "b", "ghost-r9") in acts(decide(s, observed([cpu_node("a"), cpu_node("b")], [stray]), NOW))


def test_definition_change_replaces_the_replica():
    """Rolling, with room: the new replica first; the old one goes once the new one serves
    (more in test_reconcile_rolling.py)."""
    s = state_with([model("small").llamacpp().cpu()], [placed("small", "local")])
    new = model("small").llamacpp("/models/smollm2-v2.gguf").cpu().build()
    s = commit(s, Plan((C.put_model(new, NOW),), (), {}, {}, {}))
    seen = observed([cpu_node("local")], [replica("small-r1", "local")])
    plan = decide(s, seen, NOW)
    assert ops(plan) == [("add", "small", "local", ())]
    assert plan.commands[0]["launch_hash"] == new.launch_hash()
    assert plan.routes["small"].endpoints == (Endpoint("small-r1", seen.replicas["small-r1"].url, "local"),)
    s = commit(s, plan)
    both = observed([cpu_node("local")], [replica("small-r1", "local"), replica("small-r2", "local")])
    plan = decide(s, both, NOW + 1)
    assert ops(plan) == [("remove", "small-r1", "definition changed")]
    assert acts(plan) == [("stop", "local", "small-r1")]


def test_rescheduling_does_not_replace():
    s = state_with([model("small").llamacpp().cpu()], [placed("small", "local")])
    s = commit(s, Plan((C.put_model(model("small").llamacpp().cpu().replicas(1, 4).build(), NOW),), (), {}, {}, {}))
    plan = decide(s, observed([cpu_node("local")], [replica("small-r1", "local")]), NOW)
    assert plan.commands == () and plan.actions == ()


# --- failures, backoff, parking ---------------------------------------------------------------


def test_failed_replica_is_counted_removed_and_stopped():
    s = state_with([model("demo")], [placed("demo", "local")])
    failed = replica("demo-r1", "local", "failed", error="CUDA out of memory")
    plan = decide(s, observed([cpu_node("local")], [failed]), NOW)
    assert ops(plan) == [
        ("remove", "demo-r1", "start failed"),
        ("start_failed", "demo", "demo-r1", "CUDA out of memory"),
    ]
    assert acts(plan) == [("stop", "local", "demo-r1")]
    s = commit(s, plan)
    assert s.model_health("demo").failures_in_row == 1 and s.model_health("demo").last_failure_at == NOW


def test_failed_replica_without_error_text_gets_a_default():
    s = state_with([model("demo")], [placed("demo", "local")])
    plan = decide(s, observed([cpu_node("local")], [replica("demo-r1", "local", "failed")]), NOW)
    assert ("start_failed", "demo", "demo-r1", "engine exited") in ops(plan)


def test_retry_backoff_doubles_up_to_the_cap():
    assert [retry_backoff(n) for n in range(0, 8)] == [0, 1, 2, 4, 8, 16, 30, 30]
    assert retry_backoff(1000) == TIMEOUTS.start_backoff_max_s


def test_retry_backoff_follows_the_timeouts_it_is_given():
    fast = replace(TIMEOUTS, start_backoff_first_s=0.5, start_backoff_max_s=3.0)
    assert [retry_backoff(n, fast) for n in range(0, 6)] == [0, 0.5, 1, 2, 3, 3]


@pytest.mark.parametrize("failures", [1, 2, 3, 4])
def test_no_new_placement_until_the_backoff_has_elapsed(failures):
    s = fail(state_with([model("demo")]), "demo", failures, NOW)
    wait = retry_backoff(failures)
    early = decide(s, observed([cpu_node("local")]), NOW + wait - 0.01)
    assert early.commands == ()
    assert early.routes["demo"].state == "starting"
    assert f"retrying after {failures} failed start(s): error {failures}" == early.routes["demo"].reason
    due = decide(s, observed([cpu_node("local")]), NOW + wait)
    assert ops(due) == [("add", "demo", "local", ())]


def test_no_replacement_in_the_pass_that_saw_the_failure():
    s = state_with([model("demo")], [placed("demo", "local")])
    plan = decide(s, observed([cpu_node("local")], [replica("demo-r1", "local", "failed")]), NOW)
    assert not [o for o in ops(plan) if o[0] == "add"]


def test_a_ready_replica_placed_after_the_failures_resets_the_failure_count():
    s = fail(state_with([model("demo").replicas(2)], [placed("demo", "a", at=NOW), placed("demo", "a", at=NOW)]),
             "demo", 2, NOW)
    plan = decide(s, observed([cpu_node("a")], [replica("demo-r1", "a"), replica("demo-r2", "a", "starting")]), NOW)
    assert ops(plan) == [("ready", "demo")]
    assert commit(s, plan).model_health("demo").failures_in_row == 0


def test_five_failures_in_a_row_park_the_model():
    s = fail(state_with([model("demo")], [placed("demo", "local")]), "demo", 4, NOW - 100)
    failed = replica("demo-r1", "local", "failed", error="unknown architecture 'mamba3'")
    plan = decide(s, observed([cpu_node("local")], [failed]), NOW)
    assert plan.views["demo"].desired == 1 and plan.views["demo"].state == "parked"
    assert not [o for o in ops(plan) if o[0] == "add"]
    s = commit(s, plan)
    health = s.model_health("demo")
    assert health.parked and health.failures_in_row == 5
    after = decide(s, observed([cpu_node("local")]), NOW + 3600)
    assert after.commands == () and after.actions == ()
    route = after.routes["demo"]
    assert route.state == "parked" and route.endpoints == ()
    assert "unknown architecture 'mamba3'" in route.reason and "5 failed starts" in route.reason
    assert "llmgw ctl model retry demo" in route.reason
    assert after.views["demo"].desired == 1, "a parked model shows what it should have: 0/1, not 0/0"
    assert desired_replicas(s, s.models["demo"], Observed(), NOW) == 0, "and places none"


def test_the_route_says_parked_in_the_pass_that_parks():
    s = fail(state_with([model("demo")], [placed("demo", "local")]), "demo", 4, NOW - 100)
    failed = replica("demo-r1", "local", "failed", error="unknown architecture 'mamba3'")
    route = decide(s, observed([cpu_node("local")], [failed]), NOW).routes["demo"]
    assert route.state == "parked" and "mamba3" in route.reason


def test_parking_removes_the_other_replicas_too():
    s = fail(state_with([model("demo").replicas(2)], [placed("demo", "a", at=1), placed("demo", "a", at=2)]),
             "demo", 4, NOW - 100)
    seen = observed([cpu_node("a")], [replica("demo-r1", "a", "failed"), replica("demo-r2", "a")])
    plan = decide(s, seen, NOW)
    assert sorted(o[1] for o in ops(plan) if o[0] == "remove") == ["demo-r1", "demo-r2"]
    assert sorted(acts(plan)) == [("stop", "a", "demo-r1"), ("stop", "a", "demo-r2")]


def test_park_threshold_follows_the_setting():
    s = fail(state_with([model("demo")], [placed("demo", "a")], {"health.park_after_failures": 2}), "demo", 1, 0)
    s = commit(s, decide(s, observed([cpu_node("a")], [replica("demo-r1", "a", "failed")]), NOW))
    assert s.model_health("demo").parked


def test_a_parked_model_failing_again_is_not_counted_again():
    s = fail(state_with([model("demo")], [placed("demo", "a")]), "demo", 5, 0)
    plan = decide(s, observed([cpu_node("a")], [replica("demo-r1", "a", "failed")]), NOW)
    assert ops(plan) == [("remove", "demo-r1", "start failed")]


def test_retry_places_a_parked_model_again():
    s = fail(state_with([model("demo")]), "demo", 5, NOW)
    s, _ = C.apply(s, C.retry_model("demo", NOW + 1))
    assert ops(decide(s, observed([cpu_node("a")]), NOW + 2)) == [("add", "demo", "a", ())]


def four_failures_then(first: str, second: str) -> tuple[ClusterState, Plan]:
    s = fail(state_with([model("demo").replicas(2)], [placed("demo", "a", at=1), placed("demo", "a", at=2)]),
             "demo", 4, NOW - 100)
    seen = observed([cpu_node("a")], [replica("demo-r1", "a", first), replica("demo-r2", "a", second)])
    plan = decide(s, seen, NOW)
    return commit(s, plan), plan


def test_a_fifth_failure_beside_a_ready_replica_parks_when_the_failure_comes_first():
    s, plan = four_failures_then("failed", "ready")
    assert s.model_health("demo").parked and s.placements == {}


def test_a_fifth_failure_beside_a_ready_replica_does_not_depend_on_replica_order():
    s, plan = four_failures_then("ready", "failed")
    health = s.model_health("demo")
    assert health.parked or "demo-r1" in s.placements, (health, ops(plan))


# --- serving stopped ---------------------------------------------------------------------------


def test_serving_stopped_removes_every_placement_and_routes_stopped():
    s = state_with([model("demo"), model("lazy").on_demand()],
                   [placed("demo", "a"), placed("lazy", "a")], {"serving.stopped": True})
    seen = observed([cpu_node("a")], [replica("demo-r1", "a"), replica("lazy-r2", "a")], demand={"lazy": NOW})
    plan = decide(s, seen, NOW)
    assert sorted(ops(plan)) == [("remove", "demo-r1", "scaled down"), ("remove", "lazy-r2", "scaled down")]
    assert sorted(acts(plan)) == [("stop", "a", "demo-r1"), ("stop", "a", "lazy-r2")]
    for name in ("demo", "lazy"):
        assert plan.routes[name].state == "stopped" and plan.routes[name].endpoints == ()
        assert "llmgw start" in plan.routes[name].reason
        assert plan.views[name].desired == 0
    assert commit(s, plan).models == s.models, "stopping changes no definition"


def test_serving_stopped_with_a_ready_replica_still_routes_nowhere():
    s = state_with([model("demo")], [placed("demo", "a")], {"serving.stopped": True})
    route = decide(s, observed([cpu_node("a")], [replica("demo-r1", "a")]), NOW).routes["demo"]
    assert route.state == "stopped" and route.endpoints == ()


# --- on-demand ---------------------------------------------------------------------------------------


def lazy_state() -> ClusterState:
    return state_with([model("lazy").on_demand(idle_timeout_s=300)])


def test_on_demand_without_demand_wants_nothing():
    plan = decide(lazy_state(), observed([cpu_node("a")]), NOW)
    assert plan.commands == () and plan.views["lazy"].desired == 0
    assert plan.routes["lazy"].state == "absent"


@pytest.mark.parametrize("age, wanted", [(0, 1), (299.9, 1), (300, 0), (5000, 0), (-5, 1)])
def test_on_demand_follows_the_idle_timeout(age, wanted):
    plan = decide(lazy_state(), observed([cpu_node("a")], demand={"lazy": NOW - age}), NOW)
    assert plan.views["lazy"].desired == wanted
    assert len(plan.commands) == wanted


def test_on_demand_idle_replica_is_scaled_down():
    s = state_with([model("lazy").on_demand(idle_timeout_s=300)], [placed("lazy", "a")])
    plan = decide(s, observed([cpu_node("a")], [replica("lazy-r1", "a")], demand={"lazy": NOW - 301}), NOW)
    assert ops(plan) == [("remove", "lazy-r1", "scaled down")]


def test_on_demand_minimum_is_kept_without_demand():
    s = state_with([model("lazy").on_demand().replicas(2, 3)])
    assert decide(s, observed([cpu_node("a")]), NOW).views["lazy"].desired == 2


# --- unplaceable --------------------------------------------------------------------------------------


def test_unplaceable_model_routes_with_the_reason():
    s = state_with([model("big").vllm().gpus(2)])
    plan = decide(s, observed([cpu_node("local", "vllm")]), NOW)
    assert plan.commands == ()
    reason = "no node fits — local: node has no GPU and the model's profile does not allow CPU"
    assert plan.unplaceable == {"big": reason}
    assert (plan.routes["big"].state, plan.routes["big"].reason) == ("unplaceable", reason)
    assert plan.views["big"].state == "unplaceable"


def test_no_agents_is_unplaceable_too():
    plan = decide(state_with([model("demo")]), observed([]), NOW)
    assert plan.unplaceable == {"demo": "no agent is connected"}


def test_partly_placeable_model_places_what_fits():
    s = state_with([model("big").vllm().gpus(4).replicas(3)])
    plan = decide(s, observed([node("g").gpus(8).engines("vllm")]), NOW)
    assert ops(plan) == [("add", "big", "g", (0, 1, 2, 3)), ("add", "big", "g", (4, 5, 6, 7))]
    assert "needs 4 free GPUs, 0 free" in plan.unplaceable["big"]


# --- lost nodes ---------------------------------------------------------------------------------------

GRACE = TIMEOUTS.lost_node_grace_s


def test_lost_node_keeps_its_placements_during_the_grace():
    s = state_with([model("demo")], [placed("demo", "a")])
    plan = decide(s, observed([cpu_node("b")], lost={"a": NOW}), NOW + GRACE - 0.1)
    assert plan.commands == () and plan.actions == ()
    assert plan.routes["demo"].state == "starting"


def test_lost_node_loses_its_placements_after_the_grace():
    s = state_with([model("demo")], [placed("demo", "a")])
    plan = decide(s, observed([cpu_node("b")], lost={"a": NOW}), NOW + GRACE)
    assert ops(plan) == [("remove", "demo-r1", "node a lost"), ("add", "demo", "b", ())]


def test_a_node_never_seen_counts_as_gone_since_the_observer_started():
    s = state_with([model("demo")], [placed("demo", "a")])
    assert decide(s, observed([cpu_node("b")], since=NOW), NOW + 1).commands == ()
    assert ops(decide(s, observed([cpu_node("b")], since=NOW), NOW + GRACE))[0] == (
        "remove", "demo-r1", "node a lost")


def test_lost_node_grace_is_the_one_decide_is_given():
    s = state_with([model("demo")], [placed("demo", "a")])
    short = replace(TIMEOUTS, lost_node_grace_s=5.0)
    gone = observed([cpu_node("b")], lost={"a": NOW})
    assert decide(s, gone, NOW + 4.9, short).commands == ()
    assert ops(decide(s, gone, NOW + 5.0, short))[0] == ("remove", "demo-r1", "node a lost")


# --- idempotence ----------------------------------------------------------------------------------------


def busy_input() -> tuple[ClusterState, Observed]:
    s = state_with(
        [model("demo").replicas(2), model("big").vllm().gpus(2).replicas(2), model("lazy").on_demand(),
         model("old")],
        [placed("demo", "a", at=1), placed("big", "g", (0, 1), at=2), placed("old", "gone", at=3),
         placed("lazy", "a", at=4)],
    )
    s, _ = C.apply(s, C.remove_model("old", 5))
    seen = observed([cpu_node("a"), node("g").gpus(4).engines("vllm")],
                    [replica("demo-r1", "a", "failed"), replica("big-r2", "g")],
                    demand={"lazy": NOW - 10}, lost={"gone": 0.0})
    return s, seen


def test_decide_is_idempotent_on_the_same_input():
    s, seen = busy_input()
    first, second = decide(s, seen, NOW), decide(s, seen, NOW)
    assert first == second and first.commands
    assert busy_input()[0] == s, "decide never mutates its snapshot"


def test_after_settling_another_pass_changes_nothing():
    loop = ReconcileLoop(store_with([model("demo").replicas(2), model("big").vllm().gpus(2)]),
                         [cpu_node("a"), node("g").gpus(4).engines("vllm")])
    settled = loop.settle()
    assert settled.routes["demo"].state == settled.routes["big"].state == "ready"
    revision = loop.state.revision
    for _ in range(3):
        plan = loop.tick()
        assert plan.commands == () and plan.actions == ()
    assert loop.state.revision == revision


# --- an end-to-end story through the loop ------------------------------------------------------------------


def test_a_model_that_always_fails_is_parked_after_five_tries():
    loop = ReconcileLoop(store_with([model("demo")]), [cpu_node("a")])
    loop.outcome = lambda action: "failed"
    plans = [loop.tick() for _ in range(80)]
    health = loop.state.model_health("demo")
    assert health.parked and health.failures_in_row == 5
    assert health.last_error == "engine exited with status 1"
    assert loop.state.placements == {}
    assert plans[-1].routes["demo"].state == "parked"
    assert sum(1 for p in plans for c in p.commands if c["op"] == "placement.add") == 5
    loop.store.submit_nowait(C.retry_model("demo", loop.now))
    loop.outcome = lambda action: "ready"
    assert loop.settle().routes["demo"].state == "ready"


def test_attempts_are_spaced_by_the_backoff():
    loop = ReconcileLoop(store_with([model("demo")]), [cpu_node("a")])
    loop.outcome = lambda action: "failed"
    added_at = []
    for _ in range(200):
        plan = loop.tick(dt=0.5)
        added_at += [c["at"] for c in plan.commands if c["op"] == "placement.add"]
    gaps = [b - a for a, b in zip(added_at, added_at[1:])]
    # Each gap is: start (next pass), failure seen (next pass), then the backoff.
    assert [g - 1.0 >= retry_backoff(n + 1) for n, g in enumerate(gaps)] == [True] * 4


# --- convergence property ---------------------------------------------------------------------------------------

NAMES = ["a", "b", "c", "d"]


@st.composite
def definitions(draw: st.DrawFn) -> ModelDef:
    name = draw(st.sampled_from(NAMES))
    b = model(name)
    kind = draw(st.sampled_from(["sim", "gpu1", "gpu2", "llama"]))
    if kind == "gpu1":
        b = b.vllm().gpus(1)
    elif kind == "gpu2":
        b = b.vllm().gpus(2)
    elif kind == "llama":
        b = b.llamacpp(draw(st.sampled_from(["/models/x.gguf", "/models/y.gguf"]))).cpu()
    if draw(st.booleans()):
        b = b.on_demand(idle_timeout_s=10_000)
        b = b.replicas(draw(st.integers(0, 2)), 2)
    else:
        b = b.replicas(draw(st.integers(0, 2)), 2)
    if draw(st.booleans()):
        b = b.args(draw(st.sampled_from(["--x", "--y"])))
    return b.build()


events = st.one_of(
    st.tuples(st.just("put"), definitions()),
    st.tuples(st.just("tick"), st.integers(1, 3)),
    st.tuples(st.just("remove"), st.sampled_from(NAMES)),
    st.tuples(st.just("stopped"), st.booleans()),
    st.tuples(st.just("park_after"), st.integers(1, 6)),
    st.tuples(st.just("demand"), st.sampled_from(NAMES)),
    st.tuples(st.just("crash"), st.integers(0, 10)),
    st.tuples(st.just("forget"), st.sampled_from(["g1", "g2", "cpu"])),
    st.tuples(st.just("tick"), st.integers(1, 3)),
)


def play(loop: ReconcileLoop, kind: str, arg: Any) -> None:
    """One thing happening to the cluster between (or instead of) reconciler passes."""
    state = loop.state
    if kind == "put":
        loop.store.submit_nowait(C.put_model(arg, loop.now))
    elif kind == "remove" and arg in state.models:
        loop.store.submit_nowait(C.remove_model(arg, loop.now))
    elif kind == "stopped":
        loop.store.submit_nowait(C.put_setting("serving.stopped", arg, loop.now))
    elif kind == "park_after":
        loop.store.submit_nowait(C.put_setting("health.park_after_failures", arg, loop.now))
    elif kind == "demand":
        loop.demand[arg] = loop.now
    elif kind == "crash" and loop.replicas:
        rid = sorted(loop.replicas)[arg % len(loop.replicas)]
        old = loop.replicas[rid]
        loop.replicas[rid] = replace(old, state="failed", url="", error="segfault", since=loop.now)
    elif kind == "forget":  # an agent restarts and reports nothing it ran
        loop.replicas = {k: v for k, v in loop.replicas.items() if v.node != arg}
    elif kind == "tick":
        for _ in range(arg):
            loop.tick()
            check_no_shared_gpu(loop.state)


def check_no_shared_gpu(state: ClusterState) -> None:
    seen: set[tuple[str, int]] = set()
    for p in state.placements.values():
        for g in p.gpus:
            assert (p.node, g) not in seen, f"GPU {g} on {p.node} placed twice"
            seen.add((p.node, g))


@settings(max_examples=150, deadline=None)
@given(st.lists(definitions(), min_size=1, max_size=6), st.lists(events, max_size=30))
def test_decide_then_apply_converges_to_the_desired_replicas(catalog, history):
    # 24 GPUs; the worst demand is 4 models × 2 replicas × 2 GPUs = 16, so all fits.
    loop = ReconcileLoop(MemoryStore(), [node("g1").gpus(8).engines("vllm", "sim"),
                                         node("g2").gpus(8).engines("vllm"),
                                         node("g3").gpus(8).engines("vllm"),
                                         cpu_node("cpu")])
    # Park only when a "park_after" event says so: most crashes are sporadic, not a broken model.
    loop.store.submit_nowait(C.put_setting("health.park_after_failures", 1000, loop.now))
    for kind, arg in [("put", m) for m in catalog] + [("tick", 2)] + history:
        play(loop, kind, arg)
    passes_before = loop.passes
    final = None
    for _ in range(60):
        final = loop.tick()
        check_no_shared_gpu(loop.state)
        if quiet(final):
            break
    assert final is not None and quiet(final), "no fixed point in 60 passes"
    assert loop.passes - passes_before <= 60
    state, seen = loop.state, loop.observed()
    assert final.unplaceable == {}
    for name, m in state.models.items():
        want = desired_replicas(state, m, seen, loop.now)
        mine = state.placements_of(name)
        assert len(mine) == want, (name, want, mine)
        assert all(p.launch_hash == m.launch_hash() for p in mine)
        assert all(loop.replicas[p.replica_id].state == "ready" for p in mine)
        expected = ("stopped" if state.settings.get("serving.stopped") else
                    "parked" if state.model_health(name).parked else
                    "ready" if want else "absent")
        assert final.routes[name].state == expected
    assert {p.model for p in state.placements.values()} <= set(state.models)
    assert set(loop.replicas) == set(state.placements), "every running replica is placed and vice versa"
    # And the fixed point is one: rerunning decide proposes nothing.
    assert decide(state, seen, loop.now) == decide(state, seen, loop.now)
    assert decide(state, seen, loop.now).commands == ()


@settings(max_examples=100, deadline=None)
@given(st.lists(definitions(), min_size=1, max_size=6), st.lists(events, max_size=20))
def test_on_a_scarce_fleet_what_fits_converges_and_the_rest_says_why(catalog, history):
    loop = ReconcileLoop(MemoryStore(), [node("g1").gpus(3).engines("vllm"), node("g2").gpus(2).engines("vllm"),
                                         cpu_node("cpu")])
    loop.store.submit_nowait(C.put_setting("health.park_after_failures", 1000, loop.now))
    for kind, arg in [("put", m) for m in catalog] + history:
        play(loop, kind, arg)
    final = loop.settle(max_passes=60)
    check_no_shared_gpu(loop.state)
    state, seen = loop.state, loop.observed()
    for name, m in state.models.items():
        want = desired_replicas(state, m, seen, loop.now)
        have = len(state.placements_of(name))
        if name in final.unplaceable:
            assert have < want and final.unplaceable[name].startswith("no node fits — ")
            assert place_again_fails(state, m, seen)
        else:
            assert have == want, (name, want, have)


def place_again_fails(state: ClusterState, m: ModelDef, seen: Observed) -> bool:
    return place(m, seen.nodes, state.placements.values()).choice is None


# --- golden scenarios (etcd-raft style datadriven files) ---------------------------------------------------------
#
# Each file in testdata/reconcile/ is a story: blocks of one directive line, `----`, and the
# expected output up to a blank line; `#` lines between blocks are comments. Run
# `pytest tests/unit/test_reconcile.py --rewrite` to regenerate the outputs, then review the diff.

GOLDEN = Path(__file__).parent / "testdata" / "reconcile"


class Scenario:
    """Interprets the directives of a golden file against a ReconcileLoop."""

    def __init__(self) -> None:
        self.loop = ReconcileLoop(MemoryStore(), now=NOW)
        self.away: dict[str, NodeInfo] = {}

    def run(self, line: str) -> str:
        words = shlex.split(line)
        verb, args = words[0], words[1:]
        handler = getattr(self, "do_" + verb.replace("-", "_"), None)
        if handler is None:
            raise ValueError(f"unknown directive {verb!r}")
        try:
            out = handler(*args)
        except (C.CommandError, DefinitionError) as e:
            return f"error: {e}"
        return out or "ok"

    # -- the world

    def do_model(self, name: str, *spec: str) -> None:
        b = model(name)
        for word in spec:
            key, _, value = word.partition("=")
            if key == "sim":
                b = b.sim()
            elif key == "llama":
                b = b.llamacpp(value or "/models/small.gguf").cpu()
            elif key == "vllm":
                b = b.vllm(value or "hf://org/big")
            elif key == "gpus":
                b = b.gpus(int(value))
            elif key == "replicas":
                low, _, high = value.partition(":")
                b = b.replicas(int(low), int(high) if high else None)
            elif key == "on-demand":
                b = b.on_demand()
            elif key == "idle":
                b = b.on_demand(idle_timeout_s=float(value))
            elif key == "source":
                b = b.source(value)
            elif key == "args":
                b = b.args(*value.split(","))
            elif key == "classes":
                b = b.classes(*value.split(","))
            elif key == "memory":
                b = b.memory(float(value))
            elif key == "schedule":  # as `ctl model serve --schedule`: "start=CRON; end=CRON; min=N; max=N"
                b._doc.setdefault("schedules", []).append(schedule_from_flag(value))
            else:
                raise ValueError(f"unknown model word {word!r}")
        self.loop.store.submit_nowait(C.put_model(b.build(), self.loop.now))

    def do_remove_model(self, name: str) -> None:
        self.loop.store.submit_nowait(C.remove_model(name, self.loop.now))

    def do_retry(self, name: str) -> None:
        self.loop.store.submit_nowait(C.retry_model(name, self.loop.now))

    def do_setting(self, key: str, value: str) -> None:
        self.loop.store.submit_nowait(C.put_setting(key, json.loads(value), self.loop.now))

    def do_node(self, name: str, *spec: str) -> None:
        b = node(name)
        opts = dict(word.partition("=")[::2] for word in spec)
        if "gpus" in opts:
            b = b.gpus(int(opts["gpus"]), opts.get("class", "h100-80g"), memory_gib=float(opts.get("memory", 80)),
                       unhealthy=[int(i) for i in opts["unhealthy"].split(",")] if "unhealthy" in opts else ())
        if "engines" in opts:
            b = b.engines(*opts["engines"].split(","))
        info = b.build()
        self.loop.nodes[name] = info
        self.loop.lost.pop(name, None)

    def do_lose(self, name: str) -> None:
        self.away[name] = self.loop.nodes[name]
        self.loop.lose(name)

    def do_return(self, name: str, *running: str) -> None:
        """The node reconnects; its agent reports the replicas named as still running."""
        self.loop.nodes[name] = self.away.pop(name)
        self.loop.lost.pop(name, None)
        for rid in running:
            self.loop.replicas[rid] = replica(rid, name)

    def do_demand(self, name: str, ago: str = "0") -> None:
        self.loop.demand[name] = self.loop.now - float(ago)

    def do_report(self, rid: str, state: str, *error: str) -> None:
        where = self.loop.state.placements.get(rid)
        old = self.loop.replicas.get(rid)
        on = where.node if where else old.node if old else "?"
        self.loop.replicas[rid] = replica(rid, on, state, error=" ".join(error))

    def do_agents(self, mode: str) -> None:
        outcome = {"ready": "ready", "fail": "failed", "slow": "starting", "silent": None}[mode]
        self.loop.outcome = lambda action: outcome

    def do_advance(self, seconds: str) -> None:
        self.loop.now += float(seconds)

    def do_at(self, when: str, zone_name: str = "UTC") -> str:
        """`at YYYY-MM-DDTHH:MM [ZONE]`: the clock jumps forward to that wall time; says its UTC time."""
        t = datetime.strptime(when, "%Y-%m-%dT%H:%M").replace(tzinfo=ZoneInfo(zone_name)).timestamp()
        if t < self.loop.now:
            raise ValueError(f"at {when}: the clock does not go back")
        self.loop.now = t
        return datetime.fromtimestamp(t, timezone.utc).strftime("now %Y-%m-%d %H:%M UTC (%a)")

    # -- the reconciler

    def do_decide(self) -> str:
        return render_plan(self.loop.decide())

    def do_tick(self, count: str = "1", *flags: str) -> str:
        """`tick N [dt=S] [busy]`: N passes S seconds apart; `busy` shows only passes that did something."""
        opts = dict(f.partition("=")[::2] for f in flags)
        out = []
        for _ in range(int(count)):
            at = self.loop.now
            plan = self.loop.tick(float(opts.get("dt", 1)))
            if "busy" in opts and not plan.commands and not plan.actions:
                continue
            out.append(f"pass {self.loop.passes} @{_clock(at)}:")
            out += ["  " + line for line in render_plan(plan).splitlines()]
        return "\n".join(out) or "(nothing to do)"

    def do_settle(self) -> str:
        start = self.loop.passes
        plan = self.loop.settle()
        return f"quiet after {self.loop.passes - start} passes @{_clock(self.loop.now - 1)}\n" + render_routes(plan)

    def do_state(self) -> str:
        s = self.loop.state
        out = [f"revision {s.revision}"]
        for p in sorted(s.placements.values(), key=lambda p: p.replica_id):
            gpus = ",".join(map(str, p.gpus)) or "cpu"
            out.append(f"placement {p.replica_id} on {p.node} [{gpus}] at {p.placed_at:g}")
        for name, h in sorted(s.health.items()):
            out.append(f"health {name}: {h.failures_in_row} failures{' PARKED' if h.parked else ''}"
                       f" last at {h.last_failure_at:g}: {h.last_error}")
        return "\n".join(out)


def _clock(t: float) -> str:
    """A scenario's clock: seconds from its start, or a UTC time once `at` has moved it to a real date."""
    return f"{t:g}" if t < 1e8 else datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def render_plan(plan: Plan) -> str:
    out = []
    for c in plan.commands:
        if c["op"] == "placement.add":
            out.append(f"+ place {c['model']} on {c['node']} [{','.join(map(str, c['gpus'])) or 'cpu'}]")
        elif c["op"] == "placement.remove":
            out.append(f"- unplace {c['replica_id']} ({c['reason']})")
        elif c["op"] == "health.start_failed":
            out.append(f"! start failed {c['replica_id']}: {c['error']}")
        elif c["op"] == "health.ready":
            out.append(f"~ ready {c['model']}")
        else:
            out.append(f"? {c['op']}")
    for a in plan.actions:
        gpus = f" [{','.join(map(str, a.gpus)) or 'cpu'}]" if a.kind == "start" else ""
        out.append(f"> {a.kind} {a.replica_id} on {a.node}{gpus}")
    if not out:
        out.append("(nothing to do)")
    return "\n".join(out + [render_routes(plan)])


def render_routes(plan: Plan) -> str:
    out = []
    for name, v in sorted(plan.views.items()):
        r = plan.routes[name]
        eps = " ".join(e.replica_id for e in r.endpoints)
        line = f"{name}: {r.state} {v.ready}/{v.desired} ready, {v.placed} placed"
        line += f" -> {eps}" if eps else ""
        line += f" — {r.reason}" if r.reason else ""
        out.append(line)
    return "\n".join(out) if out else "(no models)"


def run_golden(text: str) -> tuple[str, list[tuple[int, str, str, str]]]:
    """Returns the rewritten file and the (line, directive, expected, actual) of each block."""
    scenario = Scenario()
    lines = text.splitlines()
    out: list[str] = []
    blocks: list[tuple[int, str, str, str]] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip() or line.startswith("#"):
            out.append(line)
            i += 1
            continue
        directive, start = line, i + 1
        if i + 1 >= len(lines) or lines[i + 1] != "----":
            raise ValueError(f"line {start}: expected '----' after {directive!r}")
        i += 2
        expected = []
        while i < len(lines) and lines[i].strip():
            expected.append(lines[i])
            i += 1
        actual = scenario.run(directive)
        blocks.append((start, directive, "\n".join(expected), actual))
        out += [directive, "----", *actual.splitlines()]
    return "\n".join(out) + "\n", blocks


@pytest.mark.parametrize("path", sorted(GOLDEN.glob("*.txt")), ids=lambda p: p.stem)
def test_golden_scenario(path: Path, request: pytest.FixtureRequest):
    rewritten, blocks = run_golden(path.read_text())
    if request.config.getoption("--rewrite"):
        path.write_text(rewritten)
        return
    for line, directive, expected, actual in blocks:
        assert actual == expected, f"{path.name}:{line}: {directive}\n--- expected\n{expected}\n--- actual\n{actual}"


def test_golden_files_exist():
    assert len(list(GOLDEN.glob("*.txt"))) >= 3


def test_golden_runner_reports_a_difference_and_rewrites_it():
    text = "# comment kept\n\nnode a\n----\nwrong\n\nmodel demo sim\n----\nok\n"
    rewritten, blocks = run_golden(text)
    assert [(b[1], b[2], b[3]) for b in blocks] == [("node a", "wrong", "ok"), ("model demo sim", "ok", "ok")]
    assert rewritten == "# comment kept\n\nnode a\n----\nok\n\nmodel demo sim\n----\nok\n"
    assert run_golden(rewritten)[0] == rewritten
