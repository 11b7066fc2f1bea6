"""The fault catalog (docs/faults.md): each fault's injection, fix and what it shows in the four places an
operator looks (`ctl status`, `GET /api/v1/status`, /metrics, a webhook), on the worlds of tests/support/faults.py.
tests/integration/test_faults.py runs each once, tests/bench/faults.py many times in random order.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from llmgw.domain.timeouts import Timeouts
from llmgw.notify.hooks import hook_id
from llmgw.notify.notifier import FAILING_AFTER, retry_wait
from tests.support.faults import Families, Group, World, condition_on, ctl_page, events, mig_node, sample

PLACES = ("ctl", "api", "metric", "webhook")
Places = dict[str, bool]


@dataclass(frozen=True)
class Shows:
    """What one fault on the single-member world shows while it lasts: its condition (kind, subject), a
    pattern of `ctl status`'s page, and its own metric family (besides `llmgw_condition`), while on and once
    fixed (`metric_back`)."""

    kind: str
    subject: str
    ctl: str
    metric: Callable[[Families], bool] = lambda f: True
    metric_back: Callable[[Families], bool] = lambda f: True
    ctl_also: str = ""  # another pattern the page matches while it lasts (a table's word), not checked once fixed


def seen(w: World, s: Shows, since: int) -> Places:
    doc, families = w.status(), w.metrics()
    return {
        "ctl": re.search(s.ctl, page := ctl_page(doc)) is not None and re.search(s.ctl_also, page) is not None,
        "api": any((c["kind"], c["subject"]) == (s.kind, s.subject) for c in doc["conditions"]),
        "metric": condition_on(families, s.kind, s.subject) and s.metric(families),
        "webhook": bool(events(w.receiver, World.HOOK, "started", s.kind, s.subject, since)),
    }


def cleared(w: World, s: Shows, since: int) -> Places:
    doc, families = w.status(), w.metrics()
    return {
        "ctl": re.search(s.ctl, ctl_page(doc)) is None,
        "api": all((c["kind"], c["subject"]) != (s.kind, s.subject) for c in doc["conditions"]),
        "metric": not condition_on(families, s.kind, s.subject) and s.metric_back(families),
        "webhook": bool(events(w.receiver, World.HOOK, "resolved", s.kind, s.subject, since)),
    }


@dataclass
class Fault:
    """`setup` (untimed: what must run first), `inject`, `fix`, `cleanup` (the world as it was), on a World;
    `settle_s`: how long the fault takes to be true by its own definition once injected (a grace period, a
    rescan), after which each place must show it within two reconcile ticks; None: it depends on engine
    processes starting, so the four places are held to two ticks of the first one showing it."""

    name: str
    places: tuple[str, ...]
    shows: Callable[[World], Shows]
    inject: Callable[[World], None]
    fix: Callable[[World], None]
    settle_s: Callable[[Timeouts], float | None] = lambda t: 0.0
    setup: Callable[[World], None] = lambda w: None
    cleanup: Callable[[World], None] = lambda w: None
    world: str = "world"


def _model(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "engine": "sim", "source": f"sim://{name}", **extra}


def _policy(w: World, name: str, judge: str) -> None:
    w.api("PUT", f"/api/v1/guard/policies/{name}", {"judge": judge, "models": ["*"]})


def _drop_policy(w: World, name: str) -> None:
    w.api("DELETE", f"/api/v1/guard/policies/{name}", ok=(200, 404))


def steps(*fns: Callable[[World], object]) -> Callable[[World], None]:
    def run(w: World) -> None:
        for fn in fns:
            fn(w)
    return run


def _retry(w: World, name: str) -> None:
    w.api("POST", f"/api/v1/models/{name}/retry", {}, ok=(200, 404, 409, 422))


def run_world_fault(w: World, f: Fault, timeout: float = 60.0) -> dict[str, Any]:
    """Set up, inject, wait until every place shows it (when each first did), fix, wait until every place
    shows it resolved, clean up. Returns seconds: `seen_s` (the last place, from the injection), `first_s`
    (the first place), `resolved_s` (from the fix), and the fault's `settle_s` (None: not known ahead)."""
    f.setup(w)
    since = len(w.receiver.received)
    f.inject(w)
    start = time.monotonic()
    s = f.shows(w)
    first: dict[str, float] = {}
    while len(first) < len(f.places):
        now = time.monotonic() - start
        for place, on in seen(w, s, since).items():
            if on and place in f.places:
                first.setdefault(place, now)
        if now > timeout:
            raise AssertionError(f"{f.name}: shown only in {sorted(first)} within {timeout:g} s")
        time.sleep(0.05)
    f.fix(w)
    resolved, _ = poll(f"{f.name} resolved", lambda: {p: v for p, v in cleared(w, s, since).items() if p in f.places},
                       timeout)
    f.cleanup(w)
    return {"seen_s": max(first.values()), "first_s": min(first.values()), "resolved_s": resolved,
            "settle_s": f.settle_s(w.timeouts), "places": first}


