"""The failures true now, from the cluster summary (`summary.build`, the document `ctl status` reads) and
the leader's webhook delivery health: one `Condition` per failure, keyed by (kind, subject). Pure.

Webhook events (`llmgw.notify`), the `llmgw_condition` gauge and the shipped alert rules all read these,
so an alert and a webhook see the same thing. Unknown (None) never makes a condition: no failure is
claimed from a number nobody reported. docs/observability.md lists each kind and what to do about it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llmgw.domain.timeouts import TIMEOUTS, Timeouts

CRITICAL, WARNING = "critical", "warning"
SEVERITIES = (CRITICAL, WARNING)

# Every kind, with its severity when nothing makes it worse or milder (docs/observability.md, "Conditions").
# certificate_expiring is not here: llmgw runs no TLS listener of its own yet, so there is no certificate
# to read (the alert rule is shipped for when one is exported).
KINDS: Mapping[str, str] = {
    "node_lost": CRITICAL,
    "model_parked": CRITICAL,
    "model_down": CRITICAL,
    "model_unplaceable": CRITICAL,
    "restart_storm": WARNING,
    "judge_down": CRITICAL,
    "member_missing": WARNING,
    "member_lagging": WARNING,
    "no_leader": CRITICAL,
    "guards_off": WARNING,
    "webhook_failing": WARNING,
    "gpu_problem": WARNING,
    "storage_unreadable": WARNING,
}

# judges.STATUSES that are a failure of a judge (not "ok", not "unknown").
JUDGE_FAILING = ("missing", "not_a_judge", "down", "failing")


@dataclass(frozen=True, order=True)
class Condition:
    """A failure true now. `subject` names what fails (a node, a model, a member, a webhook's id; "" for the
    cluster as a whole); `words` say what is wrong and what to do, for an engineer woken at night."""

    kind: str
    subject: str
    severity: str
    words: str

    @property
    def key(self) -> tuple[str, str]:
        return (self.kind, self.subject)

    def to_doc(self) -> dict[str, str]:
        return {"kind": self.kind, "subject": self.subject, "severity": self.severity, "words": self.words}


def conditions(summary: Mapping[str, Any], now: float | None = None, *, timeouts: Timeouts = TIMEOUTS,
               webhooks: Sequence[Mapping[str, Any]] = ()) -> list[Condition]:
    """The failures in `summary` (a `summary.build` document), sorted by key, one per key.

    `now`: unix time on the summary's clock; pass it: without it a node's disconnection cannot be held to
    its grace period, so a node counts as lost as soon as its agent is disconnected. `webhooks`: the
    notifier's health of each webhook (`Notifier.health()`: `id`, `failing`, `failures_in_row`,
    `last_error`, `queued`, `dropped`). A running control plane's: `llmgw.notify.watch.control_conditions`."""
    found: dict[tuple[str, str], Condition] = {}
    for c in (*_nodes(summary, now, timeouts), *_node_problems(summary), *_models(summary, timeouts),
              *_judges(summary), *_members(summary), *_webhooks(webhooks)):
        found.setdefault(c.key, c)
    return sorted(found.values())


def _c(kind: str, subject: str, words: str, severity: str | None = None) -> Condition:
    return Condition(kind, subject, severity or KINDS[kind], words)


def _rows(doc: Mapping[str, Any], key: str) -> Iterable[Mapping[str, Any]]:
    rows = doc.get(key)
    return [r for r in rows if isinstance(r, Mapping)] if isinstance(rows, list) else []


def _nodes(summary: Mapping[str, Any], now: float | None, timeouts: Timeouts) -> Iterable[Condition]:
    """A node whose agent has been gone longer than `lost_node_grace_s` (its placements went)."""
    for n in _rows(summary, "nodes"):
        if n.get("connected") is not False:
            continue
        lost_at = n.get("lost_at")
        gone = now - lost_at if isinstance(lost_at, (int, float)) and now is not None else None
        if gone is not None and gone < timeouts.lost_node_grace_s:
            continue  # within its grace period: an agent restart, its replicas kept
        name = str(n.get("node"))
        since = f"for {gone:.0f} s" if gone is not None else "(since when is unknown)"
        yield _c("node_lost", name, (
            f"node {name} has been unreachable {since}: its agent's stream closed and did not come back "
            f"within {timeouts.lost_node_grace_s:g} s, so its replicas were placed elsewhere. Check the machine "
            f"and its `llmgw agent` (systemctl status, journalctl); once it is gone for good, "
            f"`llmgw ctl nodes forget {name}`"))


def _node_problems(summary: Mapping[str, Any]) -> Iterable[Condition]:
    """What a connected node's agent reports it cannot use: its GPU probe's words (a MIG card with nothing
    carved, a MIG change pending, an unhealthy card, discovery that failed; a CPU node says nothing), and
    each `--storage` directory it cannot read (removed, unmounted, no permission)."""
    for n in _rows(summary, "nodes"):
        if n.get("connected") is not True:
            continue  # a lost node is node_lost; what it said before is stale
        name = str(n.get("node"))
        said = [str(w) for w in n.get("warnings") or () if w]
        if said:
            yield _c("gpu_problem", name, (
                f"node {name}: {'; '.join(said)}. Devices in that state are neither used nor free, so what "
                f"should run there runs elsewhere or not at all; `llmgw ctl nodes list` shows each device's reason"))
        for report in n.get("storage") or ():
            if isinstance(report, Mapping) and report.get("error"):
                path = str(report.get("path"))
                yield _c("storage_unreadable", f"{name}:{path}", (
                    f"node {name} cannot read its storage directory {path} (fabric "
                    f"{report.get('fabric') or '-'}): {report.get('error')}. Weights there are not seen, so models "
                    f"held only there are not placed on it. Mount or restore the directory (or fix its "
                    f"permissions); the agent rescans it every storage_rescan_s"))


