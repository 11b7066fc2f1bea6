"""One view of the cluster: what every reader of a control plane needs, in one object.

A `Context` holds this member's collaborators (the store, the agents' hub, the reconciler, the
member table, the notifier) and answers what routes, console pages, the metrics scrape and the
notifier read: the snapshot, what agents report, the reconciler's last views, the control planes'
table, and `look`, the typed summary with the conditions true now. `look` is computed by one
function (`Look.compute`), so `ctl status`, the Overview, `/metrics` and the webhooks cannot
disagree: they read the same computation of the same inputs.

No HTTP here: `control/api/` adapts this and `control/ops/` to routes.
"""

from __future__ import annotations

import dataclasses
import math
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from llmgw import __version__
from llmgw.control.hub import AgentHub
from llmgw.control.members import Members
from llmgw.control.reconciler import Reconciler
from llmgw.control.status_cache import StatusCache, compute_beside
from llmgw.control.trust import Trust
from llmgw.domain.trust import hash_token
from llmgw.trust.ca import Identity
from llmgw.domain import summary
from llmgw.domain.conditions import Condition, conditions, report_grace_words
from llmgw.domain.observed import BreakerSeen, Observed
from llmgw.domain.state import ClusterState
from llmgw.domain.summary import Summary
from llmgw.domain.timeouts import Timeouts
from llmgw.interfaces import BreakerReport, WritableStore
from llmgw.mirror.sync import MirrorSync
from llmgw.notify.notifier import Notifier
from llmgw.wire.gate import GateStats

LINK_UP = 2  # pysyncobj's word for a connected partner
LOCAL_PREFIX = "llmgw-local-"  # a credential of a machine inside this process (`Context.local_credential`)

Views = Mapping[str, Any]


@dataclass(frozen=True)
class Look:
    """The cluster as one reader sees it at one moment: the typed summary (conditions included) and the
    conditions on their own. Built by `compute` alone, from values taken on the loop, so it may run in a
    worker thread (a scrape at 1,000 nodes does)."""

    summary: Summary
    conditions: tuple[Condition, ...]
    now: float

    @classmethod
    def compute(cls, state: ClusterState, observed: Observed, views: Views | None, cluster: Mapping[str, Any],
                now: float, timeouts: Timeouts, webhooks: Sequence[Mapping[str, Any]]) -> Look:
        """The one computation of the summary and its conditions (webhook health included)."""
        built = summary.summarize(state, observed, views, cluster, now)
        found = conditions(built, now, timeouts=timeouts, webhooks=webhooks, leading_since=observed.since)
        waiting = report_grace_words(observed.since, now, timeouts)  # no alarm yet: status says why
        if waiting:
            built = dataclasses.replace(built, warnings=(waiting, *built.warnings))
        return cls(built.with_conditions(found), tuple(found), now)


@dataclass(frozen=True)
class LookInputs:
    """What `Look.compute` reads, taken on the loop (values and copies): `compute()` may then run anywhere."""

    state: ClusterState
    observed: Observed
    views: Views | None
    cluster: Mapping[str, Any]
    now: float
    timeouts: Timeouts
    webhooks: tuple[Mapping[str, Any], ...]

    def compute(self) -> Look:
        return Look.compute(self.state, self.observed, self.views, self.cluster, self.now, self.timeouts,
                            self.webhooks)


