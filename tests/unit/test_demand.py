"""Demand, idle and load (`llmgw.reconcile.demand.desired`), pure with an explicit `now`; the
leader's memory of load (`AgentHub.note_load`) and the routers' reports of requests in flight."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import trio
import trio.testing

from llmgw.cli.ctl.render.fleet import render_status
from llmgw.control.gateway_stream import GatewayHub
from llmgw.control.hub import AgentHub
from llmgw.domain import summary
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import Endpoint, ModelRoute, Observed
from llmgw.domain.state import ClusterState
from llmgw.domain.timeouts import TIMEOUTS
from llmgw.gateway.follower import JudgeFailures, _report
from llmgw.gateway.router import Router
from llmgw.reconcile import decide
from llmgw.reconcile.demand import desired, idle_for, idle_json, idle_words
from llmgw.testing import MemoryStore
from llmgw.testing.builders import cpu_node, model, observed, placed, replica, state_with
from llmgw.wire import protocol

NOW = 10_000.0
IDLE = 1800.0  # longer than scale_down_delay_s: the demand rule, not the load rule, is what holds


@pytest.fixture
def clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


def old_rule(state: ClusterState, m: ModelDef, seen: Observed, now: float) -> int:
    """`desired_replicas` before this change: missing demand read as no demand."""
    if m.mode == "always":
        return m.replicas_min
    asked = seen.demand.get(m.name)
    wanted = asked is not None and now - asked < m.idle_timeout_s
    return max(m.replicas_min, 1 if wanted else 0)


def lazy_running() -> ClusterState:
    return state_with([model("lazy").on_demand(idle_timeout_s=IDLE)], [placed("lazy", "a")])


def after_restart(took_office: float, **kw: Any) -> Observed:
    """What a leader that took office at `took_office` sees: its agent re-attached and reports the
    replica ready; no gateway has reported a use to it yet (its demand map starts empty)."""
    return replace(observed([cpu_node("a")], [replica("lazy-r1", "a")], since=took_office), **kw)


# --- unknown is not idle -----------------------------------------------------------------------


def test_a_control_restart_no_longer_stops_every_ready_on_demand_replica() -> None:
    state, seen = lazy_running(), after_restart(NOW)
    lazy = state.models["lazy"]
    # The old rule: nobody was heard asking, so it wanted nothing, and decide stopped the replica.
    assert old_rule(state, lazy, seen, NOW + 5) == 0
    # Now: demand is unknown until a whole idle timeout has been heard; what runs is kept.
    want = desired(state, lazy, seen, NOW + 5)
    assert (want.count, want.unknown) == (1, True)
    assert "demand unknown" in want.reason and "keeping the 1 that run" in want.reason
    assert desired(state, lazy, seen, NOW + 2 * TIMEOUTS.scale_down_delay_s).count == 1
    plan = decide(state, seen, NOW + 5)
    assert not [c for c in plan.commands if c["op"] == "placement.remove"], plan.commands
    assert not [a for a in plan.actions if a.kind == "stop"]


def test_after_a_whole_idle_timeout_unheard_the_model_is_idle() -> None:
    state, seen = lazy_running(), after_restart(NOW)
    assert desired(state, state.models["lazy"], seen, NOW + IDLE - 0.1).count == 1
    known = desired(state, state.models["lazy"], seen, NOW + IDLE)
    assert (known.count, known.unknown) == (0, False)
    assert "not asked for since this leader took office 30 min ago" in known.reason
    removes = [c for c in decide(state, seen, NOW + IDLE).commands if c["op"] == "placement.remove"]
    assert [(c["replica_id"], c["reason"]) for c in removes] == [("lazy-r1", "scaled down")]


def test_a_use_heard_after_the_restart_counts_from_then() -> None:
    state = lazy_running()
    seen = after_restart(NOW, demand={"lazy": NOW + 60})
    assert desired(state, state.models["lazy"], seen, NOW + 60 + IDLE - 1).count == 1
    idle = desired(state, state.models["lazy"], seen, NOW + 60 + IDLE)
    assert (idle.count, idle.unknown) == (0, False) and "idle for 30 min" in idle.reason


def test_unknown_demand_starts_nothing_and_keeps_only_what_runs() -> None:
    lazy = model("lazy").on_demand(idle_timeout_s=IDLE).replicas(0, 3).build()
    state = state_with([lazy], [placed("lazy", "a"), placed("lazy", "a"), placed("lazy", "b")])
    # r1 runs; r2 the agent no longer reports (its engine died); r3 is on a node not heard from yet.
    seen = observed([cpu_node("a")], [replica("lazy-r1", "a")], since=NOW)
    want = desired(state, lazy, seen, NOW + 1)
    assert (want.count, want.unknown) == (2, True)
    # Past the node's grace period its replica no longer counts.
    assert desired(state, lazy, seen, NOW + TIMEOUTS.lost_node_grace_s).count == 1
    nothing = state_with([lazy])
    assert desired(nothing, lazy, observed([cpu_node("a")], since=NOW), NOW + 1).count == 0


def test_idle_time_is_unknown_until_heard_long_enough() -> None:
    lazy = model("lazy").on_demand(idle_timeout_s=IDLE).build()
    fresh = observed([cpu_node("a")], since=NOW)
    assert idle_for(lazy, fresh, NOW + 10) is None
    assert (idle_json(None), idle_words(None)) == (-1.0, "-")
    assert idle_for(lazy, fresh, NOW + IDLE) == IDLE  # not asked since the leader took office
    asked = replace(fresh, demand={"lazy": NOW + 5})
    assert idle_for(lazy, asked, NOW + 65) == 60.0
    assert (idle_json(60.0), idle_words(60.0)) == (60.0, "60 s")
    busy = replace(asked, outstanding={"lazy": 2})
    assert idle_for(lazy, busy, NOW + 5000) == 0.0


# --- on-demand: asked, idle, evicted ----------------------------------------------------------


def test_on_demand_is_wanted_while_asked_for_or_in_flight() -> None:
    state = lazy_running()
    lazy = state.models["lazy"]
    seen = observed([cpu_node("a")], [replica("lazy-r1", "a")], demand={"lazy": NOW - 100})
    want = desired(state, lazy, seen, NOW)
    assert want.count == 1 and "asked for 100 s ago" in want.reason
    long_ago = replace(seen, demand={"lazy": NOW - 5000})
    assert desired(state, lazy, long_ago, NOW).count == 0
    # A request still running (a long generation) keeps it, however old the last ask.
    running = replace(long_ago, outstanding={"lazy": 1})
    assert desired(state, lazy, running, NOW).count == 1


def test_an_evicted_model_wants_nothing_until_asked_again() -> None:
    state = lazy_running()
    lazy = state.models["lazy"]
    why = "evicted: idle 42 min, made room for big"
    seen = replace(observed([cpu_node("a")], demand={"lazy": NOW - 200}), evicted={"lazy": (NOW - 10, why)})
    want = desired(state, lazy, seen, NOW)
    assert want.count == 0 and want.reason.startswith(why) and "a request starts it again" in want.reason
    asked_again = replace(seen, demand={"lazy": NOW - 5})
    assert desired(state, lazy, asked_again, NOW).count == 1


def test_serving_stopped_wants_nothing_whatever_the_demand() -> None:
    state = state_with([model("lazy").on_demand()], settings={"serving.stopped": True})
    seen = replace(observed([cpu_node("a")], demand={"lazy": NOW}), outstanding={"lazy": 50})
    assert desired(state, state.models["lazy"], seen, NOW).count == 0


# --- load --------------------------------------------------------------------------------------


def loaded(mode: str = "always") -> ClusterState:
    b = model("chat").replicas(1, 4)
    if mode == "on-demand":
        b = b.on_demand(idle_timeout_s=IDLE).replicas(0, 4)
    return state_with([b], [placed("chat", "a")])


def test_replicas_are_added_under_load_up_to_the_maximum() -> None:
    state = loaded()
    chat = state.models["chat"]
    base = observed([cpu_node("a")], [replica("chat-r1", "a")])
    assert desired(state, chat, base, NOW).count == 1
    assert desired(state, chat, replace(base, outstanding={"chat": 8}), NOW).count == 1
    busy = desired(state, chat, replace(base, outstanding={"chat": 9}), NOW)
    assert busy.count == 2 and "under load: 9 requests in flight" in busy.reason
    # The peak of the window counts, not only this instant.
    assert desired(state, chat, replace(base, outstanding={"chat": 1}, peak={"chat": 20}), NOW).count == 3
    capped = desired(state, chat, replace(base, outstanding={"chat": 400}), NOW)
    assert capped.count == 4 and "(replicas.max = 4)" in capped.reason


def test_the_threshold_is_a_setting() -> None:
    state = state_with([model("chat").replicas(1, 4)], settings={"scaling.outstanding_per_replica": 2})
    seen = replace(observed([cpu_node("a")]), outstanding={"chat": 5})
    assert desired(state, state.models["chat"], seen, NOW).count == 3


def test_load_counts_for_an_on_demand_model_too() -> None:
    state = loaded("on-demand")
    seen = replace(observed([cpu_node("a")], [replica("chat-r1", "a")], demand={"chat": NOW - 1}),
                   outstanding={"chat": 17})
    assert desired(state, state.models["chat"], seen, NOW).count == 3


def test_replicas_added_under_load_are_held_while_the_load_is_unknown() -> None:
    state = state_with([model("chat").replicas(1, 4)], [placed("chat", "a"), placed("chat", "a"),
                                                        placed("chat", "a")])
    chat = state.models["chat"]
    seen = observed([cpu_node("a")], [replica(f"chat-r{i}", "a") for i in (1, 2, 3)], since=NOW)
    held = desired(state, chat, seen, NOW + 10)
    assert (held.count, held.unknown) == (3, True) and "load unknown" in held.reason
    after = desired(state, chat, seen, NOW + TIMEOUTS.scale_down_delay_s)
    assert (after.count, after.unknown) == (1, False)
    # A smaller maximum is the definition speaking, not the load: it is obeyed at once.
    smaller = model("chat").replicas(1, 2).build()
    assert desired(state, smaller, seen, NOW + 10).count == 2


# --- the leader's memory of load ------------------------------------------------------------------


def test_the_hub_keeps_the_peak_of_the_last_scale_down_delay() -> None:
    t = [0.0]
    hub = AgentHub(clock=lambda: t[0])
    window = TIMEOUTS.scale_down_delay_s
    hub.note_load({"chat": 20, "idle": 0})
    t[0] = 10.0
    hub.note_load({"chat": 5})
    seen = hub.observed()
    assert seen.outstanding == {"chat": 5} and seen.peak == {"chat": 20}
    t[0] = window + 0.5  # the 20 has left the window; the 5 has not
    hub.note_load({})
    assert hub.observed().peak == {"chat": 5} and hub.observed().outstanding == {}
    t[0] = window + 11
    hub.note_load({})
    assert hub.observed().peak == {}
    hub.note_eviction("lazy", "evicted: idle 6 min, made room for chat")
    assert hub.observed().evicted == {"lazy": (window + 11, "evicted: idle 6 min, made room for chat")}
    hub.note_demand("lazy")  # asked for again: the eviction no longer speaks for it
    assert hub.observed().evicted == {}
    hub.note_eviction("lazy", "evicted: idle 6 min, made room for chat")
    hub.note_load({"chat": 3})
    hub.take_office()  # a new term knows nothing of the last one's load or evictions
    seen = hub.observed()
    assert (seen.outstanding, seen.peak, seen.evicted, seen.since) == ({}, {}, {}, window + 11)


async def test_gateways_report_requests_in_flight_and_the_leader_sums_them(clock: trio.testing.MockClock) -> None:
    hub = GatewayHub(MemoryStore(), "m1", clock=lambda: 0.0)
    one, two = hub.connect("gw1", "10.0.0.1"), hub.connect("gw2", "10.0.0.2")
    hub.report_demand(one, {"type": "demand", "outstanding": {"chat": 3, "lazy": 1}})
    hub.report_demand(two, {"type": "demand", "outstanding": {"chat": 4, "bad": "x", "neg": -2}})
    assert hub.outstanding() == {"chat": 7, "lazy": 1}
    hub.report_demand(one, {"type": "demand", "last_used_age": {}})  # no word on load: the last one holds
    assert hub.outstanding() == {"chat": 7, "lazy": 1}
    hub.report_demand(one, {"type": "demand", "outstanding": {}})
    assert hub.outstanding() == {"chat": 4}
    hub.disconnect(two)
    assert hub.outstanding() == {}


class _Socket:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def send_message(self, text: str) -> None:
        self.sent.append(protocol.loads(text))


async def test_a_router_reports_its_requests_in_flight_and_waiting(clock: trio.testing.MockClock) -> None:
    router = Router()
    router.update_routes({"chat": ModelRoute("chat", "chat", "ready", (Endpoint("chat-r1", "http://x"),)),
                          "cold": ModelRoute("cold", "chat", "starting")})
    ws = _Socket()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_report, ws, router, TIMEOUTS, JudgeFailures(1.0))  # type: ignore[arg-type]
        await trio.sleep(1)
        assert ws.sent[0]["outstanding"] == {}
        async with router.acquire("chat", deadline=trio.current_time() + 60):
            async with router.acquire("chat", deadline=trio.current_time() + 60):
                nursery.start_soon(_wait_for_cold, router)
                await trio.sleep(1)
                assert router.outstanding() == {"chat": 2, "cold": 1}
                assert [m["outstanding"] for m in ws.sent if "outstanding" in m][-1] == {"chat": 2, "cold": 1}
        await trio.sleep(1)
        assert [m["outstanding"] for m in ws.sent if "outstanding" in m][-1] == {"cold": 1}
        nursery.cancel_scope.cancel()


async def _wait_for_cold(router: Router) -> None:
    async with router.acquire("cold", deadline=trio.current_time() + 3600):
        pass  # pragma: no cover - the route never turns ready here


# --- which wins: a short idle timeout or the load's scale-down delay ---------------------------------


SHORT = 10.0  # an idle timeout far shorter than scale_down_delay_s


def short_idle(since: float = 0.0, asked: float = NOW - 30, peak: int = 1) -> tuple[ClusterState, Observed]:
    """An on-demand model with `idle_timeout_s = 10`, last asked for 30 s ago by one request that
    has finished: the leader's memory of load still holds that request as the window's peak."""
    state = state_with([model("quick").sim().on_demand(idle_timeout_s=SHORT)], [placed("quick", "a")])
    seen = observed([cpu_node("a")], [replica("quick-r1", "a")], demand={"quick": asked}, since=since)
    return state, replace(seen, peak={"quick": peak})


def test_a_short_idle_timeout_stops_the_replica_before_the_scale_down_delay() -> None:
    assert SHORT < TIMEOUTS.scale_down_delay_s
    state, seen = short_idle()
    quick = state.models["quick"]
    want = desired(state, quick, seen, NOW)
    assert (want.count, want.unknown) == (0, False) and "idle for 30 s (idle timeout 10 s)" in want.reason
    plan = decide(state, seen, NOW)
    assert [c["op"] for c in plan.commands if c["op"] == "placement.remove"] == ["placement.remove"]
    # Even a busy window does not keep an idle model: the load speaks only while it is asked for.
    assert desired(state, quick, replace(seen, peak={"quick": 40}), NOW).count == 0
    # Nor does a leader that has not heard the load long enough, once the model is known to be idle.
    state, fresh_leader = short_idle(since=NOW - 20, asked=NOW - 15)
    assert desired(state, quick, fresh_leader, NOW).count == 0
    # Still asked for: the load's peak holds the extra replicas for scale_down_delay_s, as before.
    state, busy = short_idle(asked=NOW - 5, peak=20)
    assert desired(state, replace(quick, replicas_max=4), busy, NOW).count == 3


def test_status_says_the_idle_timeout_and_that_is_when_it_stops() -> None:
    state, seen = short_idle()
    rows = summary.summarize(state, seen, None, {}, NOW).to_doc()["idle"]
    assert [(r["model"], r["idle_s"], r["idle_timeout_s"]) for r in rows] == [("quick", 30.0, SHORT)]
    page = render_status({"idle": rows})
    line = next(line for line in page.splitlines() if line.startswith("quick "))
    assert line.split()[:4] == ["quick", "on-demand", "1", "0"] and line.split()[4:] == ["30", "s", "10", "s"]
    # ... and what it says is what happens: at its idle timeout, not at the scale-down delay.
    state, seen = short_idle(asked=NOW - SHORT + 1)
    assert desired(state, state.models["quick"], seen, NOW).count == 1
    assert desired(state, state.models["quick"], seen, NOW + 1).count == 0