def _models(summary: Mapping[str, Any], timeouts: Timeouts) -> Iterable[Condition]:
    for m in _rows(summary, "models"):
        name = str(m.get("name"))
        state, desired, ready = m.get("state"), m.get("desired"), m.get("ready")
        error = m.get("last_error") or "no error text"
        if m.get("parked") is True:
            yield _c("model_parked", name, (
                f"model {name} is parked after {m.get('failures_in_row')} failed start(s) in a row and is not "
                f"placed again: {error}. Fix its definition (source, profile, engine) or the nodes, then "
                f"`llmgw ctl model retry {name}`"))
        elif m.get("unplaceable") is True or state == "unplaceable":
            yield _c("model_unplaceable", name, (
                f"model {name} should run but fits on no node: {m.get('reason') or 'no reason given'}. Free room "
                f"(`llmgw ctl status` shows capacity), add a node, or change its profile; "
                f"`llmgw ctl plan --model {name}` shows why each node refuses it"))
        elif (isinstance(desired, int) and desired >= 1 and ready == 0 and state not in ("stopped", "absent")
              and not _cold_start(m)):
            failing = bool(m.get("failures_in_row"))
            starting = m.get("starting")
            why = f"{m.get('failures_in_row')} failed start(s) in a row, the last: {error}" if failing else (
                m.get("reason") or "no reason given")
            yield _c("model_down", name, (
                f"model {name} should have {desired} replica(s) and none is ready ({starting} starting): {why}. "
                f"Requests for it wait or fail. `llmgw ctl model show {name}` has each replica's state and error"),
                CRITICAL if failing or not starting else WARNING)
        restarts = m.get("restarts")
        if m.get("restart_storm") is True and isinstance(restarts, int):
            yield _c("restart_storm", name, (
                f"model {name}'s replicas restarted {restarts} times in the last {timeouts.restart_window_s:g} s "
                f"(failed starts or crashes), {m.get('ready')}/{m.get('desired')} ready: {error}. A crash loop "
                f"hides behind a ready replica; read the engine's log on its node (`llmgw ctl model show {name}`)"))


def _cold_start(m: Mapping[str, Any]) -> bool:
    """An on-demand model starting because a request asked for it, with no failure yet: by design, not down."""
    return m.get("mode") == "on-demand" and not m.get("failures_in_row") and bool(m.get("starting"))


def _judges(summary: Mapping[str, Any]) -> Iterable[Condition]:
    guard = summary.get("guard")
    if not isinstance(guard, Mapping):
        return
    if guard.get("enabled") is False:
        if guard.get("policies"):
            yield _c("guards_off", "", (
                f"guards are OFF (guard.enabled = false): none of the {guard.get('policies')} guard policies is "
                f"checked, so every request reaches its model unjudged. `llmgw ctl guard on` turns them back on"))
        return  # judges matter only while guards are on
    for j in _rows(guard, "judges"):
        if j.get("status") in JUDGE_FAILING:
            name = str(j.get("model"))
            policies = ", ".join(str(p) for p in j.get("policies") or ())
            yield _c("judge_down", name, (
                f"judge {name} (policies {policies}) cannot judge: {j.get('problem')}. Requests under those "
                f"policies are refused or let through as each policy's on_error says; "
                f"`llmgw ctl guard judge status`"))


def _members(summary: Mapping[str, Any]) -> Iterable[Condition]:
    cluster = summary.get("cluster")
    if not isinstance(cluster, Mapping) or not isinstance(cluster.get("members"), list):
        return  # no word on the group: nothing claimed
    rows = list(_rows(cluster, "members"))
    if "leader" in cluster and cluster.get("leader") is None:
        yield _c("no_leader", "", (
            f"no control plane leads ({len(rows)} member(s) known): nothing is placed, no setting or model can "
            f"change, agents and gateways wait. A majority of the members must run and reach each other on "
            f"their Raft ports; `llmgw ctl members` on each shows who it sees"))
    for r in rows:
        member = str(r.get("id"))
        if r.get("state") == "missing":
            yield _c("member_missing", member, (
                f"control plane {member} is missing: {r.get('reason')}. The group survives one failure fewer "
                f"until it is back; start its `llmgw control`, or replace it (`llmgw ctl members remove`, then add)"))
        elif r.get("state") == "catching up":
            lag = r.get("lag")
            yield _c("member_lagging", member, (
                f"control plane {member} is behind"
                + (f" by {lag} entries" if isinstance(lag, int) else "")
                + f": {r.get('reason')}. It cannot take over until it catches up; check its disk and network"))


def _webhooks(webhooks: Sequence[Mapping[str, Any]]) -> Iterable[Condition]:
    failing = [w for w in webhooks if w.get("failing") is True]
    none_left = bool(failing) and len(failing) == len(webhooks)
    for w in failing:
        hook = str(w.get("id"))
        yield _c("webhook_failing", hook, (
            f"webhook {hook} failed {w.get('failures_in_row')} deliveries in a row, the last: "
            f"{w.get('last_error') or 'no error text'} ({w.get('queued')} event(s) queued, {w.get('dropped')} "
            f"dropped)" + (". No webhook is deliverable: failures reach nobody" if none_left else "")
            + ". Check the endpoint, then `llmgw ctl notify test`; `llmgw ctl notify status` lists the deliveries"),
            CRITICAL if none_left else WARNING)