# -- agent lost -----------------------------------------------------------------------------------------------

AGENT_LOST = Fault(
    "agent_lost", PLACES,
    lambda w: Shows("node_lost", "n2", r"node\(s\) not connected: [^\n]*\bn2\b",
                    lambda f: sample(f, "llmgw_node_connected", node="n2") == 0.0,
                    lambda f: sample(f, "llmgw_node_connected", node="n2") == 1.0,
                    ctl_also=r"(?m)^n2\s+-\s+no\b"),
    inject=lambda w: w.run(w.stop_agent, "n2"),
    fix=lambda w: w.run(w.start_agent, "n2"),
    settle_s=lambda t: t.lost_node_grace_s)

# -- an engine that never starts: parked ------------------------------------------------------------------------

CRASH_LOOP = Fault(
    "crash_loop_parked", PLACES,
    lambda w: Shows("model_parked", "crashy", r"model crashy is parked",
                    lambda f: sample(f, "llmgw_model_parked", model="crashy") == 1.0,
                    lambda f: sample(f, "llmgw_model_parked", model="crashy") == 0.0,
                    ctl_also=r"(?m)^crashy\s+sim\s+chat\s+0/1\s+parked\b.*status 3"),
    inject=lambda w: w.put_model(_model("crashy", args=["--fail-start"])),
    fix=steps(lambda w: w.put_model(_model("crashy")), lambda w: _retry(w, "crashy")),
    settle_s=lambda t: None,
    cleanup=lambda w: w.delete_model("crashy"))


# -- a slot crashing beside a ready replica: the restart storm ----------------------------------------------------

def _storm_setup(w: World) -> None:
    w.put_model(_model("stormy", replicas={"min": 2, "max": 2}))
    w.wait_ready("stormy", 2)


def _storm_inject(w: World) -> None:
    """Crash one slot's engine (SIGKILL) and each of its replacements, storm-threshold times; the other replica
    stays ready throughout."""
    killed: set[str] = set()
    spare = next(iter(w.engine_pids("stormy")))  # this one is never touched
    threshold = int(w.api("GET", "/api/v1/settings/health.restart_storm_restarts")["value"])
    while len(killed) < threshold:
        found = w.wait("a replacement engine", lambda: {r: p for r, p in w.engine_pids("stormy").items()
                                                        if r != spare and r not in killed})
        rid, pid = next(iter(found.items()))
        w.kill_engine(pid)
        killed.add(rid)


