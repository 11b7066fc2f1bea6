"""The conditions (llmgw/domain/conditions.py): each kind from a real summary (the reconciler's passes over a
MemoryStore, `summary.summarize`) or a constructed one, each gone once fixed; properties over random summaries:
one per key, sorted, known kinds, and nothing claimed from an unknown (None) value."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from llmgw.control.hub import AgentHub
from llmgw.domain import commands, summary
from llmgw.domain.conditions import CRITICAL, KINDS, SEVERITIES, WARNING, Condition, conditions
from llmgw.domain.judges import Guard, Judge
from llmgw.domain.observed import Observed
from llmgw.domain.state import ClusterState
from llmgw.domain.summary import ClusterPart, ModelRow, NodeRow, Summary
from llmgw.domain.timeouts import TIMEOUTS
from llmgw.testing import MemoryStore
from llmgw.testing.builders import ReconcileLoop, cpu_node, model, store_with

NOW = 10_000.0
GRACE = TIMEOUTS.lost_node_grace_s


def doc_of(loop: ReconcileLoop, cluster: dict[str, Any] | None = None, restarts: dict[str, tuple[float, ...]]
           | None = None) -> Summary:
    plan = loop.decide()
    observed = loop.observed()
    if restarts:
        observed.restarts.update(restarts)
    return summary.summarize(loop.state, observed, plan.views, cluster or {}, loop.now)


# A summary of nothing (no node, no model, no word on the control planes), and its parts replaced.
EMPTY = summary.summarize(ClusterState(), Observed(), None, {})


def summary_with(**parts: Any) -> Summary:
    return replace(EMPTY, **parts)


def node_row(name: str, connected: bool, lost_at: float | None = None) -> NodeRow:
    """A node as the conditions read it: whether it is connected, and since when it is lost."""
    return NodeRow(name, connected, None, None, None, None, None, None, None, None, None, None, None, None, lost_at)


def model_row(**fields: Any) -> ModelRow:
    """A model row: what `fields` says, the rest as a model nobody judged and nothing went wrong with."""
    base: dict[str, Any] = {
        "name": "m", "engine": "sim", "role": "chat", "mode": "always", "desired": None, "ready": None,
        "starting": None, "placed": None, "failed": None, "state": "unknown", "reason": "", "parked": False,
        "unplaceable": None, "satisfied": None, "failures_in_row": 0, "last_error": "", "restarts": 0,
        "restart_storm": False}
    return ModelRow(**{**base, **fields})


def keys(found: list[Condition]) -> set[tuple[str, str]]:
    return {c.key for c in found}


def test_a_healthy_cluster_has_no_condition() -> None:
    loop = ReconcileLoop(store_with([model("a").sim().always()]), [cpu_node("n1", "sim")], now=NOW)
    loop.settle()
    assert conditions(doc_of(loop), loop.now) == []


def test_a_lost_node_after_its_grace_period_then_resolved_once_back() -> None:
    loop = ReconcileLoop(store_with([model("a").sim().always()]), [cpu_node("n1", "sim"), cpu_node("n2", "sim")],
                         now=NOW)
    loop.settle()
    gone = loop.nodes["n2"]
    loop.lose("n2")
    assert "node_lost" not in {c.kind for c in conditions(doc_of(loop), loop.now)}  # within its grace
    loop.now += GRACE
    found = [c for c in conditions(doc_of(loop), loop.now) if c.kind == "node_lost"]
    assert [(c.subject, c.severity) for c in found] == [("n2", CRITICAL)]
    assert "nodes forget n2" in found[0].words and f"{GRACE:g} s" in found[0].words
    loop.nodes["n2"] = gone
    loop.lost.pop("n2")
    assert not [c for c in conditions(doc_of(loop), loop.now) if c.kind == "node_lost"]


def test_without_a_clock_a_disconnected_node_counts_as_lost_at_once() -> None:
    doc = summary_with(nodes=(node_row("n1", False, NOW), node_row("n2", True)))
    assert keys(conditions(doc)) == {("node_lost", "n1")}
    assert conditions(doc, NOW + 1) == []


def test_a_crash_looping_model_is_down_then_parked_then_resolved_by_a_retry() -> None:
    loop = ReconcileLoop(store_with([model("a").sim().always()]), [cpu_node("n1", "sim")], now=NOW)
    loop.outcome = lambda action: "failed"
    for _ in range(3):  # placed; started (it fails at once); the failure counted, the replica gone
        loop.tick()
    found = {c.kind: c for c in conditions(doc_of(loop), loop.now)}
    assert found["model_down"].severity == CRITICAL and "failed start" in found["model_down"].words
    for _ in range(60):
        loop.tick(5.0)
    found = {c.kind: c for c in conditions(doc_of(loop), loop.now)}
    assert set(found) == {"model_parked"}, found  # parked says it all: not also "down"
    assert "ctl model retry a" in found["model_parked"].words
    loop.store.submit_nowait(commands.retry_model("a", loop.now))
    loop.outcome = lambda action: "ready"
    loop.settle()
    assert conditions(doc_of(loop), loop.now) == []


def test_an_unplaceable_model_until_a_node_fits_it() -> None:
    loop = ReconcileLoop(store_with([model("big").sim().always().gpus(2)]), [cpu_node("n1", "sim")], now=NOW)
    loop.tick()
    found = conditions(doc_of(loop), loop.now)
    assert [(c.kind, c.subject) for c in found] == [("model_unplaceable", "big")]
    assert "ctl plan --model big" in found[0].words


def test_an_on_demand_cold_start_is_not_down_but_an_always_on_start_is() -> None:
    doc = summary_with(models=(
        model_row(name="od", mode="on-demand", desired=1, ready=0, starting=1, state="starting", failures_in_row=0),
        model_row(name="on", mode="always", desired=1, ready=0, starting=1, state="starting", failures_in_row=0,
                  reason="waiting for node n1 to reconnect"),
        model_row(name="none", mode="always", desired=2, ready=0, starting=0, state="starting", failures_in_row=0),
    ))
    found = {c.subject: c for c in conditions(doc, NOW)}
    assert set(found) == {"on", "none"}
    assert found["on"].severity == WARNING and "waiting for node n1" in found["on"].words
    assert found["none"].severity == CRITICAL


def test_a_restart_storm_beside_a_ready_replica_from_the_hubs_count() -> None:
    loop = ReconcileLoop(store_with([model("a").sim().always().replicas(2)]), [cpu_node("n1", "sim")], now=NOW)
    loop.settle()
    hub = AgentHub(clock=lambda: loop.now)
    for _ in range(3):
        hub.note_restart("a")
    doc = doc_of(loop, restarts=hub.recent_restarts())
    assert [m.restarts for m in doc.models] == [3]
    assert any("restart storm" in w for w in doc.warnings)
    found = conditions(doc, loop.now)
    assert [(c.kind, c.subject, c.severity) for c in found] == [("restart_storm", "a", WARNING)]
    assert "restarted 3 times" in found[0].words and "2/2 ready" in found[0].words
    loop.now += TIMEOUTS.restart_window_s + 1  # the window passes: the storm is over
    assert conditions(doc_of(loop, restarts=hub.recent_restarts()), loop.now) == []
    assert hub.restarts_total == {"a": 3}


def test_the_storm_threshold_is_the_setting() -> None:
    store = store_with([model("a").sim().always()], settings={"health.restart_storm_restarts": 5})
    loop = ReconcileLoop(store, [cpu_node("n1", "sim")], now=NOW)
    loop.settle()
    assert conditions(doc_of(loop, restarts={"a": (NOW,) * 4}), loop.now) == []
    assert keys(conditions(doc_of(loop, restarts={"a": (NOW,) * 5}), loop.now)) == {("restart_storm", "a")}


def judge(name: str, status: str) -> Judge:
    return Judge(name, ("p",), True, "guard", "llamacpp", "/m.gguf", True, 1, 0, 0, "starting", False, None, None,
                 None, status, f"{name} is {status}")


def guard_doc(enabled: bool, policies: int, *judges: tuple[str, str]) -> Summary:
    return summary_with(guard=Guard(enabled, policies, tuple(judge(m, s) for m, s in judges)))


def test_judges_down_and_guards_off() -> None:
    found = conditions(guard_doc(True, 1, ("lg", "down"), ("ok-judge", "ok"), ("new", "unknown"), ("gone", "missing")))
    assert keys(found) == {("judge_down", "lg"), ("judge_down", "gone")}
    assert "lg is down" in next(c.words for c in found if c.subject == "lg")
    off = conditions(guard_doc(False, 2, ("lg", "down")))
    assert [(c.kind, c.severity) for c in off] == [("guards_off", WARNING)]  # a judge is moot while off
    assert "ctl guard on" in off[0].words
    assert conditions(guard_doc(False, 0)) == []  # no policy: nothing is left unchecked
    assert conditions(guard_doc(True, 1, ("lg", "ok"))) == []


def with_table(table: dict[str, Any]) -> Summary:
    """A summary whose control planes are the members' table `table`, read as `summarize` reads it."""
    return summary_with(cluster=ClusterPart.from_table(table, 0, False))


