"""Fast wake (`reconcile/sleep.py`, issue 25 point 4): an idle on-demand model with `sleep_level` sleeps instead of
stopping, a request wakes it before anything starts cold, a model that wants its GPUs evicts it (stops it). Pure
`decide` by example, the definition's checks, the command and the sim engine's sleep endpoints."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import httpx
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.domain import codec, commands, levels
from llmgw.domain.model import DefinitionError, ModelDef
from llmgw.domain.observed import Observed
from llmgw.domain.state import ClusterState
from llmgw.engines import launch_spec
from llmgw.engines.sim.app import SimOptions, make_app
from llmgw.reconcile import Plan, decide
from llmgw.testing.builders import ModelBuilder, model, node, observed, placed, replica, state_with

NOW = 100_000.0
HOUR = 3600.0
IDLE = 600.0


def sleepy(name: str = "lazy", level: int = 1) -> ModelBuilder:
    b = model(name).vllm().gpus(1).on_demand(idle_timeout_s=IDLE)
    b._doc["sleep_level"] = level
    return b


def seen(replicas: list[Any], demand: dict[str, float], **kw: Any) -> Observed:
    base = observed([node("g1").gpus(1).engines("vllm")], replicas, demand=demand, since=NOW - 10 * HOUR)
    return replace(base, **kw)


def ops(plan: Plan) -> list[tuple[Any, ...]]:
    return [(c["op"], c.get("replica_id", c.get("model")), c.get("asleep", c.get("reason")))
            for c in plan.commands]


def acts(plan: Plan) -> list[tuple[str, str, int]]:
    return [(a.kind, a.replica_id, a.level) for a in plan.actions]


def commit(state: ClusterState, plan: Plan) -> ClusterState:
    for c in plan.commands:
        state, _ = commands.apply(state, c)
    return state


def lazy_ready(level: int = 1, *others: ModelBuilder) -> ClusterState:
    return state_with([sleepy("lazy", level), *others], [placed("lazy", "g1", [0])])


# --- the definition ---------------------------------------------------------------------------


def test_sleep_level_is_checked_and_refused_for_engines_that_cannot_sleep() -> None:
    assert sleepy(level=2).build().sleep_level == 2
    assert ModelDef.from_doc(model("s").on_demand().doc() | {"sleep_level": 1}).sleep_level == 1  # the sim models it
    with pytest.raises(DefinitionError, match="engine llama.cpp cannot sleep"):
        ModelDef.from_doc(model("l").llamacpp().on_demand().doc() | {"sleep_level": 1})
    with pytest.raises(DefinitionError, match="applies to on-demand models"):
        ModelDef.from_doc(model("a").vllm().doc() | {"sleep_level": 1})
    with pytest.raises(DefinitionError, match="must be 0"):
        ModelDef.from_doc(sleepy().doc() | {"sleep_level": 3})
    with pytest.raises(DefinitionError, match="must be 0"):
        ModelDef.from_doc(sleepy().doc() | {"sleep_level": True})


def test_sleep_level_is_a_later_field_and_a_new_launch() -> None:
    plain, slept = model("lazy").vllm().on_demand().build(), sleepy().build()
    assert "sleep_level" not in plain.to_doc() and ModelDef.from_doc(slept.to_doc()) == slept
    assert codec.later_level(plain) == 1 and codec.later_level(slept) == 3
    # vLLM starts with sleep mode on or not: a change of it replaces replicas (level 1 <-> 2 does not).
    assert plain.launch_hash() != slept.launch_hash() == sleepy(level=2).build().launch_hash()
    assert levels.op_level("placement.sleep") == 3


def test_a_vllm_model_that_may_sleep_starts_with_sleep_mode_and_its_dev_endpoints(tmp_path: Any) -> None:
    weights = tmp_path / "m"
    weights.mkdir()
    (weights / "config.json").write_text("{}")
    fake = tmp_path / "vllm"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    spec = launch_spec("vllm", model="lazy", role="chat", source=str(weights), host="127.0.0.1", port=8000, args=[],
                       devices=["GPU-1"], environ={"LLMGW_VLLM": str(fake)}, sleep_mode=True)
    assert "--enable-sleep-mode" in spec.argv and spec.env["VLLM_SERVER_DEV_MODE"] == "1"
    plain = launch_spec("vllm", model="lazy", role="chat", source=str(weights), host="127.0.0.1", port=8000,
                        args=[], devices=["GPU-1"], environ={"LLMGW_VLLM": str(fake)})
    assert "--enable-sleep-mode" not in plain.argv and "VLLM_SERVER_DEV_MODE" not in plain.env


# --- decide -----------------------------------------------------------------------------------


def test_an_idle_model_that_may_sleep_sleeps_instead_of_stopping() -> None:
    state = lazy_ready(2)
    idle = seen([replica("lazy-r1", "g1")], {"lazy": NOW - IDLE})
    plan = decide(state, idle, NOW)
    assert ops(plan) == [("placement.sleep", "lazy-r1", True)]
    assert acts(plan) == [("sleep", "lazy-r1", 2)]
    assert plan.actions[0].message() == {"type": "sleep_replica", "replica_id": "lazy-r1", "level": 2}
    assert plan.views["lazy"].state == "absent" and "asleep (sleep level 2)" in plan.views["lazy"].reason
    assert plan.routes["lazy"].endpoints == ()  # it serves nothing from now
    # Asleep and reported sleeping: nothing more to do (no stop, no start).
    state = commit(state, plan)
    assert state.placements["lazy-r1"].asleep
    quiet = decide(state, seen([replica("lazy-r1", "g1", "sleeping")], {"lazy": NOW - IDLE}), NOW + 1)
    assert ops(quiet) == [] and acts(quiet) == []
    # Without sleep_level: stopped as before (the test fails without the feature: it would also be stopped above).
    plain = state_with([model("lazy").vllm().gpus(1).on_demand(idle_timeout_s=IDLE)], [placed("lazy", "g1", [0])])
    assert ops(decide(plain, idle, NOW)) == [("placement.remove", "lazy-r1", "scaled down")]


def test_a_model_still_asked_for_or_a_stopped_service_does_not_sleep() -> None:
    state = lazy_ready()
    busy = seen([replica("lazy-r1", "g1")], {"lazy": NOW - 5})
    assert ops(decide(state, busy, NOW)) == []
    stopped = state_with([sleepy()], [placed("lazy", "g1", [0])], {"serving.stopped": True})
    assert ops(decide(stopped, seen([replica("lazy-r1", "g1")], {"lazy": NOW - IDLE}), NOW)) \
        == [("placement.remove", "lazy-r1", "scaled down")]


def test_llmgw_stop_stops_an_asleep_replica_too() -> None:
    state = commit(lazy_ready(), decide(lazy_ready(), seen([replica("lazy-r1", "g1")], {"lazy": NOW - IDLE}), NOW))
    state, _ = commands.apply(state, commands.put_setting("serving.stopped", True, NOW))
    plan = decide(state, seen([replica("lazy-r1", "g1", "sleeping")], {"lazy": NOW - IDLE}), NOW + 1)
    assert ops(plan) == [("placement.remove", "lazy-r1", "scaled down")] and acts(plan) == [("stop", "lazy-r1", 0)]


def test_a_request_wakes_the_asleep_replica_before_anything_is_placed() -> None:
    state = commit(lazy_ready(), decide(lazy_ready(), seen([replica("lazy-r1", "g1")], {"lazy": NOW - IDLE}), NOW))
    asked = seen([replica("lazy-r1", "g1", "sleeping")], {"lazy": NOW + 10})
    plan = decide(state, asked, NOW + 10)
    assert ops(plan) == [("placement.sleep", "lazy-r1", False)]  # no placement.add: no cold start
    assert acts(plan) == [("wake", "lazy-r1", 0)]
    assert plan.views["lazy"].state == "starting"
    assert plan.views["lazy"].activation is not None and plan.views["lazy"].activation.phase == "waking"
    assert plan.views["lazy"].starting == 1  # being woken: starting (no alarm says it is down)
    state = commit(state, plan)
    # The agent reports it waking (starting, phase `waking`), then ready: it serves.
    waking = seen([replace(replica("lazy-r1", "g1", "starting"), phase="waking")], {"lazy": NOW + 10})
    during = decide(state, waking, NOW + 11)
    assert ops(during) == [] and acts(during) == []
    assert during.views["lazy"].activation is not None and during.views["lazy"].activation.phase == "waking"
    ready = decide(state, seen([replica("lazy-r1", "g1")], {"lazy": NOW + 10}), NOW + 12)
    assert ready.views["lazy"].state == "ready" and [e.replica_id for e in ready.routes["lazy"].endpoints] \
        == ["lazy-r1"]


def test_a_model_that_wants_the_gpu_evicts_the_asleep_replica_which_is_stopped() -> None:
    other = model("need").vllm().gpus(1).on_demand(idle_timeout_s=IDLE)
    state = commit(lazy_ready(1, other),
                   decide(lazy_ready(1, other), seen([replica("lazy-r1", "g1")], {"lazy": NOW - IDLE}), NOW))
    assert state.placements["lazy-r1"].asleep
    wanted = seen([replica("lazy-r1", "g1", "sleeping")], {"lazy": NOW - IDLE, "need": NOW + 5})
    plan = decide(state, wanted, NOW + 5)
    assert [o[:2] for o in ops(plan)] == [("placement.remove", "lazy-r1"), ("placement.add", "need")]
    assert ("stop", "lazy-r1", 0) in acts(plan)
    assert plan.evictions[0].replica_id == "lazy-r1"


def test_an_idle_replica_whose_gpu_is_wanted_now_is_stopped_not_slept() -> None:
    other = model("need").vllm().gpus(1).on_demand(idle_timeout_s=IDLE)
    wanted = seen([replica("lazy-r1", "g1")], {"lazy": NOW - IDLE, "need": NOW})
    plan = decide(lazy_ready(1, other), wanted, NOW)
    assert [o[:2] for o in ops(plan)] == [("placement.remove", "lazy-r1"), ("placement.add", "need")]
    assert ("stop", "lazy-r1", 0) in acts(plan) and not [a for a in plan.actions if a.kind == "sleep"]


def test_the_asleep_replica_is_evicted_before_an_awake_one() -> None:
    # Asked for 30 min ago: one replica still wanted (idle timeout 2 h), the other asleep; both may be evicted.
    two = model("lazy").vllm().gpus(1).on_demand(idle_timeout_s=2 * HOUR).replicas(0, 2)
    two._doc["sleep_level"] = 1
    state = state_with([two, model("need").vllm().gpus(1).on_demand(idle_timeout_s=IDLE)],
                       [placed("lazy", "g1", [0], at=1.0), placed("lazy", "g1", [1], at=2.0)])
    state = replace(state, placements={**state.placements,
                                       "lazy-r1": replace(state.placements["lazy-r1"], asleep=True)})
    fleet = replace(seen([replica("lazy-r1", "g1", "sleeping"), replica("lazy-r2", "g1")],
                         {"lazy": NOW - 30 * 60, "need": NOW}),
                    nodes={"g1": node("g1").gpus(2).engines("vllm").build()})
    plan = decide(state, fleet, NOW)
    # The older, asleep one goes, though the newest would go first otherwise; the awake one serves on.
    assert [o[1] for o in ops(plan) if o[0] == "placement.remove"] == ["lazy-r1"]
    assert plan.routes["lazy"].state == "ready"


def test_an_asleep_replica_whose_engine_ended_is_removed_without_a_failure() -> None:
    state = commit(lazy_ready(), decide(lazy_ready(), seen([replica("lazy-r1", "g1")], {"lazy": NOW - IDLE}), NOW))
    failed = seen([replica("lazy-r1", "g1", "failed", error="engine /sleep failed: answered HTTP 404")],
                  {"lazy": NOW - IDLE})
    plan = decide(state, failed, NOW + 1)
    assert ops(plan) == [("placement.remove", "lazy-r1", "ended while asleep: engine /sleep failed: answered HTTP 404")]
    assert commit(state, plan).model_health("lazy").failures_in_row == 0


def test_the_sleep_command_is_idempotent_and_checked() -> None:
    state = lazy_ready()
    once, result = commands.apply(state, commands.sleep_placement("lazy-r1", True, NOW))
    assert result == {"changed": True} and once.placements["lazy-r1"].asleep
    assert commands.apply(once, commands.sleep_placement("lazy-r1", True, NOW))[1] == {"changed": False}
    assert commands.apply(once, commands.sleep_placement("gone-r9", False, NOW))[1] == {"changed": False}
    with pytest.raises(commands.CommandError):
        commands.check(commands.make("placement.sleep", NOW, replica_id="lazy-r1", asleep="yes"))
    # Stored: the flag survives a snapshot, and a placement awake writes no `asleep` key (an older member reads it).
    assert codec.state_from_json(codec.state_to_json(once)) == once
    assert "asleep" not in codec.state_to_json(state)["state"]["placements"]["lazy-r1"]
    assert codec.state_to_json(once)["state"]["placements"]["lazy-r1"]["asleep"] is True


# --- the sim engine ---------------------------------------------------------------------------


async def test_the_sim_sleeps_at_once_and_wakes_after_its_wake_delay() -> None:
    app = make_app(SimOptions(host="127.0.0.1", port=0, model="lazy", wake_delay=0.05))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sim") as http:
        chat = {"messages": [{"role": "user", "content": "hi"}]}
        assert (await http.post("/v1/chat/completions", json=chat)).status_code == 200
        assert (await http.post("/sleep?level=2")).status_code == 200
        assert (await http.get("/is_sleeping")).json() == {"is_sleeping": True}
        asleep = await http.post("/v1/chat/completions", json=chat)
        assert asleep.status_code == 503 and asleep.json()["error"]["code"] == "engine_asleep"
        assert (await http.get("/health")).status_code == 200  # alive: its process runs
        started = trio.current_time()
        assert (await http.post("/wake_up")).status_code == 200
        assert trio.current_time() - started >= 0.05
        assert (await http.get("/is_sleeping")).json() == {"is_sleeping": False}
        assert (await http.post("/v1/chat/completions", json=chat)).status_code == 200
        assert (await http.post("/sleep?level=3")).status_code == 400


def test_the_agent_protocol_carries_sleep_and_wake() -> None:
    from llmgw.wire import protocol_agent as pa
    from llmgw.wire.protocol import ProtocolError

    assert pa.read_down({"type": "sleep_replica", "replica_id": "lazy-r1", "level": 2}) == pa.SleepReplica("lazy-r1", 2)
    assert pa.read_down({"type": "wake_replica", "replica_id": "lazy-r1"}) == pa.WakeReplica("lazy-r1")
    for level in (0, 3, "1", True, None):
        with pytest.raises(ProtocolError, match="level"):
            pa.read_down({"type": "sleep_replica", "replica_id": "lazy-r1", "level": level})
    up = pa.read_up({"type": "replicas", "replicas": [{"replica_id": "lazy-r1", "model": "lazy", "node": "n1",
                                                       "state": "sleeping"}]}, "n1")
    assert isinstance(up, pa.Replicas) and up.replicas[0].state == "sleeping"


def test_ctl_model_show_says_the_model_sleeps_when_idle() -> None:
    from llmgw.cli.ctl.render import render_model

    shown = render_model({**sleepy(level=1).build().to_doc(), "status": {}})
    assert "fast wake" in shown and "sleeps when idle, level 1 (weights kept in CPU RAM); a request wakes it" in shown
    assert "fast wake" not in render_model({**model("plain").build().to_doc(), "status": {}})


# --- a property -------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(
    slots=st.lists(st.tuples(st.booleans(), st.sampled_from(["ready", "sleeping", "starting", "failed", None])),
                   min_size=1, max_size=3),
    asked_ago=st.one_of(st.none(), st.floats(0, 3 * IDLE)),
    others_asked=st.booleans(),
    stopped=st.booleans(),
)
def test_asleep_replicas_are_woken_before_any_is_placed_and_never_both_slept_and_removed(
        slots: list[tuple[bool, str | None]], asked_ago: float | None, others_asked: bool, stopped: bool) -> None:
    lazy = sleepy().replicas(0, 3)
    need = model("need").vllm().gpus(1).on_demand(idle_timeout_s=IDLE)
    state = state_with([lazy, need], [placed("lazy", "g1", [i], at=float(i)) for i in range(len(slots))],
                       {"serving.stopped": stopped})
    placements = dict(state.placements)
    reports = []
    for (asleep_now, report), rid in zip(slots, sorted(placements, key=lambda r: placements[r].placed_at)):
        placements[rid] = replace(placements[rid], asleep=asleep_now)
        if report is not None:
            reports.append(replica(rid, "g1", report, model="lazy"))
    state = replace(state, placements=placements)
    demand = {"lazy": NOW - asked_ago} if asked_ago is not None else {}
    if others_asked:
        demand["need"] = NOW
    fleet = replace(seen(reports, demand), nodes={"g1": node("g1").gpus(3).engines("vllm").build()})
    plan = decide(state, fleet, NOW)
    assert plan == decide(state, fleet, NOW)  # pure
    slept = {c["replica_id"] for c in plan.commands if c["op"] == "placement.sleep" and c["asleep"]}
    woken = {c["replica_id"] for c in plan.commands if c["op"] == "placement.sleep" and not c["asleep"]}
    removed = {c["replica_id"] for c in plan.commands if c["op"] == "placement.remove"}
    assert not slept & removed and not woken & removed and not slept & woken
    after = commit(state, plan)
    still_asleep = [p for p in after.placements.values() if p.model == "lazy" and p.asleep]
    if any(c["op"] == "placement.add" and c["model"] == "lazy" for c in plan.commands):
        assert not still_asleep, "a cold start while an asleep replica could have been woken"
    if stopped:
        assert not still_asleep and not slept, "serving stopped: nothing sleeps"
    # Every sleep or wake committed is told to the agent when its replica is in the state to take it.
    for a in plan.actions:
        if a.kind == "sleep":
            assert after.placements[a.replica_id].asleep and a.level == 1
        if a.kind == "wake":
            assert not after.placements[a.replica_id].asleep
