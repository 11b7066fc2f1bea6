"""The control plane's families, built at each scrape from the status summary (`domain.summary.Summary`,
what `ctl status` and GET /api/v1/status read: they cannot disagree) and this member's Raft status. No state
of its own.

The fleet's families (models, replicas, GPUs, nodes, engines, judges, conditions) come from the leader alone:
a standby has no agents, and a 0 from it would read as "nothing ready". Every member says its Raft view.
Unknown is left out, never published as 0 (a model the reconciler has not judged yet has no ready series).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from llmgw import __version__
from llmgw.domain.conditions import Condition
from llmgw.domain.judges import Guard
from llmgw.domain.summary import CertRow, ModelRow, Notify, Summary
from llmgw.metrics.connections import connection_families
from llmgw.metrics.expose import counter, gauge, one
from llmgw.wire.gate import GateStats


@dataclass
class Scrape:
    """What one scrape reads, gathered on the loop in one go (control/api/metrics.py)."""

    self_id: str
    leading: bool
    raft: Mapping[str, Any]  # RaftStore.status(): term, commit_index, last_applied, partners, match_index
    summary: Summary | None = None  # summary.summarize(...): None on a standby
    restarts: Mapping[str, int] = field(default_factory=dict)  # model -> restarts counted (AgentHub.restarts_total)
    conditions: Sequence[Condition] | None = None  # llmgw.domain.conditions' (None on a standby)
    deliveries: Mapping[str, int] | None = None  # webhook deliveries by outcome (llmgw/notify); None: none kept
    connections: GateStats | None = None  # the admin API's client connections (llmgw/wire/gate.py); None: none kept


class ControlCollector(Collector):
    def __init__(self, read: Callable[[], Scrape]) -> None:
        self.read = read

    def collect(self) -> Iterator[Metric]:
        return families(self.read())


def registry_for(read: Callable[[], Scrape]) -> CollectorRegistry:
    """A registry of the control plane's own (never the global one: `llmgw up` also runs a gateway)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ControlCollector(read))
    return registry


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _flag(value: Any) -> float | None:
    return None if value is None else float(bool(value))


def families(s: Scrape) -> Iterator[Metric]:
    yield gauge("llmgw_build_info", "This process's llmgw version and role (always 1).", ("version", "role"),
                [((__version__, "control"), 1.0)])
    yield gauge("llmgw_control_leader", "1 on the member that leads the control planes, 0 on the others; the "
                "fleet's families below come from the leader alone.", (), [((), float(s.leading))])
    yield from raft_families(s.self_id, s.raft)
    if s.connections is not None:
        yield from connection_families(s.connections)
    if s.summary is not None:
        yield from model_families(s.summary, s.restarts)
        yield from fleet_families(s.summary)
        yield from guard_families(s.summary.guard)
        yield from notify_families(s.summary.notify, s.deliveries)
        yield from certificate_families(s.summary.certificates)
    if s.conditions is not None:
        yield gauge("llmgw_condition", "1 for each failure true now, by kind and subject (what alerts and webhooks "
                    "both see; docs/observability.md lists the kinds).", ("kind", "subject", "severity"),
                    sorted({((c.kind, c.subject, c.severity), 1.0) for c in s.conditions}))


def raft_families(self_id: str, raft: Mapping[str, Any]) -> Iterator[Metric]:
    """This member's view of the Raft group: every member exports its own (scrape them all)."""
    yield from one("llmgw_raft_ready", "1 once this member has applied its Raft log and can serve.",
                   _flag(raft.get("ready")) if "ready" in raft else None)
    yield gauge("llmgw_raft_leader_known", "1 when this member knows a leader (0: an election, or it is cut off).",
                (), [((), float(raft.get("leader") is not None))])
    yield from one("llmgw_raft_term", "This member's Raft term.", _num(raft.get("term")))
    yield from one("llmgw_raft_commit_index", "The highest Raft log index this member knows committed.",
                   _num(raft.get("commit_index")))
    yield from one("llmgw_raft_applied_index", "The highest Raft log index this member has applied.",
                   _num(raft.get("last_applied")))
    partners = raft.get("partners") if isinstance(raft.get("partners"), Mapping) else {}
    assert isinstance(partners, Mapping)
    yield gauge("llmgw_raft_members", "Members of the Raft group as this member sees it (itself included).",
                (), [((), float(len(partners) + 1))])
    yield gauge("llmgw_raft_member_connected", "1 when this member's Raft link to that member is up (2 in "
                "pysyncobj's words), 0 when it is not.", ("member",),
                [((str(m),), float(v == 2)) for m, v in sorted(partners.items())])
    commit, lags = _num(raft.get("commit_index")), []
    applied = _num(raft.get("last_applied"))
    if commit is not None and applied is not None:
        lags.append(((self_id,), max(commit - applied, 0.0)))  # its own: committed but not yet applied
    match = raft.get("match_index")
    if raft.get("is_leader") and commit is not None and isinstance(match, Mapping):
        # The leader alone knows how far each follower's log reaches (its match index).
        lags += [((str(m),), max(commit - float(i), 0.0)) for m, i in sorted(match.items()) if _num(i) is not None]
    yield gauge("llmgw_raft_member_lag_entries", "Raft entries a member is behind the commit index: this member's "
                "own apply lag, and on the leader each follower's (commit index minus its match index).",
                ("member",), lags)