def members_doc(leader: str | None, *rows: tuple[str, str]) -> Summary:
    return with_table({"leader": leader, "members": [
        {"id": m, "state": s, "reason": f"{m} said nothing", "lag": 500 if s == "catching up" else None}
        for m, s in rows]})


def test_members_missing_lagging_and_no_leader() -> None:
    found = conditions(members_doc("a:1", ("a:1", "healthy"), ("b:1", "missing"), ("c:1", "catching up")))
    assert keys(found) == {("member_missing", "b:1"), ("member_lagging", "c:1")}
    assert "by 500 entries" in next(c.words for c in found if c.kind == "member_lagging")
    none = conditions(members_doc(None, ("a:1", "catching up")))
    assert ("no_leader", "") in keys(none) and next(c for c in none if c.kind == "no_leader").severity == CRITICAL
    assert conditions(members_doc("a:1", ("a:1", "healthy"))) == []
    assert conditions(with_table({})) == []  # no word on the group: nothing claimed


def test_the_members_of_a_real_member_table() -> None:
    views = [{"id": "a:1", "answer": {"role": "leader", "leader": "a:1", "ready": True, "commit_index": 900,
                                      "applied_index": 900}},
             {"id": "b:1", "error": "no answer within 1 s"},
             {"id": "c:1", "answer": {"role": "standby", "leader": "a:1", "ready": True, "applied_index": 100}}]
    doc = with_table({"leader": "a:1", "members": summary.member_rows(views, NOW)})
    assert keys(conditions(doc)) == {("member_missing", "b:1"), ("member_lagging", "c:1")}


