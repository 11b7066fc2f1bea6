"""The reconciler loop: snapshot + observations → `decide` → commit, tell agents, route.

Level-triggered: every pass recomputes from the whole state, so a missed event,
a lost message or a restart heals on the next pass. Runs only on the leader; a member
that starts leading adopts the replicas its agents report (placements are in Raft).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import trio

from llmgw.control.hub import AgentHub
from llmgw.control.mirror_starts import MirrorCatalog, catalog_of, with_mirror
from llmgw.domain.commands import CommandError
from llmgw.domain.observed import ModelRoute, Observed
from llmgw.domain.settings import effective
from llmgw.domain.state import ClusterState
from llmgw.domain.timeouts import TIMEOUTS, Timeouts
from llmgw.interfaces import DemandReport, EndpointSink, StateReader, WritableStore
from llmgw.reconcile import Plan, decide
from llmgw.store import NotLeader, StoreUnavailable

log = logging.getLogger("llmgw.control.reconciler")


async def state_or_event(store: StateReader, revision: int, event: trio.Event) -> None:
    """Return when the state moves past `revision` or `event` is set, whichever comes first."""
    async with trio.open_nursery() as nursery:
        async def state_changed() -> None:
            await store.wait_changed(revision)
            nursery.cancel_scope.cancel()

        async def event_set() -> None:
            await event.wait()
            nursery.cancel_scope.cancel()

        nursery.start_soon(state_changed)
        nursery.start_soon(event_set)


@dataclass
class Reconciler:
    store: WritableStore
    hub: AgentHub
    sinks: list[EndpointSink] = field(default_factory=list)
    demand: list[DemandReport] = field(default_factory=list)
    clock: Callable[[], float] = time.time
    timeouts: Timeouts = TIMEOUTS
    # The model mirror: its files by name (control/mirror_starts.py), and the control planes' admin base URLs, the
    # leader's first, where agents fetch them.
    mirror_catalog: MirrorCatalog | None = None  # None: the replicated state's (`ClusterState.mirror`)
    mirror_bases: Callable[[], list[str]] = list
    last_plan: Plan | None = None
    _routes: Mapping[str, ModelRoute] | None = None
    # model -> (the reason last logged, when, passes since that found no placement unlogged)
    _warned: dict[str, tuple[str, float, int]] = field(default_factory=dict)
    _last_used: dict[str, float] = field(default_factory=dict)
    _leading: bool = False
    _inherited: dict[str, str] = field(default_factory=dict)  # replica id -> model, placed before this term
    _held: set[str] = field(default_factory=set)  # inherited replicas whose node has not reported yet

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            hub_event = self.hub.change_event()  # taken before the pass: no change is missed
            revision = self.store.snapshot().revision
            if self._leads():
                try:
                    await self.run_once()
                except Exception:  # a bug in one pass must not end reconciling; the next pass retries
                    log.exception("reconcile pass failed; trying again at the next tick")
            with trio.move_on_after(self.timeouts.reconcile_tick_s):
                await self._next_change(revision, hub_event)

    def _leads(self) -> bool:
        """Whether this member leads now; a change of term starts or ends this member's duties."""
        leading = self.store.is_leader()
        if leading and not self._leading:
            self._take_office()
        elif self._leading and not leading:
            log.info("no longer the leader: the reconciler stops")
            self.hub.release("this member no longer leads")
        self._leading = leading
        return leading

    def _take_office(self) -> None:
        """A new term: adopt, never replace. Placements are in Raft and the replicas run on: agents
        re-attach and report them, and `decide` matches them to their placements. Until then
        nothing this member remembers from an earlier term counts (`_adopt` has the rest)."""
        log.info("leading: adopting the running replicas as their agents report them")
        self.hub.take_office(p.node for p in self.store.snapshot().placements.values())
        self.last_plan, self._routes = None, None  # the first routes of this term go to every sink
        self._last_used.clear()
        self._warned.clear()
        self._inherited = {rid: p.model for rid, p in self.store.snapshot().placements.items()}

    def _adopt(self, state: ClusterState, now: float) -> Observed:
        """The placements this term inherited, until their node reports on its stream to this
        leader: their models count as in use (unknown is not idle: an on-demand model is not
        scaled down because no gateway told this leader of its use yet), and no start is sent for
        them (`_held`). Once reported, a running replica is adopted, its use counted now (it
        idles out after `idle_timeout_s` unless a gateway reports use); one that does not run is
        planned as any other. The hold ends with `lost_node_grace_s`, when an absent node's
        placements go anyway."""
        for rid in [r for r in self._inherited if r not in state.placements]:
            del self._inherited[rid]
        in_grace = now - self.hub.since < self.timeouts.lost_node_grace_s
        held: dict[str, float] = {}
        for rid, model in list(self._inherited.items()):
            reported = self.hub.replicas.get(state.placements[rid].node)
            if reported is None:
                if in_grace:
                    held[model] = now
                continue
            del self._inherited[rid]
            obs = reported.get(rid)
            if obs is not None and obs.state in ("starting", "ready"):
                log.info("adopted replica %s of %s (%s on node %s)", rid, model, obs.state, obs.node)
                self.hub.note_demand(model)
        self._held = {rid for rid in self._inherited if in_grace}
        observed = self.hub.observed()  # with the uses just noted
        return dataclasses.replace(observed, demand={**observed.demand, **held}) if held else observed

    async def _next_change(self, revision: int, hub_event: trio.Event) -> None:
        """Return when the state moves past `revision` or an agent reports something."""
        await state_or_event(self.store, revision, hub_event)

    async def run_once(self) -> Plan:
        """One pass. Returns the plan it acted on (for tests and `status`)."""
        self._collect_demand()
        now = self.clock()
        state = self.store.snapshot()
        observed_at = self.hub.change_event()
        observed = self._adopt(state, now)
        plan = decide(state, observed, now, self.timeouts)
        self.last_plan = plan
        committed: set[str] = set()  # replicas whose removal is in the log: evictions that happened
        for command in plan.commands:
            try:
                await self.store.submit(command)
                if command.get("op") == "placement.remove":
                    committed.add(str(command.get("replica_id")))
                elif command.get("op") == "health.start_failed":
                    self.hub.note_restart(str(command.get("model")))  # the restart storm's count
            except CommandError as e:
                # The state moved under the plan; the next pass replans from the new one.
                log.info("plan step refused (%s): %s", e.code, e.message)
                break
            except (StoreUnavailable, NotLeader) as e:
                log.warning("cannot commit the plan now (%s); retrying on the next pass", e)
                return plan
        for eviction in plan.evictions:
            if eviction.replica_id not in committed:
                continue  # the plan stopped before it: nothing was evicted, nothing to say
            log.warning("replica %s of %s %s", eviction.replica_id, eviction.model, eviction.why)
            self.hub.note_eviction(eviction.model, eviction.why)  # it wants nothing until asked again
        for action in plan.actions:
            if action.replica_id in self._held:
                continue  # its node has not said yet whether it runs it: no start on a guess
            catalog = self.mirror_catalog or catalog_of(self.store.snapshot())
            message = with_mirror(action.message(), catalog, self.mirror_bases())
            if message is None:
                log.info("replica %s waits for this member's admin URL: its mirror file is fetched from there",
                         action.replica_id)
                continue
            if not self.hub.send(action.node, message):
                log.warning("could not tell node %s to %s %s", action.node, action.kind, action.replica_id)
        # Routes only from what agents say now: an agent that reported while the plan was being
        # committed makes the next pass (at once) publish, not this one. A sink may take routes as
        # the word of every agent heard so far (a new leader's first routes to gateways).
        if observed_at is self.hub.change_event():
            self._publish(plan.routes)
        self._warn(plan, now, state)
        return plan

    def _collect_demand(self) -> None:
        """Turn routers' last-used maps and activation asks into per-model demand times. A replica
        is known by its placement (in Raft), not by the last routes: a new leader's first routes
        name no replica yet, and a use reported then must still count."""
        placements = self.store.snapshot().placements
        load: dict[str, int] = {}  # requests in flight per model, every router's summed (scaling reads it)
        for report in self.demand:
            for asked in report.take_activation_asks():
                self.hub.note_demand(asked)
            for rid, used in report.last_used().items():
                placement = placements.get(rid)
                if placement is not None and self._last_used.get(rid) != used:
                    self._last_used[rid] = used
                    self.hub.note_demand(placement.model)
            for model, n in report.outstanding().items():
                load[model] = load.get(model, 0) + n
        self.hub.note_load(load)

    def _publish(self, routes: Mapping[str, ModelRoute]) -> None:
        if routes == self._routes:
            return
        self._routes = routes
        for sink in self.sinks:
            sink.update_routes(routes)

    def _warn(self, plan: Plan, now: float, state: ClusterState) -> None:
        """Log 'no placement' once per model when its reason changes, then at most once per
        `placement.warn_interval_s`, saying how many passes found no placement in between."""
        interval = float(effective(state.settings, "placement.warn_interval_s"))
        # Agents need a moment to connect after control starts.
        if not self.hub.nodes and now - self.hub.since < self.timeouts.reconcile_startup_quiet_s:
            return
        for model, reason in plan.unplaceable.items():
            last = self._warned.get(model)
            if last is None or last[0] != reason:
                log.warning("no placement for %s: %s", model, reason)
                self._warned[model] = (reason, now, 0)
            elif now - last[1] >= interval:
                log.warning("no placement for %s: %s (still; %d more passes found none in the last %.0f s)",
                            model, reason, last[2], now - last[1])
                self._warned[model] = (reason, now, 0)
            else:
                self._warned[model] = (reason, last[1], last[2] + 1)
        for model in list(self._warned):
            if model not in plan.unplaceable:
                del self._warned[model]