def model_families(summary: Summary, restarts: Mapping[str, int]) -> Iterator[Metric]:
    models = summary.models

    def rows(read: Callable[[ModelRow], float | None]) -> list[tuple[Sequence[str], float]]:
        return [((m.name,), v) for m in models if (v := read(m)) is not None]

    yield gauge("llmgw_model_desired_replicas", "Replicas the model should have now (demand, idle and "
                "stop counted); absent until the reconciler has judged it.", ("model",),
                rows(lambda m: _num(m.desired)))
    yield gauge("llmgw_model_ready_replicas", "Ready replicas of the model: published, 0 included, for every "
                "model the reconciler has judged (so 'should run, none ready' can alert).", ("model",),
                rows(lambda m: _num(m.ready)))
    yield gauge("llmgw_model_starting_replicas", "Replicas of the model starting now.", ("model",),
                rows(lambda m: _num(m.starting)))
    yield gauge("llmgw_model_failed_replicas", "Replicas of the model whose agents report a failed start.",
                ("model",), rows(lambda m: _num(m.failed)))
    yield gauge("llmgw_model_consecutive_start_failures", "Failed starts in a row across the model's replicas "
                "(it is parked at the limit).", ("model",), rows(lambda m: float(m.failures_in_row)))
    yield gauge("llmgw_model_parked", "1 while the model is parked after failed starts (`llmgw ctl model retry`).",
                ("model",), rows(lambda m: float(m.parked)))
    yield gauge("llmgw_model_unplaceable", "1 while no node can take the model's replica.", ("model",),
                rows(lambda m: _flag(m.unplaceable)))
    yield gauge("llmgw_model_state", "1 for the model's state now: ready, starting, unplaceable, parked, "
                "stopped, absent or unknown.", ("model", "state"),
                [((m.name, m.state or "unknown"), 1.0) for m in models])
    yield gauge("llmgw_model_recent_restarts", "Restarts of the model's replicas (failed starts, crashes) "
                "within restart_window_s, as `ctl status` counts them (a storm at health.restart_storm_restarts).",
                ("model",), rows(lambda m: float(m.restarts)))
    yield counter("llmgw_model_restarts", "Restarts of the model's replicas (failed starts, crashes) the leader "
                  "counted since it started (a crash loop is a high rate; a new leader counts from 0).", ("model",),
                  [((name,), float(n)) for name, n in sorted(restarts.items())])
    totals = summary.totals
    yield gauge("llmgw_models", "Models by standing: satisfied (has what it should now), short, or unknown "
                "(not judged yet).", ("standing",),
                [(("satisfied",), float(totals.satisfied)), (("short",), float(totals.short)),
                 (("unknown",), float(totals.unknown))])
    replicas = totals.replicas
    yield gauge("llmgw_replicas", "Replicas by state, summed over the models the reconciler has judged.",
                ("state",), [(("ready",), float(replicas.ready)), (("starting",), float(replicas.starting)),
                             (("failed",), float(replicas.failed))])
    yield from one("llmgw_replicas_desired", "Replicas the models should have now, summed.",
                   float(replicas.desired))