def test_a_failing_webhook_and_none_deliverable() -> None:
    ok = {"id": "http://a/…#1", "failing": False, "failures_in_row": 0, "last_error": "", "queued": 0, "dropped": 0}
    bad = {"id": "http://b/…#2", "failing": True, "failures_in_row": 4, "last_error": "answered HTTP 500",
           "queued": 2, "dropped": 0}
    one = conditions(EMPTY, webhooks=[ok, bad])
    assert [(c.kind, c.subject, c.severity) for c in one] == [("webhook_failing", "http://b/…#2", WARNING)]
    assert "answered HTTP 500" in one[0].words and "ctl notify test" in one[0].words
    all_bad = conditions(EMPTY, webhooks=[bad])
    assert all_bad[0].severity == CRITICAL and "No webhook is deliverable" in all_bad[0].words
    assert conditions(EMPTY, webhooks=[ok]) == []


def test_nothing_before_the_reconciler_ran() -> None:
    store = store_with([model("a").sim().always()])
    doc = summary.summarize(store.snapshot(), ReconcileLoop(MemoryStore()).observed(), None, {}, NOW)
    assert conditions(doc, NOW) == []  # unknown is not down


# --- properties ------------------------------------------------------------------------------------------

_unknown_or = st.one_of(st.none(), st.integers(0, 4))
model_rows = st.builds(
    model_row,
    name=st.sampled_from(["a", "b", "c", "d"]),
    mode=st.sampled_from(["always", "on-demand"]),
    desired=_unknown_or, ready=_unknown_or, starting=_unknown_or,
    state=st.sampled_from(["ready", "starting", "parked", "unplaceable", "stopped", "absent", "unknown"]),
    parked=st.booleans(), unplaceable=st.one_of(st.none(), st.booleans()),
    failures_in_row=st.integers(0, 6), restarts=st.integers(0, 9), restart_storm=st.booleans(),
)
node_rows = st.builds(node_row, st.sampled_from(["n1", "n2", "n3"]), st.booleans(),
                      st.one_of(st.none(), st.floats(NOW - 100, NOW)))


