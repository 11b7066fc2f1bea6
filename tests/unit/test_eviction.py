"""Eviction (`llmgw.reconcile.demand.evictions`): which idle replicas make room for a model that
fits nowhere. Longest idle first; never a model in use, an always-on one, one whose demand is
unknown, or a replica the model's minimum needs; nothing when room would not help."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import pytest
import trio

from llmgw.control.hub import AgentHub
from llmgw.control.reconciler import Reconciler
from llmgw.domain.observed import Observed
from llmgw.domain.state import ClusterState
from llmgw.placement import place
from llmgw.reconcile import decide
from llmgw.reconcile.demand import Eviction, desired, evictions
from llmgw.testing.builders import ModelBuilder, model, node, observed, placed, replica, state_with, store_with

NOW = 100_000.0
MIN = 60.0
HOUR = 3600.0


def gpu_model(name: str, gpus: int = 1) -> ModelBuilder:
    return model(name).vllm().gpus(gpus).on_demand(idle_timeout_s=2 * HOUR)


def two_gpu_fleet(*models: ModelBuilder, **extra: ModelBuilder) -> ClusterState:
    """Node g1 with 2 GPUs: `old` on GPU 0, `older` on GPU 1; `need` (1 GPU) fits nowhere."""
    return state_with([gpu_model("old"), gpu_model("older"), gpu_model("need"), *models],
                      [placed("old", "g1", [0]), placed("older", "g1", [1])])


def seen(demand: dict[str, float], **kw: object) -> Observed:
    base = observed([node("g1").gpus(2).engines("vllm")], demand=demand, since=NOW - 10 * HOUR)
    return replace(base, **kw)  # type: ignore[arg-type]


def evict(state: ClusterState, obs: Observed, need: str = "need") -> list[Eviction]:
    m = state.models[need]
    refusal = place(m, obs.nodes, state.placements.values())
    assert refusal.choice is None, "the scenario must start with no room"
    return evictions(state, obs, NOW, m, refusal=refusal)


def test_the_longest_idle_replica_makes_room_and_says_so() -> None:
    state = two_gpu_fleet()
    got = evict(state, seen({"old": NOW - 10 * MIN, "older": NOW - 42 * MIN, "need": NOW}))
    assert got == [Eviction("older-r2", "older", "evicted: idle 42 min, made room for need", 42 * MIN, "need")]


def test_a_model_in_use_is_never_evicted() -> None:
    state = two_gpu_fleet()
    # Asked for a minute ago: in use (under scaling.evict_after_idle_s, 5 min by default).
    assert [e.model for e in evict(state, seen({"old": NOW - MIN, "older": NOW - 30 * MIN, "need": NOW}))] \
        == ["older"]
    assert evict(state, seen({"old": NOW - MIN, "older": NOW - 2 * MIN, "need": NOW})) == []
    # Requests in flight (a long generation): in use, however long ago it was last asked for.
    busy = seen({"old": NOW - 50 * MIN, "older": NOW - 90 * MIN, "need": NOW}, outstanding={"older": 1})
    assert [e.model for e in evict(state, busy)] == ["old"]


def test_the_idle_threshold_is_a_setting() -> None:
    state = state_with([gpu_model("old"), gpu_model("older"), gpu_model("need")],
                       [placed("old", "g1", [0]), placed("older", "g1", [1])],
                       {"scaling.evict_after_idle_s": 3600})
    assert evict(state, seen({"old": NOW - 10 * MIN, "older": NOW - 42 * MIN, "need": NOW})) == []
    assert [e.model for e in evict(state, seen({"old": NOW - 10 * MIN, "older": NOW - 61 * MIN, "need": NOW}))] \
        == ["older"]


def test_unknown_demand_is_never_evicted() -> None:
    """Right after a control-plane restart no use has been heard: a zero or missing timestamp
    would make every replica the idlest; unknown ones are not candidates at all."""
    state = two_gpu_fleet()
    fresh = replace(seen({"need": NOW}), since=NOW - 5 * MIN)
    assert evict(state, fresh) == []
    # Heard for a whole idle timeout without a request: idle since the leader took office.
    heard = replace(seen({"need": NOW}), since=NOW - 3 * HOUR)
    assert [e.model for e in evict(state, heard)] == ["old"]  # equally idle: by name


def test_always_on_models_and_a_models_minimum_are_never_evicted() -> None:
    # An always-on model's replica above its minimum (added under load) stays too.
    always = state_with([model("old").vllm().gpus(1).replicas(1, 2), gpu_model("need")],
                        [placed("old", "g1", [0]), placed("old", "g1", [1])])
    assert evict(always, seen({"need": NOW})) == []
    kept_warm = state_with([gpu_model("old").replicas(1, 2), gpu_model("need")],
                           [placed("old", "g1", [0]), placed("old", "g1", [1])])
    # Of an on-demand model kept warm (replicas.min = 1), only what is above the minimum may go:
    # the newest replica.
    assert [e.replica_id for e in evict(kept_warm, seen({"old": NOW - 5 * HOUR, "need": NOW}))] == ["old-r2"]


def test_nothing_is_evicted_when_room_would_not_help() -> None:
    state = two_gpu_fleet(gpu_model("huge", gpus=4))
    assert evict(state, seen({"old": NOW - HOUR, "older": NOW - HOUR, "huge": NOW}), need="huge") == []


def test_both_go_when_the_need_takes_both() -> None:
    state = two_gpu_fleet(gpu_model("pair", gpus=2))
    got = evict(state, seen({"old": NOW - 20 * MIN, "older": NOW - 42 * MIN, "pair": NOW}), need="pair")
    assert [(e.model, e.why) for e in got] == [("older", "evicted: idle 42 min, made room for pair"),
                                               ("old", "evicted: idle 20 min, made room for pair")]


def test_an_idle_model_does_not_push_out_another() -> None:
    state = two_gpu_fleet()
    assert evict(state, seen({"old": NOW - 50 * MIN, "older": NOW - 90 * MIN, "need": NOW - 20 * MIN})) == []


def test_the_node_whose_freshest_victim_is_stalest_is_chosen() -> None:
    """n1's two replicas: idle 3 h and 6 min; n2's: 50 and 40 min. A 2-GPU model must empty one
    node: n2, because evicting on n1 would stop a replica used 6 minutes ago."""
    models = [gpu_model(n) for n in ("a", "b", "c", "d")] + [gpu_model("pair", gpus=2)]
    state = state_with(models, [placed("a", "n1", [0]), placed("b", "n1", [1]),
                                placed("c", "n2", [0]), placed("d", "n2", [1])])
    fleet = [node("n1").gpus(2).engines("vllm"), node("n2").gpus(2).engines("vllm")]
    obs = observed(fleet, demand={"a": NOW - 3 * HOUR + 1, "b": NOW - 6 * MIN, "c": NOW - 50 * MIN,
                                  "d": NOW - 40 * MIN, "pair": NOW}, since=0.0)
    got = evict(state, obs, need="pair")
    assert [e.model for e in got] == ["c", "d"]
    # The same input gives the same answer.
    assert evict(state, obs, need="pair") == got


def test_placements_of_this_pass_count_and_are_never_victims() -> None:
    """The caller passes the placements as its pass has them: what it just removed is free, what
    it just placed is taken (and, pending, is no candidate)."""
    state = two_gpu_fleet()
    obs = seen({"old": NOW - 10 * MIN, "older": NOW - 42 * MIN, "need": NOW})
    without_older = [p for p in state.placements.values() if p.model != "older"]
    assert evictions(state, obs, NOW, state.models["need"], without_older) == []  # room already
    pending = replace(state.placements["old-r1"], replica_id="(pending-old-0)")
    got = evictions(state, obs, NOW, state.models["need"], [pending, state.placements["older-r2"]])
    assert [e.replica_id for e in got] == ["older-r2"]


# --- through decide and the reconciler loop ---------------------------------------------------


def test_decide_evicts_the_idlest_and_places_the_model_asked_for() -> None:
    state = two_gpu_fleet()
    obs = replace(seen({"old": NOW - 10 * MIN, "older": NOW - 42 * MIN, "need": NOW}),
                  replicas={"old-r1": replica("old-r1", "g1"), "older-r2": replica("older-r2", "g1")})
    plan = decide(state, obs, NOW)
    why = "evicted: idle 42 min, made room for need"
    assert [e.replica_id for e in plan.evictions] == ["older-r2"]
    assert [(c["op"], c.get("replica_id") or c.get("model"), c.get("reason", c.get("gpus")))
            for c in plan.commands] == [("placement.remove", "older-r2", why), ("placement.add", "need", [1])]
    assert [(a.kind, a.replica_id) for a in plan.actions] == [("stop", "older-r2")]
    # Remembered by the leader, the eviction keeps the evicted model down until asked again.
    after = replace(obs, evicted={"older": (NOW, why)})
    assert desired(state, state.models["older"], after, NOW + 1).count == 0


async def test_the_loop_logs_each_eviction_and_remembers_it(caplog: pytest.LogCaptureFixture) -> None:
    t = [0.0]
    store = store_with([gpu_model("old"), gpu_model("older"), gpu_model("need")],
                       [placed("old", "g1", [0]), placed("older", "g1", [1])])
    hub = AgentHub(clock=lambda: t[0])  # in office since 0: every use since then was heard
    send, _receive = trio.open_memory_channel[dict[str, Any]](100)
    link = hub.connect("g1", send)
    hub.report_inventory(link, node("g1").gpus(2).engines("vllm").build())
    hub.report_replicas(link, [replica("old-r1", "g1"), replica("older-r2", "g1")])
    for model_name, at in (("older", NOW - 42 * MIN), ("old", NOW - 10 * MIN), ("need", NOW)):
        t[0] = at
        hub.note_demand(model_name)
    rec = Reconciler(store, hub, clock=lambda: t[0])
    with caplog.at_level(logging.WARNING, "llmgw.control.reconciler"):
        await rec.run_once()
    assert "replica older-r2 of older evicted: idle 42 min, made room for need" in caplog.text
    assert hub.evicted == {"older": (NOW, "evicted: idle 42 min, made room for need")}
    assert sorted(p.model for p in store.snapshot().placements.values()) == ["need", "old"]
    t[0] = NOW + 1
    again = await rec.run_once()  # the evicted model is not placed again: nobody asked since
    assert again.evictions == () and "older" not in again.unplaceable
    assert sorted(p.model for p in store.snapshot().placements.values()) == ["need", "old"]


def test_the_evicted_model_says_why_it_has_no_replica() -> None:
    state = state_with([gpu_model("older")])
    why = "evicted: idle 42 min, made room for need"
    obs = replace(seen({"older": NOW - 42 * MIN}), evicted={"older": (NOW - 5, why)})
    view = decide(state, obs, NOW).views["older"]
    assert (view.desired, view.state, view.reason) == (0, "absent", f"{why}; a request starts it again")