def fleet_families(summary: Summary) -> Iterator[Metric]:
    node_rows = summary.nodes
    yield gauge("llmgw_gpus", "Devices of connected nodes by class (MIG instance profiles are classes of their "
                "own) and state: used by a placement, free, unusable (unhealthy or not placeable), or reserved "
                "(kept for other work: llmgw agent --reserve).",
                ("class", "mig", "state"),
                [((c.gpu_class, str(c.mig).lower(), st), float(n)) for c in summary.capacity
                 for st, n in (("used", c.used), ("free", c.free), ("unusable", c.unusable),
                                      ("reserved", c.reserved))])
    unhealthy: dict[str, int] = {}
    for n in node_rows:
        for u in n.gpu_counts.unusable if n.gpu_counts else ():
            if not u.healthy:
                unhealthy[u.gpu_class] = unhealthy.get(u.gpu_class, 0) + 1
    yield gauge("llmgw_gpus_unhealthy", "Devices the probe reports unhealthy, by class (counted in "
                "llmgw_gpus{state=\"unusable\"} too).", ("class",),
                [((k,), float(v)) for k, v in sorted(unhealthy.items())])
    yield gauge("llmgw_node_gpus", "Each connected node's devices: used, free, unusable or reserved.",
                ("node", "state"),
                [((n.node, st), float(v)) for n in node_rows if n.gpu_counts
                 for st, v in (("used", n.gpu_counts.used), ("free", n.gpu_counts.free),
                               ("unusable", len(n.gpu_counts.unusable)),
                               ("reserved", len(n.gpu_counts.reserved)))])
    counts = summary.node_counts
    yield gauge("llmgw_nodes", "Nodes by state: connected, or lost (known but not connected).", ("state",),
                [(("connected",), float(counts.connected)), (("lost",), float(counts.not_connected))])
    yield gauge("llmgw_node_connected", "1 while the node's agent is connected, 0 once lost (until forgotten).",
                ("node",), [((n.node,), float(n.connected)) for n in node_rows])
    yield gauge("llmgw_node_lost_since_timestamp_seconds", "When a lost node's agent went away (unix time).",
                ("node",), [((n.node,), float(n.lost_at)) for n in node_rows if n.lost_at is not None])
    installs: dict[str, int] = {}
    rows: list[tuple[Sequence[str], float]] = []
    for n in node_rows:
        for engine, version in sorted((n.engine_versions or {}).items()):
            rows.append(((n.node, engine, version), 1.0))
            installs[engine] = installs.get(engine, 0) + 1
    yield gauge("llmgw_node_engine_installed", "1 for each engine installed on a connected node, with its version "
                "(\"\": not said).", ("node", "engine", "version"), rows)
    yield gauge("llmgw_engine_installs", "Connected nodes with each engine installed.", ("engine",),
                [((k,), float(v)) for k, v in sorted(installs.items())])
    yield from one("llmgw_serving_stopped", "1 while serving is stopped (`llmgw stop`): every model wants 0.",
                   float(summary.cluster.stopped))
    yield from one("llmgw_state_revision", "The replicated state's revision (commands applied).",
                   float(summary.cluster.revision))
    yield gauge("llmgw_status_warnings", "Warnings `ctl status` prints now (each in words there).", (),
                [((), float(len(summary.warnings)))])


def certificate_families(certificates: tuple[CertRow, ...]) -> Iterator[Metric]:
    """Every certificate the cluster holds for a machine (its newest) and every intermediate CA (role
    "ca"): seconds until it expires (negative: expired). The `cert_expiring` condition is at 7 days."""
    yield gauge("llmgw_cert_expiry_seconds", "Seconds until a certificate in use expires: each machine's newest "
                "(role agent, gateway, control) and each intermediate CA (role ca).", ("role", "name"),
                [((c.role, c.name), float(c.expires_in_s)) for c in certificates if c.expires_in_s is not None])


def guard_families(guard: Guard) -> Iterator[Metric]:
    yield from one("llmgw_guard_enabled", "1 while guardrails are on (guard.enabled), 0 while off.",
                   float(guard.enabled))
    yield from one("llmgw_guard_policies", "Guard policies defined.", float(guard.policies))
    yield gauge("llmgw_judge_status", "1 for each judge model's status: ok, failing, down, missing, not_a_judge "
                "or unknown.", ("judge", "status"), [((j.model, j.status), 1.0) for j in guard.judges])
    yield gauge("llmgw_judge_last_failure_timestamp_seconds", "When a gateway last reported the judge failing "
                "to answer (unix time).", ("judge",),
                [((j.model,), float(j.last_failure_at)) for j in guard.judges if j.last_failure_at is not None])


def notify_families(notify: Notify, deliveries: Mapping[str, int] | None) -> Iterator[Metric]:
    yield from one("llmgw_webhooks_configured", "Webhook URLs in notify.webhooks.", float(notify.webhooks))
    yield counter("llmgw_webhook_deliveries", "Webhook deliveries by outcome, since this leader began.",
                  ("outcome",), [((k,), float(v)) for k, v in sorted((deliveries or {}).items())])