STORM = Fault(
    "restart_storm", PLACES,
    lambda w: Shows("restart_storm", "stormy", r"model stormy: \d+ restarts of its replicas",
                    lambda f: (sample(f, "llmgw_model_recent_restarts", model="stormy") or 0) >= 3
                    and (sample(f, "llmgw_model_ready_replicas", model="stormy") or 0) >= 1,
                    lambda f: (sample(f, "llmgw_model_recent_restarts", model="stormy") or 0) < 3),
    setup=_storm_setup, inject=_storm_inject,
    fix=lambda w: None,  # the crashes stop; the storm ends once they leave restart_window_s
    settle_s=lambda t: t.engine_exit_log_s,
    cleanup=lambda w: w.delete_model("stormy"))

# -- a model no node can take ----------------------------------------------------------------------------------------

UNPLACEABLE = Fault(
    "model_unplaceable", PLACES,
    lambda w: Shows("model_unplaceable", "huge", r"model huge cannot be placed",
                    lambda f: sample(f, "llmgw_model_unplaceable", model="huge") == 1.0,
                    lambda f: sample(f, "llmgw_model_unplaceable", model="huge") == 0.0),
    inject=lambda w: w.put_model(_model("huge", profile={"gpus": 8, "tp": 8})),
    fix=lambda w: w.put_model(_model("huge")),  # a profile that fits (here: the sim on a CPU)
    cleanup=lambda w: w.delete_model("huge"))


# -- judges ----------------------------------------------------------------------------------------------------------

def _judge_down_inject(w: World) -> None:
    w.put_model(_model("lg-down", role="guard", args=["--fail-start"]))
    _policy(w, "p-down", "lg-down")


def _judge_status(judge: str, status: str) -> Callable[[Families], bool]:
    return lambda f: sample(f, "llmgw_judge_status", judge=judge, status=status) == 1.0


JUDGE_DOWN = Fault(
    "judge_down", PLACES,
    lambda w: Shows("judge_down", "lg-down", r"judge lg-down \(policies p-down\)",
                    _judge_status("lg-down", "down"), _judge_status("lg-down", "ok"),
                    ctl_also=r"(?m)^lg-down\s+p-down\s+yes\s+guard\s.*\bDOWN$"),
    inject=_judge_down_inject,
    fix=steps(lambda w: w.put_model(_model("lg-down", role="guard")), lambda w: _retry(w, "lg-down")),
    cleanup=steps(lambda w: _drop_policy(w, "p-down"), lambda w: w.delete_model("lg-down")))

JUDGE_MISSING = Fault(
    "judge_missing", PLACES,
    lambda w: Shows("judge_down", "lg-missing", r"no model named lg-missing",
                    _judge_status("lg-missing", "missing"), _judge_status("lg-missing", "ok"),
                    ctl_also=r"(?m)^lg-missing\s+p-missing\s+no\s.*\bMISSING$"),
    inject=lambda w: _policy(w, "p-missing", "lg-missing"),
    fix=lambda w: w.put_model(_model("lg-missing", role="guard")),  # what `ctl guard judge enable` does
    cleanup=steps(lambda w: _drop_policy(w, "p-missing"), lambda w: w.delete_model("lg-missing")))


def _guards_setup(w: World) -> None:
    w.put_model(_model("lg-on", role="guard"))
    _policy(w, "p-on", "lg-on")
    w.wait_ready("lg-on")


GUARDS_OFF = Fault(
    "guards_off", PLACES,
    lambda w: Shows("guards_off", "", r"guards are OFF",
                    lambda f: sample(f, "llmgw_guard_enabled") == 0.0,
                    lambda f: sample(f, "llmgw_guard_enabled") == 1.0),
    setup=_guards_setup,
    inject=lambda w: w.put_setting("guard.enabled", False),
    fix=lambda w: w.put_setting("guard.enabled", True),
    cleanup=steps(lambda w: _drop_policy(w, "p-on"), lambda w: w.delete_model("lg-on")))


# -- a webhook endpoint failing ------------------------------------------------------------------------------------

def _failing_url(w: World) -> str:
    return w.receiver.url + World.FAILING