@dataclass
class Context:
    """A control plane's collaborators and the one view of the cluster they make."""

    store: WritableStore
    hub: AgentHub
    reconciler: Reconciler
    clock: Callable[[], float]
    self_id: str = "local"
    store_status: Callable[[], dict[str, Any]] = field(default=lambda: {})
    # The Raft group this member is one of: forwarding to the leader, the member table, changes.
    # None: a store without a group (tests' MemoryStore); this member answers everything itself.
    members: Members | None = None
    # Webhook deliveries by outcome (the notifier's) for GET /metrics; None: none kept.
    webhook_deliveries: Callable[[], Mapping[str, int]] | None = None
    # The admin API's client connections, held and refused (llmgw/wire/gate.py), for GET /metrics; None: none kept.
    connections: Callable[[], GateStats] | None = None
    # The leader's notifier (llmgw/notify): webhook health for the conditions, /api/v1/notify/*; None: none.
    notifier: Notifier | None = None
    # The cluster's CA and this member's certificate (control/trust.py); None: plain HTTP on loopback
    # (`llmgw up`), no machine certificates.
    trust: Trust | None = None

    # Restart this member in place (`POST /api/v1/cluster/self/restart`): given the reason, and the release file to
    # run next (`ctl upgrade`; None: the same one); None: it cannot.
    restart: Callable[[str, Path | None], None] | None = None
    # This member's state dir: where the releases uploaded by `ctl upgrade` are kept (llmgw/release.py); None: none
    # (a test's store without a directory).
    state_dir: Path | None = None
    # Held by an upload's commit (its blob moved in, its `mirror.put` not yet applied) and by each garbage collection
    # of the mirror's blobs, so none deletes a blob whose name is being added (control/ops/mirror.py, mirror/sync.py).
    mirror_lock: trio.Lock = field(default_factory=trio.Lock)
    # This member's mirror pass (pulls from the leader, with their progress and failures); None: none runs.
    mirror_sync: MirrorSync | None = None

    # Machines inside this very process (`llmgw up`'s own agent): a random credential each, held in memory
    # only, by its hash (`local_credential`). Never written, never sent off this host.
    local_machines: dict[str, Identity] = field(default_factory=dict)
    # `GET /api/v1/status`'s last look and its serialized pages (control/status_cache.py).
    status_cache: StatusCache = field(default_factory=StatusCache)

    def local_credential(self, role: str, name: str) -> str:
        """A credential for a machine run inside this process (its stream still goes over loopback):
        `role` `name` only, valid while this process lives."""
        secret = LOCAL_PREFIX + secrets.token_urlsafe(32)
        self.local_machines[hash_token(secret)] = Identity(role, name, "local", math.inf, "local")
        return secret

    # -- the facts, read where they live ---------------------------------------------------------

    def state(self) -> ClusterState:
        return self.store.snapshot()

    def observed(self) -> Observed:
        return self.hub.observed()

    def views(self) -> dict[str, Any] | None:
        """The reconciler's model views of its last pass (None: it has not run in this term)."""
        plan = self.reconciler.last_plan
        return plan.views if plan else None

    def breakers(self) -> list[BreakerSeen]:
        """The replicas the gateways' circuit breakers keep out of rotation now (the one inside this process
        and those following this leader), oldest first."""
        seen = [b for report in self.reconciler.demand if isinstance(report, BreakerReport)
                for b in report.open_breakers_seen()]
        return sorted(seen, key=lambda b: (b.since, b.replica_id, b.gateway))

    @property
    def timeouts(self) -> Timeouts:
        return self.reconciler.timeouts

    def webhook_health(self) -> tuple[Mapping[str, Any], ...]:
        return tuple(self.notifier.health()) if self.notifier is not None else ()

    # -- the control planes' table ---------------------------------------------------------------

    async def cluster(self, authorization: str | None) -> dict[str, Any]:
        """The control planes' table, each member asked with `authorization` (`GET /api/v1/cluster/members`)."""
        if self.members is not None:
            return await self.members.table(authorization)
        st = self.store_status()
        leading = self.store.is_leader()
        leader = st.get("leader") or (self.self_id if leading else None)
        answer = {"role": "leader" if leading else "standby", "leader": leader, "ready": True,
                  "commit_index": st.get("commit_index"), "applied_index": st.get("last_applied"),
                  "revision": self.state().revision}
        return {"leader": leader, "self": self.self_id, "version": __version__,
                "members": summary.member_rows([{"id": self.self_id, "answer": answer}], self.clock())}

    def local_cluster(self) -> dict[str, Any]:
        """The table as this member's Raft links see the group, asking no one (a scrape or the notifier
        carries no admin key to ask with). A partner whose link is down reads as missing."""
        st = self.store_status()
        leading = self.store.is_leader()
        leader = st.get("leader") or (self.self_id if leading else None)
        me = {"role": "leader" if leading else "standby", "leader": leader, "ready": st.get("ready", True),
              "term": st.get("term"), "commit_index": st.get("commit_index"), "applied_index": st.get("last_applied"),
              "revision": self.state().revision}
        views: list[dict[str, Any]] = [{"id": self.self_id, "answer": me}]
        partners: Mapping[str, Any] = st["partners"] if isinstance(st.get("partners"), Mapping) else {}
        match: Mapping[str, Any] = st["match_index"] if isinstance(st.get("match_index"), Mapping) else {}
        for member, link in sorted(partners.items()):
            if link != LINK_UP:
                views.append({"id": member, "error": f"its Raft link to {self.self_id} is down"})
            else:
                views.append({"id": member, "answer": {"role": "leader" if member == leader else "standby",
                                                       "leader": leader, "ready": True,
                                                       "applied_index": match.get(member)}})
        return {"leader": leader, "self": self.self_id, "version": __version__,
                "members": summary.member_rows(views, self.clock())}

    # -- the one view ----------------------------------------------------------------------------

    def look_inputs(self, cluster: Mapping[str, Any], now: float | None = None) -> LookInputs:
        """What a look reads now, taken on the loop."""
        return LookInputs(self.state(), self.observed(), self.views(), cluster,
                          self.clock() if now is None else now, self.timeouts, self.webhook_health())

    def look(self, cluster: Mapping[str, Any], now: float | None = None) -> Look:
        """The summary and conditions now, with `cluster` as the members' table (`cluster()` when a caller's
        key may ask the others, `local_cluster()` when not)."""
        return self.look_inputs(cluster, now).compute()

    async def look_beside(self, cluster: Mapping[str, Any]) -> Look:
        """`look`, built in a worker thread when the fleet is large (`status_cache.compute_beside`)."""
        return await compute_beside(self.look_inputs(cluster))
