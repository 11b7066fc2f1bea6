"""Flapping replicas park (docs/operations.md, "Parking and retry"): a replica that serves a moment
and fails again breaks no row of failed starts; readiness counts once it has lasted `stable_ready_s`.
The rule by example, and a property over any sequence of replica lives, through `decide` and a
fake clock and agents (`ReconcileLoop`, driven by hand: each start's fate is the test's)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.domain import commands as C
from llmgw.domain import levels
from llmgw.domain.codec import state_from_json, state_to_json
from llmgw.domain.health import flap_of, flap_words
from llmgw.domain.observed import ReplicaObs
from llmgw.domain.state import ModelHealth
from llmgw.domain.timeouts import TIMEOUTS
from llmgw.reconcile import Plan
from llmgw.testing import MemoryStore
from llmgw.testing.builders import ReconcileLoop, cpu_node, model, store_with

T = TIMEOUTS.stable_ready_s
PARK_AFTER = 5  # health.park_after_failures' default


def flapping_loop(level: int = levels.LEVEL) -> ReconcileLoop:
    """A model of one replica on one node; `level`: the group's store level."""
    store = MemoryStore(replace(store_with([model("flap")]).snapshot(), store_level=level))
    loop = ReconcileLoop(store, [cpu_node("a")])
    loop.outcome = lambda action: None  # each start's fate is the test's (`live`)
    return loop


def placed_now(loop: ReconcileLoop) -> str | None:
    """The model's replica that is placed and not yet reported, waiting out its slot's backoff for it."""
    for _ in range(4):
        waiting = [rid for rid in loop.state.placements if rid not in loop.replicas]
        if waiting:
            return waiting[0]
        loop.tick(dt=TIMEOUTS.start_backoff_max_s)
    return None


def live(loop: ReconcileLoop, ready_s: float | None) -> Plan | None:
    """One start: it fails at once (`ready_s` None), or serves `ready_s` seconds, with a pass at its
    start and at its end, then fails (saying how long it served, as an agent does). The pass that
    counts the failure; None when nothing was placed (the model is parked)."""
    rid = placed_now(loop)
    if rid is None:
        return None
    if ready_s is not None:
        loop.replicas[rid] = ReplicaObs(rid, "flap", "a", "ready", "http://a:1", since=loop.now)
        loop.tick(dt=ready_s)
        loop.tick(dt=0.0)
    loop.replicas[rid] = ReplicaObs(rid, "flap", "a", "failed", error="engine exited with status 4 while serving",
                                    since=loop.now, ready_s=ready_s)
    return loop.tick(dt=0.1)


# --- by example ------------------------------------------------------------------------------------


def test_five_flaps_of_three_seconds_park_the_model_and_say_so():
    """Before: each replica's readiness reset the row, so the model was started again forever."""
    loop = flapping_loop()
    passes = [live(loop, 3.0) for _ in range(PARK_AFTER)]
    health = loop.state.model_health("flap")
    assert health.parked and health.failures_in_row == 5
    assert (health.flaps, health.flap_ready_s) == (5, 3.0)
    view = passes[-1].views["flap"] if passes[-1] else None
    assert view is not None and view.state == "parked"
    assert view.reason.startswith("parked after 5 failed starts in a row (ready for 3 s at most, then failed: "
                                  "5 times): engine exited with status 4 while serving"), view.reason
    assert live(loop, 3.0) is None, "parked: nothing is placed again"


def test_a_replica_that_served_stable_ready_s_breaks_the_row():
    loop = flapping_loop()
    for _ in range(4):
        live(loop, 3.0)
    assert loop.state.model_health("flap").failures_in_row == 4
    live(loop, T)  # it served long enough: its readiness ended the row, its crash starts a new one
    health = loop.state.model_health("flap")
    assert not health.parked and health.failures_in_row == 1 and health.flaps == 0
    for _ in range(3):
        live(loop, 3.0)
    assert not loop.state.model_health("flap").parked, "4 in the new row"
    live(loop, None)
    assert loop.state.model_health("flap").parked


def test_while_it_flaps_the_view_says_so():
    loop = flapping_loop()
    live(loop, 3.0)
    live(loop, 1.0)
    plan = loop.tick(dt=0.1)
    view = plan.views["flap"]
    assert view.reason == ("retrying after 2 failed start(s) (ready for 3 s at most, then failed: 2 times): "
                           "engine exited with status 4 while serving"), view.reason


def test_a_group_below_the_flaps_level_still_parks_without_the_words():
    """A half-upgraded group cannot read a flap's `ready_s`: the leader sends the failure as before
    (a level-1 command), and the flaps park the model all the same."""
    loop = flapping_loop(level=2)
    plans = [live(loop, 3.0) for _ in range(PARK_AFTER)]
    failed = [c for p in plans if p for c in p.commands if c["op"] == "health.start_failed"]
    assert len(failed) == 5 and all("ready_s" not in c and "needs_level" not in c for c in failed)
    health = loop.state.model_health("flap")
    assert health.parked and health.flaps == 0


def test_a_flaps_failure_is_a_level_3_command_and_its_health_round_trips():
    c = C.start_failed("m", "m-r1", "boom", 1.0, slot=0, node="a", ready_s=2.5)
    assert (c["ready_s"], c["needs_level"]) == (2.5, 3)
    assert "needs_level" not in C.start_failed("m", "m-r1", "boom", 1.0)
    loop = flapping_loop()
    live(loop, 2.5)
    s = loop.state
    assert s.model_health("flap") == ModelHealth(1, False, "engine exited with status 4 while serving",
                                                  s.model_health("flap").last_failure_at,
                                                  s.model_health("flap").slots, s.model_health("flap").nodes, 1, 2.5)
    assert state_from_json(state_to_json(s)).model_health("flap") == s.model_health("flap")


def test_what_a_flap_is():
    assert flap_of(None) is None, "it never served: a failed start, not a flap"
    assert flap_of(0.0) == 0.0 and flap_of(T - 1) == T - 1
    assert flap_of(T) is None, "it served long enough: a crash"
    assert flap_words(1, 0.44) == "ready for 0.4 s at most, then failed: once"
    assert flap_words(2, 3.0) == "ready for 3 s at most, then failed: 2 times"
    assert flap_words(5, 42.7) == "ready for 43 s at most, then failed: 5 times"


# --- the property ------------------------------------------------------------------------------------

LIFE = st.one_of(st.none(), st.sampled_from([0.0, 3.0, T - 1, T, T + 100]))


@settings(max_examples=40, deadline=None)
@given(lives=st.lists(LIFE, max_size=12))
def test_it_parks_exactly_when_n_failures_come_with_no_steady_readiness_between_them(lives):
    """Each life: a start that fails at once (None), or serves that long and fails. The model parks
    exactly when `health.park_after_failures` failures come in a row with no readiness of at least
    `stable_ready_s` between them; the row's flaps are counted."""
    loop = flapping_loop()
    row = flaps = 0
    parked = False
    for ready_s in lives:
        if parked:
            assert live(loop, ready_s) is None
            continue
        if ready_s is not None and ready_s >= T:
            row = flaps = 0  # its readiness broke the row before it failed
        row += 1
        flaps += ready_s is not None and ready_s < T
        parked = row >= PARK_AFTER
        live(loop, ready_s)
        health = loop.state.model_health("flap")
        assert (health.parked, health.failures_in_row, health.flaps) == (parked, row, flaps), lives
