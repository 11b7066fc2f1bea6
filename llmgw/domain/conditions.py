"""The failures true now, from the cluster summary (`summary.summarize`, what `ctl status` reads) and
the leader's webhook delivery health: one `Condition` per failure, keyed by (kind, subject). Pure.

Webhook events (`llmgw.notify`), the `llmgw_condition` gauge and the shipped alert rules all read these,
so an alert and a webhook see the same thing. Unknown (None) never makes a condition: no failure is
claimed from a number nobody reported. docs/observability.md lists each kind and what to do about it.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llmgw.domain.timeouts import TIMEOUTS, Timeouts

if TYPE_CHECKING:
    from llmgw.domain.judges import Guard
    from llmgw.domain.summary import CertRow, ClusterPart, ModelRow, NodeRow, Summary

CRITICAL, WARNING = "critical", "warning"
SEVERITIES = (CRITICAL, WARNING)

# Every kind, with its severity when nothing makes it worse or milder (docs/observability.md, "Conditions").
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
    "cert_expiring": WARNING,
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


def conditions(summary: Summary, now: float | None = None, *, timeouts: Timeouts = TIMEOUTS,
               webhooks: Sequence[Mapping[str, Any]] = (), leading_since: float | None = None) -> list[Condition]:
    """The failures in `summary` (`summary.summarize`'s), sorted by key, one per key.

    `now`: unix time on the summary's clock; pass it: without it a node's disconnection cannot be held to
    its grace period, so a node counts as lost as soon as its agent is disconnected. `webhooks`: the
    notifier's health of each webhook (`Notifier.health()`: `id`, `failing`, `failures_in_row`,
    `last_error`, `queued`, `dropped`). A running control plane's: `llmgw.notify.watch.control_conditions`.

    No condition starts for what is expected to heal within its grace (`healing` says which, in words): while
    the leader that took office at `leading_since` still gives its agents `agent_report_grace_s` to report,
    no model is down or unplaceable and no judge down; nor is a model cold-starting within its activation
    window, nor one evicted by policy (absent: waiting for a request)."""
    found: dict[tuple[str, str], Condition] = {}
    reporting = report_grace_left(leading_since, now, timeouts) > 0
    healed = {m.name for m in summary.models if healing(m)}
    for c in (*_nodes(summary.nodes, now, timeouts), *_node_problems(summary.nodes),
              *_models(summary.models, timeouts, reporting), *_judges(summary.guard, healed, reporting),
              *_members(summary.cluster),
              *_webhooks(webhooks), *_certificates(summary.certificates, timeouts)):
        found.setdefault(c.key, c)
    return sorted(found.values())


def report_grace_left(leading_since: float | None, now: float | None, timeouts: Timeouts = TIMEOUTS) -> float:
    """Seconds left of a new leader's grace for its agents to report (0: over, or unknown: no time given)."""
    if leading_since is None or now is None:
        return 0.0
    return max(0.0, leading_since + timeouts.agent_report_grace_s - now)


def report_grace_words(leading_since: float | None, now: float | None, timeouts: Timeouts = TIMEOUTS) -> str:
    """What status says while the grace lasts, instead of an alarm ("" once it is over)."""
    left = report_grace_left(leading_since, now, timeouts)
    if not left:
        return ""
    return (f"waiting for agents to report (grace {timeouts.agent_report_grace_s:g} s, {left:.0f} s left): this "
            f"leader just took office, so no model is judged down or unplaceable before its agents have said "
            f"what runs")


def healing(m: ModelRow) -> str:
    """Why a model that serves nothing now is expected to heal by itself, in words ("" when it is not):
    a cold start (no failure yet) still within its activation window, or an on-demand model evicted by
    policy, waiting for a request. Such a model is not down."""
    if m.parked or m.failures_in_row:
        return ""
    if m.state == "absent" and m.mode == "on-demand" and m.reason.startswith("evicted"):
        return f"evicted by policy, waiting for a request: {m.reason}"
    if m.state == "starting" and m.starting and not m.ready:
        elapsed = (m.activation or {}).get("elapsed_s")
        window = m.window_s
        if isinstance(elapsed, (int, float)) and window and elapsed < window:
            return f"cold start within its activation window ({elapsed:.0f} s of {window:g} s)"
    return ""