@given(st.lists(model_rows, max_size=6), st.lists(node_rows, max_size=4), st.booleans())
def test_one_condition_per_key_sorted_known_and_never_from_unknown(models: list[ModelRow], nodes: list[NodeRow],
                                                                  clock: bool) -> None:
    found = conditions(summary_with(models=tuple(models), nodes=tuple(nodes)), NOW if clock else None)
    assert found == sorted(found)
    assert len(keys(found)) == len(found)
    for c in found:
        assert c.kind in KINDS and c.severity in SEVERITIES and c.words
    down = {c.subject for c in found if c.kind == "model_down"}
    for name in down:  # unknown is never down: some row of that name counted 0 ready of 1 or more
        rows = [m for m in models if m.name == name]
        assert any(m.ready == 0 and isinstance(m.desired, int) and m.desired >= 1 for m in rows)
    lost = {c.subject for c in found if c.kind == "node_lost"}
    assert lost <= {n.node for n in nodes if n.connected is False}


@given(st.lists(model_rows, min_size=1, max_size=6))
def test_a_model_made_healthy_has_no_condition(models: list[ModelRow]) -> None:
    """Fixed: ready as desired, not parked or unplaceable, no storm: every model condition resolves."""
    fixed = tuple(replace(m, parked=False, unplaceable=False, state="ready", ready=m.desired, restart_storm=False)
                  for m in models)
    assert conditions(summary_with(models=fixed), NOW) == []


async def test_the_reconciler_counts_each_committed_failed_start_as_a_restart() -> None:
    from llmgw.control.reconciler import Reconciler
    from llmgw.domain.observed import ReplicaObs

    clock = [NOW]
    store = store_with([model("a").sim().always()])
    hub = AgentHub(clock=lambda: clock[0])
    send, _ = trio_channel()
    link = hub.connect("n1", send)
    hub.report_inventory(link, cpu_node("n1", "sim"))
    reconciler = Reconciler(store, hub, clock=lambda: clock[0])
    for _ in range(3):
        await reconciler.run_once()  # places a replica and asks n1 to start it
        (rid,) = store.snapshot().placements
        hub.report_replicas(link, [ReplicaObs(rid, "a", "n1", "failed", error="engine exited with status 1")])
        await reconciler.run_once()  # the failure committed: the replica goes
        hub.report_replicas(link, [])
        clock[0] += 60  # past the slot's backoff
    assert hub.restarts_total == {"a": 3} and len(hub.recent_restarts()["a"]) == 3
    doc = summary.summarize(store.snapshot(), hub.observed(),
                            reconciler.last_plan.views if reconciler.last_plan else None, {}, clock[0])
    assert ("restart_storm", "a") in keys(conditions(doc, clock[0]))


def trio_channel() -> Any:
    import trio

    return trio.open_memory_channel[dict[str, Any]](100)