def _webhook_setup(w: World) -> None:
    w.receiver.answers[World.FAILING] = 500
    w.put_setting("notify.webhooks", [w.hook_url, _failing_url(w)])


def _webhook_fix(w: World) -> None:
    """The endpoint answers again; `ctl notify test` (the doc's step) shows it to the notifier."""
    w.receiver.answers[World.FAILING] = 200
    w.api("POST", "/api/v1/notify/test", {})


def _webhook_cleanup(w: World) -> None:
    w.delete_model("wf-trigger")
    w.put_setting("notify.webhooks", [w.hook_url])
    w.receiver.answers.pop(World.FAILING, None)


WEBHOOK_FAILING = Fault(
    "webhook_failing", PLACES,
    lambda w: Shows("webhook_failing", hook_id(_failing_url(w)), r"webhook \S+ failed \d+ deliveries in a row",
                    lambda f: (sample(f, "llmgw_webhook_deliveries", "_total", outcome="failed") or 0) >= 1),
    setup=_webhook_setup,
    # Any event: a model that fits nowhere starts a condition, posted to both webhooks.
    inject=lambda w: w.put_model(_model("wf-trigger", profile={"gpus": 8, "tp": 8})),
    fix=_webhook_fix,
    settle_s=lambda t: t.notify_check_s + sum(retry_wait(a, t) for a in range(1, FAILING_AFTER)),
    cleanup=_webhook_cleanup)


# -- the node's own hardware and storage ----------------------------------------------------------------------------

def _set_probe(w: World, node: str, carved: bool) -> None:
    probe = w.agents[node].probe
    w.run_sync(setattr, probe, "info", mig_node(node, carved=carved))


MIG_EMPTY = Fault(
    "mig_no_instances", PLACES,
    lambda w: Shows("gpu_problem", "n3", r"node n3: GPU 0: MIG mode is on but no instances are carved",
                    lambda f: sample(f, "llmgw_node_gpus", node="n3", state="free") == 0.0,
                    lambda f: sample(f, "llmgw_node_gpus", node="n3", state="free") == 2.0),
    inject=lambda w: _set_probe(w, "n3", carved=False),
    fix=lambda w: _set_probe(w, "n3", carved=True),
    settle_s=lambda t: t.storage_rescan_s)

STORAGE_GONE = Fault(
    "storage_gone", PLACES,
    lambda w: Shows("storage_unreadable", f"n4:{w.storage_dir}", r"storage directory on fab-a could not be read"),
    inject=lambda w: shutil.rmtree(w.storage_dir),
    fix=lambda w: w.storage_dir.mkdir(),
    settle_s=lambda t: t.storage_rescan_s)


# -- the control planes themselves (a Group of processes) --------------------------------------------------------------

@dataclass
class GroupFault:
    """A fault of the Raft group: `run(group, tick_s)` injects it, checks each place, fixes it and checks again;
    returns what it measured."""

    name: str
    places: tuple[str, ...]
    run: Callable[[Group, float], dict[str, Any]]
    world: str = "group"
    notes: dict[str, str] = field(default_factory=dict)


def poll(what: str, probe: Callable[[], Places], timeout: float) -> tuple[float, Places]:
    """Until every place in `probe()` is True: (seconds it took, the last reading); AssertionError with the
    places still False after `timeout`."""
    start = time.monotonic()
    while True:
        got = probe()
        if all(got.values()):
            return time.monotonic() - start, got
        if time.monotonic() - start > timeout:
            raise AssertionError(f"{what}: not within {timeout:g} s: {got}")
        time.sleep(0.05)