def _c(kind: str, subject: str, words: str, severity: str | None = None) -> Condition:
    return Condition(kind, subject, severity or KINDS[kind], words)


def _nodes(nodes: Iterable[NodeRow], now: float | None, timeouts: Timeouts) -> Iterable[Condition]:
    """A node whose agent has been gone longer than `lost_node_grace_s` (its placements went)."""
    for n in nodes:
        if n.connected:
            continue
        gone = now - n.lost_at if n.lost_at is not None and now is not None else None
        if gone is not None and gone < timeouts.lost_node_grace_s:
            continue  # within its grace period: an agent restart, its replicas kept
        since = f"for {gone:.0f} s" if gone is not None else "(since when is unknown)"
        yield _c("node_lost", n.node, (
            f"node {n.node} has been unreachable {since}: its agent's stream closed and did not come back "
            f"within {timeouts.lost_node_grace_s:g} s, so its replicas were placed elsewhere. Check the machine "
            f"and its `llmgw agent` (systemctl status, journalctl); once it is gone for good, "
            f"`llmgw ctl nodes forget {n.node}`"))


def _node_problems(nodes: Iterable[NodeRow]) -> Iterable[Condition]:
    """What a connected node's agent reports it cannot use: its GPU probe's words (a MIG card with nothing
    carved, a MIG change pending, an unhealthy card, discovery that failed; a CPU node says nothing), and
    each `--storage` directory it cannot read (removed, unmounted, no permission)."""
    for n in nodes:
        if not n.connected:
            continue  # a lost node is node_lost; what it said before is stale
        name = n.node
        said = [w for w in n.warnings or () if w]
        if said:
            yield _c("gpu_problem", name, (
                f"node {name}: {'; '.join(said)}. Devices in that state are neither used nor free, so what "
                f"should run there runs elsewhere or not at all; `llmgw ctl nodes list` shows each device's reason"))
        for report in n.storage or ():  # the agent's own reports, as it sent them
            if report.get("error"):
                path = str(report.get("path"))
                yield _c("storage_unreadable", f"{name}:{path}", (
                    f"node {name} cannot read its storage directory {path} (fabric "
                    f"{report.get('fabric') or '-'}): {report.get('error')}. Weights there are not seen, so models "
                    f"held only there are not placed on it. Mount or restore the directory (or fix its "
                    f"permissions); the agent rescans it every storage_rescan_s"))


def _models(models: Iterable[ModelRow], timeouts: Timeouts, reporting: bool = False) -> Iterable[Condition]:
    """`reporting`: a new leader's agents are still within their grace to report: nothing is down or
    unplaceable yet (parked is in the replicated state: no report heals it)."""
    for m in models:
        name, desired = m.name, m.desired
        error = m.last_error or "no error text"
        if m.parked:
            yield _c("model_parked", name, (
                f"model {name} is parked after {m.failures_in_row} failed start(s) in a row and is not "
                f"placed again: {error}. Fix its definition (source, profile, engine) or the nodes, then "
                f"`llmgw ctl model retry {name}`"))
        elif reporting or healing(m):
            pass  # expected to heal within its grace: no alarm (`healing` has its words)
        elif (m.unplaceable is True or m.state == "unplaceable") and m.base:
            yield _c("model_unplaceable", name, (
                f"LoRA adapter {name} of model {m.base} is loaded on no replica: {m.reason or 'no reason given'}. "
                f"Fix its file (`llmgw ctl model show {name}` has each replica's words), then remove the adapter and "
                f"define it again"))
        elif m.unplaceable is True or m.state == "unplaceable":
            yield _c("model_unplaceable", name, (
                f"model {name} should run but fits on no node: {m.reason or 'no reason given'}. Free room "
                f"(`llmgw ctl status` shows capacity), add a node, or change its profile; "
                f"`llmgw ctl plan --model {name}` shows why each node refuses it"))
        elif (desired is not None and desired >= 1 and m.ready == 0 and m.state not in ("stopped", "absent")
              and not _cold_start(m)):
            failing = bool(m.failures_in_row)
            why = f"{m.failures_in_row} failed start(s) in a row, the last: {error}" if failing else (
                m.reason or "no reason given")
            yield _c("model_down", name, (
                f"model {name} should have {desired} replica(s) and none is ready ({m.starting} starting): {why}. "
                f"Requests for it wait or fail. `llmgw ctl model show {name}` has each replica's state and error"),
                CRITICAL if failing or not m.starting else WARNING)
        if m.restart_storm:
            yield _c("restart_storm", name, (
                f"model {name}'s replicas restarted {m.restarts} times in the last {timeouts.restart_window_s:g} s "
                f"(failed starts or crashes), {m.ready}/{m.desired} ready: {error}. A crash loop "
                f"hides behind a ready replica; read the engine's log on its node (`llmgw ctl model show {name}`)"))


