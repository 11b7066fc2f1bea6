"""The reconciler loop: snapshot + observations → `decide` → commit, tell agents, route.

Level-triggered: every pass recomputes from the whole state, so a missed event,
a lost message or a restart heals on the next pass. Runs only on the leader.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import trio

from llmgw.control.hub import AgentHub
from llmgw.domain.commands import CommandError
from llmgw.domain.observed import ModelRoute
from llmgw.domain.settings import effective
from llmgw.domain.state import ClusterState
from llmgw.domain.timeouts import TIMEOUTS, Timeouts
from llmgw.interfaces import DemandReport, EndpointSink, WritableStore
from llmgw.reconcile import Plan, decide
from llmgw.store import NotLeader, StoreUnavailable

log = logging.getLogger("llmgw.control.reconciler")


@dataclass
class Reconciler:
    store: WritableStore
    hub: AgentHub
    sinks: list[EndpointSink] = field(default_factory=list)
    demand: list[DemandReport] = field(default_factory=list)
    clock: Callable[[], float] = time.time
    timeouts: Timeouts = TIMEOUTS
    last_plan: Plan | None = None
    _routes: Mapping[str, ModelRoute] | None = None
    _warned: dict[str, tuple[str, float]] = field(default_factory=dict)
    _last_used: dict[str, float] = field(default_factory=dict)

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            hub_event = self.hub.change_event()  # taken before the pass: no change is missed
            revision = self.store.snapshot().revision
            if self.store.is_leader():
                await self.run_once()
            with trio.move_on_after(self.timeouts.reconcile_tick_s):
                await self._next_change(revision, hub_event)

    async def _next_change(self, revision: int, hub_event: trio.Event) -> None:
        """Return when the state moves past `revision` or an agent reports something."""
        async with trio.open_nursery() as nursery:
            async def state_changed() -> None:
                await self.store.wait_changed(revision)
                nursery.cancel_scope.cancel()

            async def hub_changed() -> None:
                await hub_event.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(state_changed)
            nursery.start_soon(hub_changed)

    async def run_once(self) -> Plan:
        """One pass. Returns the plan it acted on (for tests and `status`)."""
        self._collect_demand()
        now = self.clock()
        state = self.store.snapshot()
        plan = decide(state, self.hub.observed(), now, self.timeouts)
        self.last_plan = plan
        for command in plan.commands:
            try:
                await self.store.submit(command)
            except CommandError as e:
                # The state moved under the plan; the next pass replans from the new one.
                log.info("plan step refused (%s): %s", e.code, e.message)
                break
            except (StoreUnavailable, NotLeader) as e:
                log.warning("cannot commit the plan now (%s); retrying on the next pass", e)
                return plan
        for action in plan.actions:
            if not self.hub.send(action.node, action.message()):
                log.warning("could not tell node %s to %s %s", action.node, action.kind, action.replica_id)
        self._publish(plan.routes)
        self._warn(plan, now, state)
        return plan

    def _collect_demand(self) -> None:
        """Turn routers' last-used maps and activation asks into per-model demand times."""
        plan = self.last_plan
        replica_model = {r.replica_id: m for m, route in (plan.routes.items() if plan else ()) for r in route.endpoints}
        for report in self.demand:
            for asked in report.take_activation_asks():
                self.hub.note_demand(asked)
            for rid, used in report.last_used().items():
                if self._last_used.get(rid) != used:
                    self._last_used[rid] = used
                    model = replica_model.get(rid)
                    if model is not None:
                        self.hub.note_demand(model)

    def _publish(self, routes: Mapping[str, ModelRoute]) -> None:
        if routes == self._routes:
            return
        self._routes = routes
        for sink in self.sinks:
            sink.update_routes(routes)

    def _warn(self, plan: Plan, now: float, state: ClusterState) -> None:
        """Log 'no placement' when its reason changes or every warn interval, not every pass."""
        interval = float(effective(state.settings, "placement.warn_interval_s"))
        # Agents need a moment to connect after control starts.
        if not self.hub.nodes and now - self.hub.since < self.timeouts.reconcile_startup_quiet_s:
            return
        for model, reason in plan.unplaceable.items():
            last = self._warned.get(model)
            if last is None or last[0] != reason or now - last[1] >= interval:
                log.warning("no placement for %s: %s", model, reason)
                self._warned[model] = (reason, now)
        for model in list(self._warned):
            if model not in plan.unplaceable:
                del self._warned[model]
