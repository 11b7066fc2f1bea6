"""Judge status: for each judge model the guard policies name, whether it is defined, as a judge, with
ready replicas, its last failure to answer, and what is wrong in words; and the summary's guard part.

Pure: from the state, what the leader observed and the reconciler's views (`llmgw.reconcile.ModelView`,
read by attribute); unknown is None, never 0. Also finds Llama Guard 3 1B files in the agents' storage.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llmgw.domain.frozen import Doc
from llmgw.domain.guard import enabled, judges_asked
from llmgw.domain.observed import Observed
from llmgw.domain.state import ClusterState
from llmgw.domain.timeouts import TIMEOUTS

GUARDS_OFF = "guards are OFF: no request is checked (llmgw ctl guard on)"
# What is wrong with a judge, worst first; "ok" when nothing is, "unknown" before the reconciler ran.
STATUSES = ("missing", "not_a_judge", "down", "failing", "unknown", "ok")
# Llama-Guard-3-1B.Q4_K_M.gguf, llama_guard_3_1b-q8_0.gguf, Llama-Guard-3-1B-INT4.gguf ...
LLAMA_GUARD_FILE = re.compile(r"llama[-_. ]?guard[-_. ]?3[-_. ]?1b", re.IGNORECASE)


def enable_hint(model: str, *, replace: bool = False) -> str:
    return f"`llmgw ctl guard judge enable {model} --source FILE.gguf{' --replace' if replace else ''}`"


@dataclass(frozen=True)
class Judge(Doc):
    """A judge model the guard policies name, as the summary shows it: what it is, its replicas, its
    last failure to answer, and `status` (one of STATUSES) with the `problem` in words ("" when ok)."""

    model: str
    policies: tuple[str, ...]  # the policies naming it
    defined: bool
    role: str | None  # None: no model of that name
    engine: str | None
    source: str | None
    judge: bool  # defined with role guard
    desired: int | None  # None: the reconciler has no view of it
    ready: int | None
    starting: int | None
    state: str | None
    parked: bool | None
    last_failure: str | None  # a gateway's words when it last failed to answer; None: never reported
    last_failure_at: float | None
    last_failure_age_s: float | None
    status: str
    problem: str


@dataclass(frozen=True)
class Guard(Doc):
    """The summary's guard part: whether guards are on, how many policies, and each judge they name."""

    enabled: bool
    policies: int
    judges: tuple[Judge, ...]

def judge_rows(state: ClusterState, observed: Observed, views: Mapping[str, Any] | None, now: float | None,
               recent_s: float = TIMEOUTS.judge_failure_recent_s) -> tuple[Judge, ...]:
    """One `Judge` per judge model the policies ask for, by name. `views`: the reconciler's ModelView
    per model (None: it has not run); `now`: unix time (None: ages unknown)."""
    return tuple(_one(state, observed, views.get(m) if views is not None else None, views is None, m, policies,
                      now, recent_s) for m, policies in judges_asked(state).items())


def judge_status(state: ClusterState, observed: Observed, views: Mapping[str, Any] | None, now: float | None,
                 recent_s: float = TIMEOUTS.judge_failure_recent_s) -> list[dict[str, Any]]:
    """`judge_rows` as the API shows them: one document per judge model the policies ask for."""
    return [j.to_doc() for j in judge_rows(state, observed, views, now, recent_s)]


def _one(state: ClusterState, observed: Observed, view: Any | None, unplanned: bool, name: str,
         policies: tuple[str, ...], now: float | None, recent_s: float) -> Judge:
    model = state.models.get(name)
    failure = observed.judge_failures.get(name)
    at, words = failure if failure is not None else (None, None)
    age = None if at is None or now is None else round(max(now - at, 0.0), 3)
    health = state.model_health(name)
    if model is None:
        status, problem = "missing", f"no model named {name}: define it with role guard, or {enable_hint(name)}"
    elif model.role != "guard":
        status, problem = "not_a_judge", (f"{name} has role {model.role}, not guard: {enable_hint(name, replace=True)}"
                                          f" serves a judge under that name instead, or name another judge in "
                                          f"the policies")
    elif health.parked:
        status, problem = "down", (f"{name} is parked after {health.failures_in_row} failed start(s): "
                                   f"{health.last_error or 'no error text'} "
                                   f"(`llmgw ctl model retry {name}` once fixed)")
    elif view is None:
        why = "the reconciler has not run yet" if unplanned else "the reconciler has no view of it yet"
        status, problem = "unknown", f"whether {name} has a ready replica is unknown: {why}"
    elif not view.ready:
        reason = f": {view.reason}" if view.reason else ""
        status, problem = "down", f"{name} has no ready replica ({view.starting} starting){reason}"
    elif at is not None and (age is None or age <= recent_s):
        when = f"{age:.0f} s ago" if age is not None else "recently"
        status, problem = "failing", f"{name} failed to answer {when}: {words}"
    else:
        status, problem = "ok", ""
    return Judge(
        model=name, policies=tuple(policies), defined=model is not None,
        role=model.role if model else None, engine=model.engine if model else None,
        source=model.source if model else None, judge=model.role == "guard" if model else False,
        desired=view.desired if view else None, ready=view.ready if view else None,
        starting=view.starting if view else None, state=view.state if view else None,
        parked=health.parked if model else None,
        last_failure=words, last_failure_at=at, last_failure_age_s=age, status=status, problem=problem)


def guard_summary(state: ClusterState, observed: Observed, views: Mapping[str, Any] | None,
                  now: float | None) -> tuple[Guard, list[str]]:
    """The summary's `guard` part (enabled, how many policies, the judges) and its warnings: guards off,
    and each judge with something wrong (an unknown one is not warned of: the models table says why)."""
    on = enabled(state)
    judges = judge_rows(state, observed, views, now)
    warnings = [] if on else [GUARDS_OFF]
    for j in judges:
        if j.status not in ("ok", "unknown"):
            warnings.append(f"judge {j.model} (policies {', '.join(j.policies)}): {j.problem}")
    return Guard(on, len(state.guard_policies), judges), warnings


def guard_files(observed: Observed) -> list[dict[str, Any]]:
    """Llama Guard 3 1B GGUF files the agents' storage reports list: node, path, fabric, shared."""
    found = []
    for node, info in sorted(observed.nodes.items()):
        for report in info.storage:
            for m in report.get("models") or ():
                if not isinstance(m, Mapping) or m.get("kind") != "gguf" or not isinstance(m.get("path"), str):
                    continue
                if LLAMA_GUARD_FILE.search(str(m.get("name", ""))) or LLAMA_GUARD_FILE.search(
                        posixpath.basename(m["path"])):
                    found.append({"node": node, "path": m["path"], "fabric": report.get("fabric"),
                                  "shared": bool(report.get("shared"))})
    return found


def pick_guard_file(observed: Observed) -> tuple[str, list[str]] | None:
    """The Llama Guard 3 1B file to serve a judge from, and the nodes that see it: the path seen on the
    most nodes (a shared directory's counts for each node reporting it); None when no agent saw one."""
    nodes: dict[str, set[str]] = {}
    for f in guard_files(observed):
        nodes.setdefault(f["path"], set()).add(f["node"])
    if not nodes:
        return None
    path = min(nodes, key=lambda p: (-len(nodes[p]), p))
    return path, sorted(nodes[path])