def _cold_start(m: ModelRow) -> bool:
    """An on-demand model starting because a request asked for it, with no failure yet: by design, not down."""
    return m.mode == "on-demand" and not m.failures_in_row and bool(m.starting)


def _judges(guard: Guard, healing_models: Container[str] = (), reporting: bool = False) -> Iterable[Condition]:
    """`healing_models`: models expected to heal within their grace; `reporting`: a new leader's agents are
    still within their grace to report. Either way a judge with no ready replica is not down yet; one missing
    or not a judge is (no report heals a policy that names the wrong model)."""
    if not guard.enabled:
        if guard.policies:
            yield _c("guards_off", "", (
                f"guards are OFF (guard.enabled = false): none of the {guard.policies} guard policies is "
                f"checked, so every request reaches its model unjudged. `llmgw ctl guard on` turns them back on"))
        return  # judges matter only while guards are on
    for j in guard.judges:
        if j.status == "down" and (reporting or j.model in healing_models) and not j.parked:
            continue  # its agents are reporting, or its model cold-starts within its window: not down
        if j.status in JUDGE_FAILING:
            yield _c("judge_down", j.model, (
                f"judge {j.model} (policies {', '.join(j.policies)}) cannot judge: {j.problem}. Requests under "
                f"those policies are refused or let through as each policy's on_error says; "
                f"`llmgw ctl guard judge status`"))


def _members(cluster: ClusterPart) -> Iterable[Condition]:
    if cluster.members is None:
        return  # no word on the group: nothing claimed
    if cluster.leader is None:
        yield _c("no_leader", "", (
            f"no control plane leads ({len(cluster.members)} member(s) known): nothing is placed, no setting or "
            f"model can change, agents and gateways wait. A majority of the members must run and reach each "
            f"other on their Raft ports; `llmgw ctl members` on each shows who it sees"))
    for r in cluster.members:
        if r.state == "missing":
            yield _c("member_missing", r.id, (
                f"control plane {r.id} is missing: {r.reason}. The group survives one failure fewer "
                f"until it is back; start its `llmgw control`, or replace it (`llmgw ctl members remove`, then add)"))
        elif r.state == "catching up":
            yield _c("member_lagging", r.id, (
                f"control plane {r.id} is behind"
                + (f" by {r.lag} entries" if r.lag is not None else "")
                + f": {r.reason}. It cannot take over until it catches up; check its disk and network"))


def _certificates(rows: Iterable[CertRow], timeouts: Timeouts) -> Iterable[Condition]:
    for c in rows:
        if c.expires_in_s is None or c.expires_in_s >= timeouts.cert_expiring_s:
            continue  # unknown is no failure
        what = f"the intermediate CA {c.name}" if c.role == "ca" else f"the certificate of {c.role} {c.name}"
        if c.expires_in_s <= 0:
            yield _c("cert_expiring", f"{c.role}/{c.name}", (
                f"{what} has expired: " + ("machines it signed are refused; `llmgw ctl ca rotate` on the member "
                                           "holding the root" if c.role == "ca" else
                                           "the machine is refused; join it again with a new token "
                                           "(`llmgw ctl nodes token create`)")), CRITICAL)
            continue
        yield _c("cert_expiring", f"{c.role}/{c.name}", (
            f"{what} expires in {c.expires_in_s / 86400:.1f} days: "
            + ("`llmgw ctl ca rotate` on the member holding the root makes a new one" if c.role == "ca" else
               "machines renew theirs at two thirds of its life over their stream; this one has not (is it "
               "connected? `llmgw ctl nodes certs`)")))


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