def _member_stopped(g: Group, tick_s: float) -> dict[str, Any]:
    leader = g.leader()
    member = next(m for m in g.cluster.members if m is not leader)
    addr, since = member.raft_addr, len(g.receiver.received)

    def places(on: bool) -> Places:
        r = g.api(leader, "GET", "/api/v1/status")
        doc = r.json() if r.status_code == 200 else {}
        families = g.metrics(leader)
        row = re.search(rf"(?m)^{re.escape(addr)}\s+\S+\s+missing\b", ctl_page(doc)) if doc else None
        listed = any((c["kind"], c["subject"]) == ("member_missing", addr) for c in doc.get("conditions", ()))
        link = sample(families, "llmgw_raft_member_connected", member=addr)
        gauge = condition_on(families, "member_missing", addr)
        posted = events(g.receiver, World.HOOK, "started" if on else "resolved", "member_missing", addr, since)
        return {"ctl": (row is not None) == on, "api": bool(doc) and listed == on,
                "metric": gauge == on and link == (0.0 if on else 1.0), "webhook": bool(posted)}

    member.stop()
    took, _ = poll("member_missing shown", lambda: places(True), 30)
    g.start_member(member)
    back, _ = poll("member_missing resolved", lambda: places(False), 60)
    return {"seen_s": took, "settle_s": 0.0, "resolved_s": back}


def _no_quorum(g: Group, tick_s: float) -> dict[str, Any]:
    """Two of three stopped: the one left cannot lead. Its own answers show it (the API's 503 no_leader and its
    member table, `ctl status`, `llmgw_control_leader` 0: the LlmgwNoLeader alert); no webhook can say it."""
    leader = g.leader()
    left = leader  # the leader stays: it must notice it has no majority and step down
    stopped = [m for m in g.cluster.members if m is not left]
    since = len(g.receiver.received)

    def shown() -> Places:
        r = g.api(left, "GET", "/api/v1/status")
        families = g.metrics(left)
        leaders = sum(sample(g.metrics(m), "llmgw_control_leader") or 0.0 for m in g.cluster.members if m.running)
        return {"api": r.status_code == 503 and r.json()["error"]["code"] == "no_leader",
                "metric": sample(families, "llmgw_control_leader") == 0.0
                and sample(families, "llmgw_raft_leader_known") == 0.0 and leaders < 1}  # LlmgwNoLeader's expr

    for m in stopped:
        m.stop()
    took, _ = poll("no leader shown", shown, 30)
    ctl = g.ctl_status(left)
    assert ctl.returncode != 0 and "no_leader" in ctl.stdout + ctl.stderr, ctl
    assert re.search(r"(?m)\bmissing\b", ctl.stdout), ctl.stdout  # the members as the one left sees them
    posted = [r.json() for r in g.receiver.received[since:]]
    assert not [p for p in posted if p["condition"]["kind"] == "no_leader"], posted
    for m in stopped:
        g.start_member(m)

    def back() -> Places:
        try:  # the members started again may not listen yet
            answers = [g.api(m, "GET", "/api/v1/status").status_code for m in g.cluster.members]
            leaders = sum(sample(g.metrics(m), "llmgw_control_leader") or 0.0 for m in g.cluster.members)
        except httpx.HTTPError:
            return {"api": False, "metric": False}
        return {"api": answers == [200] * len(answers), "metric": leaders == 1.0}

    resolved, _ = poll("a leader again", back, 60)
    ctl = g.ctl_status(left)
    assert ctl.returncode == 0 and "leader: " in ctl.stdout, ctl
    return {"seen_s": took, "settle_s": float(g.leader_fallback_s), "resolved_s": resolved}


MEMBER_STOPPED = GroupFault("member_stopped", PLACES, _member_stopped)
NO_QUORUM = GroupFault("no_quorum", ("ctl", "api", "metric"), _no_quorum)

FAULTS: dict[str, Fault | GroupFault] = {f.name: f for f in (
    AGENT_LOST, CRASH_LOOP, STORM, UNPLACEABLE, JUDGE_DOWN, JUDGE_MISSING, GUARDS_OFF, WEBHOOK_FAILING, MIG_EMPTY,
    STORAGE_GONE, MEMBER_STOPPED, NO_QUORUM)}
