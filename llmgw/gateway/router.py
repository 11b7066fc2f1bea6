"""The gateway's routing table: least-outstanding pick among a model's ready endpoints in rotation, or, for a
request with an affinity key, the replica its key hashes to on the model's ring (bounded load: affinity.py).

Implements `EndpointSink` (control pushes routes in), `DemandReport` (last-used times, activation asks
and requests in flight out) and `BreakerReport` (its open circuit breakers out). A replica that refused a
connection leaves the rotation (its fast failures would otherwise keep its count lowest and draw every
request) until a probe reaches it: every `upstream_refused_probe_s` one request tries it again, or
control's table gives it a new address.
A replica that fails requests (5xx answers, timeouts, broken connections) `gateway.breaker_failures` times in
a row is left out the same way by its circuit breaker (gateway/breaker.py) until a probe answers again.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from operator import itemgetter
from dataclasses import dataclass
from types import TracebackType
from typing import Mapping

import trio

from llmgw.domain import activation
from llmgw.domain.activation import Progress
from llmgw.domain.observed import BreakerSeen, Endpoint, ModelRoute
from llmgw.domain.timeouts import TIMEOUTS
from llmgw.gateway.affinity import DEFAULT_LOAD_FACTOR, Ring, load_bound
from llmgw.gateway.breaker import Breaker, BreakerOpen

_log = logging.getLogger("llmgw.gateway.router")
_first = itemgetter(0)

# Route states that refuse instead of letting a request wait: waiting would only
# make clients retry forever (S4). "stopped" refuses only waiters (see `_wait_pick`).
_FAIL_CODES = {"parked": "model_parked", "unplaceable": "model_unplaceable", "stopped": "system_stopped"}


class NoEndpoint(Exception):
    """No replica can take the request; `code` is the gateway error code (S14), `message` says why.
    `model_activating` (a client that does not wait that long) has the model's `activation`, as of `now`
    (wall clock), and `retry_after` (whole seconds)."""

    def __init__(self, code: str, message: str, *, activation: Progress | None = None, now: float = 0.0,
                 retry_after: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.activation = activation
        self.now = now
        self.retry_after = retry_after


@dataclass(frozen=True)
class RouterStatistics:
    outstanding: dict[str, int]  # model -> requests in flight to its current replicas
    replicas: dict[str, int]  # replica id -> requests in flight
    waiting: dict[str, int]  # model -> requests waiting for an activation


class _Slot:
    """One replica's live counters. Holders keep a reference, so a release after the
    replica vanished (or came back as a new slot) can never skew the current count."""

    __slots__ = ("endpoint", "outstanding", "last_used", "probe_at", "breaker", "model_load")

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.outstanding = 0
        self.last_used: float | None = None
        self.probe_at: float | None = None  # out of rotation (it refused a connection) until a probe at this time
        self.breaker = Breaker()  # out of rotation while open (it failed requests), but for its probes
        # The requests in flight to the model's replicas, one cell its slots share (set at each route update):
        # the mean bounded load compares with, without a sum over the replicas per pick.
        self.model_load = [0]

    def take(self, now: float) -> None:
        self.outstanding += 1
        self.model_load[0] += 1
        self.last_used = now

    def release(self) -> None:
        self.outstanding -= 1
        self.model_load[0] -= 1


class Lease:
    """An acquired endpoint; `async with router.acquire(...) as endpoint` releases it on exit."""

    __slots__ = ("_router", "_model", "_deadline", "_slot", "_max_waiting", "_patience", "_affinity", "_load_factor")

    def __init__(self, router: Router, model: str, deadline: float, max_waiting: int | None = None,
                 patience: float | None = None, affinity: int | None = None,
                 load_factor: float = DEFAULT_LOAD_FACTOR) -> None:
        self._router = router
        self._model = model
        self._deadline = deadline
        self._max_waiting = max_waiting
        self._patience = patience
        self._affinity = affinity
        self._load_factor = load_factor
        self._slot: _Slot | None = None

    async def __aenter__(self) -> Endpoint:
        self._slot = await self._router._wait_pick(self._model, self._deadline, self._max_waiting, self._patience,
                                                   self._affinity, self._load_factor)
        # No checkpoint between the increment and here, so a cancellation cannot leak a count.
        return self._slot.endpoint

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        slot, self._slot = self._slot, None
        if slot is not None:
            slot.release()

    def refused(self, move: bool = True) -> Endpoint | None:
        """The held replica refused a connection (nothing was sent): take it out of rotation and, when
        `move`, hold another ready replica of the model instead, if there is one (None: this lease
        holds nothing)."""
        slot, self._slot = self._slot, None
        if slot is None:
            return None
        slot.release()
        router = self._router
        slot.probe_at = trio.current_time() + router.probe_s
        _log.warning("replica %s of model %s refuses connections: out of rotation", slot.endpoint.replica_id,
                     self._model)
        self._slot = router._pick_nowait(self._model, slot, self._affinity, self._load_factor) if move else None
        return self._slot.endpoint if self._slot is not None else None

    def failed(self, reason: str, failures: int) -> None:
        """The held replica failed the request (`reason`: a 5xx answer, a timeout, a broken connection): counted
        by its circuit breaker, which opens at `failures` in a row."""
        slot = self._slot
        if slot is None:
            return
        router = self._router
        if slot.breaker.failed(trio.current_time(), reason, failures, router.breaker_open_s):
            _log.warning("replica %s of model %s failed %d requests in a row (last: %s): circuit breaker open, "
                         "out of rotation", slot.endpoint.replica_id, self._model, slot.breaker.consecutive, reason)

    def answered(self) -> None:
        """The held replica answered (below 500): its breaker closes if it was open."""
        slot = self._slot
        if slot is not None and slot.breaker.succeeded():
            _log.info("replica %s of model %s answers again: circuit breaker closed, back in rotation",
                      slot.endpoint.replica_id, self._model)

    def move(self) -> Endpoint | None:
        """Hold another replica of the model in rotation instead of this one (the request is sent once more
        there); None when there is none (this lease then holds nothing)."""
        slot, self._slot = self._slot, None
        if slot is None:
            return None
        slot.release()
        self._slot = self._router._pick_nowait(self._model, slot, self._affinity, self._load_factor)
        return self._slot.endpoint if self._slot is not None else None

    def reached(self) -> None:
        """The held replica accepted a connection: back in rotation if it was out."""
        slot = self._slot
        if slot is not None and slot.probe_at is not None:
            slot.probe_at = None
            _log.info("replica %s of model %s answers again: back in rotation", slot.endpoint.replica_id,
                      self._model)


class Router:
    """In-memory routing table of one gateway process; every method runs in the trio thread."""

    def __init__(self, probe_s: float = TIMEOUTS.upstream_refused_probe_s,
                 breaker_open_s: float = TIMEOUTS.breaker_open_s, name: str = "local",
                 retry_after_s: float = TIMEOUTS.activation_retry_after_s,
                 wall: Callable[[], float] = time.time, ask_wake_s: float = TIMEOUTS.gateway_demand_report_s) -> None:
        self.probe_s = probe_s
        self.name = name  # as control names this gateway where it shows its open breakers
        self.breaker_open_s = breaker_open_s
        self.retry_after_s = retry_after_s  # told to a client that does not wait, when the ETA is unknown
        self._wall = wall  # the clock of the activations' `since` (control's, in seconds since the epoch)
        self._routes: dict[str, ModelRoute] = {}
        self._slots: dict[str, _Slot] = {}  # replica id -> slot
        self._by_model: dict[str, list[_Slot]] = {}
        self._rotation: dict[str, int] = {}
        self._asks: dict[str, float] = {}
        # Called at a model's first ask since the last `take_activation_asks` (at most once per `ask_wake_s` per
        # model): whoever reads the asks reads them now, not at its next round. Set (`on_ask`) by who reads them:
        # the control plane in this process (`llmgw up`: the reconciler's wake), or the follower's demand report.
        self._wake: Callable[[], None] = lambda: None
        self.ask_wake_s = ask_wake_s
        self._woken: dict[str, float] = {}  # model -> when its last ask called `wake`
        self._waiting: dict[str, int] = {}
        self._changed = trio.Event()
        self._turn = 0  # spreads a group alias's ties (`least_loaded`)
        # Model -> its ring and the slots in the ring's id order; made at a model's first request with an
        # affinity key, made again at a route update only when its set of replicas changed.
        self._rings: dict[str, tuple[Ring, list[_Slot]]] = {}

    # --- EndpointSink ---------------------------------------------------------

    def update_routes(self, routes: Mapping[str, ModelRoute]) -> None:
        """Replace the table; replicas that persist keep their counters, vanished ones are forgotten."""
        slots: dict[str, _Slot] = {}
        by_model: dict[str, list[_Slot]] = {}
        for name, route in routes.items():
            model_slots = []
            for endpoint in route.endpoints:
                slot = self._slots.get(endpoint.replica_id)
                if slot is None:
                    slot = _Slot(endpoint)
                else:
                    if slot.endpoint.url != endpoint.url:
                        slot.probe_at = None  # a new address (a restart): worth trying at once
                    slot.endpoint = endpoint  # a restarted replica may listen on a new port
                slots[endpoint.replica_id] = slot
                model_slots.append(slot)
            by_model[name] = model_slots
            load = [sum(s.outstanding for s in model_slots)]
            for slot in model_slots:
                slot.model_load = load
        self._routes = dict(routes)
        self._slots = slots
        self._by_model = by_model
        self._rotation = {m: n for m, n in self._rotation.items() if m in by_model}
        self._woken = {m: t for m, t in self._woken.items() if m in routes}
        rings: dict[str, tuple[Ring, list[_Slot]]] = {}
        for name, (ring, _) in self._rings.items():
            current = by_model.get(name)
            if not current:
                continue
            ids = sorted(s.endpoint.replica_id for s in current)
            if ring.ids != tuple(ids):
                ring = Ring(ids)  # replicas joined or left
            rings[name] = (ring, [slots[rid] for rid in ring.ids])
        self._rings = rings
        changed, self._changed = self._changed, trio.Event()
        changed.set()
        _log.debug("routes: %d models, %d ready endpoints", len(by_model), len(slots))

    # --- DemandReport ---------------------------------------------------------

    def last_used(self) -> dict[str, float]:
        """Replica id -> last acquire time (trio clock); absent means unknown, never idle."""
        return {rid: s.last_used for rid, s in self._slots.items() if s.last_used is not None}

    def on_ask(self, wake: Callable[[], None]) -> None:
        self._wake = wake

    def take_activation_asks(self) -> dict[str, float]:
        asks, self._asks = self._asks, {}
        return asks

    def _ask(self, model: str, now: float) -> None:
        """Record a request that found no ready replica of `model`; wake the reader of asks if it is news."""
        news = model not in self._asks and now - self._woken.get(model, -math.inf) >= self.ask_wake_s
        self._asks[model] = now
        if news:
            self._woken[model] = now
            self._wake()

    def outstanding(self) -> dict[str, int]:
        """Model -> requests in flight to its replicas or waiting for one (the load scaling reads)."""
        load = {m: n for m, slots in self._by_model.items() if (n := sum(s.outstanding for s in slots))}
        for m, n in self._waiting.items():
            load[m] = load.get(m, 0) + n
        return load

    def open_breakers(self) -> dict[str, BreakerOpen]:
        """Replica id -> its open circuit breaker (why, since when); absent: closed."""
        return {rid: state for rid, s in self._slots.items() if (state := s.breaker.state()) is not None}

    # --- BreakerReport --------------------------------------------------------

    def breaker_report(self) -> dict[str, dict[str, object]]:
        """The open breakers as a remote gateway sends them up (ages: the leader's clock is not ours):
        replica id -> {"model", "reason", "open_s", "half_open"}."""
        now = trio.current_time()
        report: dict[str, dict[str, object]] = {}
        for model, slots in self._by_model.items():
            for slot in slots:
                if (state := slot.breaker.state()) is not None:
                    report[slot.endpoint.replica_id] = {"model": model, "reason": state.reason,
                                                        "open_s": round(now - state.since, 3),
                                                        "half_open": state.half_open}
        return report

    def open_breakers_seen(self) -> list[BreakerSeen]:
        """The open breakers of this router as control shows them (the gateway inside a control plane)."""
        wall, now = time.time(), trio.current_time()
        return [BreakerSeen(model, slot.endpoint.replica_id, self.name, state.reason, wall - (now - state.since),
                            state.half_open)
                for model, slots in self._by_model.items() for slot in slots
                if (state := slot.breaker.state()) is not None]

    # --- the request path -----------------------------------------------------

    def route(self, model: str) -> ModelRoute | None:
        return self._routes.get(model)

    def acquire(self, model: str, *, deadline: float, max_waiting: int | None = None,
                patience: float | None = None, affinity: int | None = None,
                load_factor: float = DEFAULT_LOAD_FACTOR) -> Lease:
        """Hold the least-loaded ready endpoint of `model` for the `async with` block; with an `affinity` key
        (affinity.affinity_key), the replica the key hashes to on the model's ring unless it holds more than
        `load_factor` above the mean (then the next one clockwise that does not).

        With none ready, records an activation ask and waits for a route update
        until `deadline` (trio clock). Raises `NoEndpoint` at once for a parked or
        unplaceable model, when the route turns stopped while waiting (see
        `_wait_pick`), or when `max_waiting` requests already wait for the model
        (`overloaded`), and `activation_timeout` at the deadline. `patience`: the
        client waits at most this long (`x-llmgw-wait`): `model_activating` at once
        when it is 0 or the activation's ETA is longer, or when it runs out first.
        """
        return Lease(self, model, deadline, max_waiting, patience, affinity, load_factor)

    def window_s(self, model: str, own_s: float) -> float:
        """The activation window in force: the definition's `own_s`, or the route's when longer (a large
        checkpoint's, as control estimates it)."""
        route = self._routes.get(model)
        return own_s if route is None or route.window_s <= own_s else route.window_s

    def least_loaded(self, models: tuple[str, ...]) -> list[str]:
        """A group alias's models in the order to try them: fewest requests in flight per ready replica first,
        those with no ready replica last; ties in turn (a rotating start). O(their replicas)."""
        self._turn = turn = (self._turn + 1) % len(models)
        loads = []
        for model in models[turn:] + models[:turn]:
            slots = self._by_model.get(model)
            loads.append((sum(s.outstanding for s in slots) / len(slots) if slots else math.inf, model))
        loads.sort(key=_first)  # stable: equal loads keep their turn
        return [model for _, model in loads]

    def statistics(self) -> RouterStatistics:
        per_model = {m: sum(s.outstanding for s in slots) for m, slots in self._by_model.items()}
        return RouterStatistics(
            outstanding=per_model,
            replicas={rid: s.outstanding for rid, s in self._slots.items()},
            waiting={m: n for m, n in self._waiting.items() if n},
        )

    def _pick_nowait(self, model: str, exclude: _Slot | None = None, affinity: int | None = None,
                     load_factor: float = DEFAULT_LOAD_FACTOR) -> _Slot | None:
        """Pick, count and timestamp in one synchronous step (trio's single thread is the lock).

        With an `affinity` key, the ring's pick among the replicas in rotation (`Ring.pick`). Else, or when
        that finds none, least outstanding among the replicas in rotation; one out of rotation (refused a
        connection, or its circuit breaker is open) whose probe is due counts as in rotation (and its next
        probe moves on, so one request probes it, not a burst); with none in rotation, the least outstanding
        of the others (its request fails fast or finds it back)."""
        slots = self._by_model.get(model)
        if not slots:
            return None
        now = trio.current_time()
        n = len(slots)
        if affinity is not None and n > 1:
            ring = self._rings.get(model)
            if ring is None:
                made = Ring([s.endpoint.replica_id for s in slots])
                ring = self._rings[model] = (made, [self._slots[rid] for rid in made.ids])
            # The mean over every replica of the model, those out of rotation too (they hold few: a bound a
            # little tighter), so a pick costs no pass over the replicas.
            bound = load_bound(slots[0].model_load[0], n, load_factor)
            ring_slots = ring[1]
            for i in ring[0].walk(affinity):
                chosen = ring_slots[i]
                if (chosen.outstanding < bound and chosen is not exclude
                        and (chosen.probe_at is None or chosen.probe_at <= now) and chosen.breaker.admits(now)):
                    if chosen.probe_at is not None:
                        chosen.probe_at = now + self.probe_s
                    chosen.breaker.probe(now, self.breaker_open_s)
                    chosen.take(now)
                    return chosen
        start = self._rotation.get(model, 0) % n
        # Scanning from a rotating start spreads ties round-robin.
        best: _Slot | None = None
        fallback: _Slot | None = None
        for i in range(n):
            slot = slots[(start + i) % n]
            if slot is exclude:
                continue
            if (slot.probe_at is not None and slot.probe_at > now) or not slot.breaker.admits(now):
                if fallback is None or slot.outstanding < fallback.outstanding:
                    fallback = slot
            elif best is None or slot.outstanding < best.outstanding:
                best = slot
        best = best or fallback
        if best is None:
            return None
        if best.probe_at is not None:
            best.probe_at = now + self.probe_s
        best.breaker.probe(now, self.breaker_open_s)
        self._rotation[model] = start + 1
        best.take(now)
        return best

    def _route_state(self, model: str) -> str | None:
        route = self._routes.get(model)
        return route.state if route is not None else None

    def _pick_or_refuse(self, model: str, *, stopped_refuses: bool, affinity: int | None = None,
                        load_factor: float = DEFAULT_LOAD_FACTOR) -> _Slot | None:
        """A counted slot; None when the model may still become ready; NoEndpoint when it will not."""
        slot = self._pick_nowait(model, None, affinity, load_factor)
        if slot is not None:
            return slot
        route = self._routes.get(model)
        if route is not None and route.state == "absent" and route.off_until is not None:
            # Its schedule allows no replica now: no activation could serve it, so it is refused at once and not
            # asked for (`Retry-After`: when the rule ends; none when no end was found).
            left = route.off_until - self._wall()
            raise NoEndpoint("model_scheduled_off", f"model {model!r} is off by its schedule: {route.reason}",
                             retry_after=max(1, math.ceil(left)) if route.off_until and left < 1e7 else None)
        code = _FAIL_CODES.get(route.state) if route is not None else None
        if route is None or code is None or (code == "system_stopped" and not stopped_refuses):
            return None
        if code == "model_unplaceable":
            # Still count the demand: capacity may free up, and an on-demand model
            # nobody is seen asking for would never be tried again.
            self._ask(model, trio.current_time())
        raise NoEndpoint(code, _refusal_words(model, route))

    def _activating(self, model: str, why: str) -> NoEndpoint:
        """`model_activating`: the model's progress (phase `placing` when its route says none), words and a
        `Retry-After` from its ETA."""
        route = self._routes.get(model)
        progress = route.activation if route is not None and route.activation is not None else Progress("placing")
        now = self._wall()
        retry = activation.retry_after_s(progress, now, self.retry_after_s)
        return NoEndpoint("model_activating", f"model {model!r} has no ready replica: {progress.words(now)}; {why}; "
                                              f"retry after {retry} s", activation=progress, now=now, retry_after=retry)

    async def _wait_pick(self, model: str, deadline: float, max_waiting: int | None = None,
                         patience: float | None = None, affinity: int | None = None,
                         load_factor: float = DEFAULT_LOAD_FACTOR) -> _Slot:
        # The gateway refuses requests itself while `serving.stopped` is set, so a
        # request that finds a "stopped" route has outrun the control plane's push
        # after a start: it waits. A route that turns stopped under waiters fails them.
        seen = self._route_state(model)
        slot = self._pick_or_refuse(model, stopped_refuses=False, affinity=affinity, load_factor=load_factor)
        if slot is not None:
            return slot
        started = trio.current_time()
        self._ask(model, started)  # also when the client does not wait: its ask starts the model
        budgeted = False  # the client's patience ends the wait before the window does
        if patience is not None:
            progress = self._routes[model].activation if model in self._routes else None
            eta = progress.eta_s(self._wall()) if progress is not None else None
            if patience <= 0:
                raise self._activating(model, "the request does not wait (x-llmgw-wait: false)")
            if eta is not None and eta > patience:
                raise self._activating(model, f"it will not be ready within the {patience:g} s the request waits "
                                              f"(x-llmgw-wait)")
            budgeted = started + patience < deadline
            deadline = min(deadline, started + patience)
        waiting = self._waiting.get(model, 0)
        if max_waiting is not None and waiting >= max_waiting:  # each waiter holds a connection and its body
            raise NoEndpoint("overloaded", f"{waiting} requests already wait for model {model!r} to start "
                                           "(gateway.activation_queue_per_model); retry later")
        self._waiting[model] = waiting + 1
        try:
            while True:
                with trio.move_on_at(deadline):
                    await self._changed.wait()
                slot = self._pick_or_refuse(model, stopped_refuses=seen != "stopped", affinity=affinity,
                                            load_factor=load_factor)
                if slot is not None:
                    return slot
                seen = self._route_state(model)
                if trio.current_time() >= deadline:
                    if budgeted:
                        raise self._activating(model, f"not ready within the {patience:g} s the request waits "
                                                      f"(x-llmgw-wait)")
                    state = seen or "unknown to this gateway"
                    waited = max(0.0, deadline - started)
                    raise NoEndpoint(
                        "activation_timeout",
                        f"model {model!r} has no ready replica after waiting {waited:.{0 if waited >= 10 else 1}f} s"
                        f" for its activation (state: {state}); retry later",
                    )
        finally:
            self._waiting[model] -= 1
            if not self._waiting[model]:
                del self._waiting[model]


def _refusal_words(model: str, route: ModelRoute) -> str:
    reason = route.reason.strip()
    if route.state == "parked":
        head = f"model {model!r} is parked after repeated start failures and will not be started until it is retried"
    elif route.state == "unplaceable" and route.base:
        head = f"LoRA adapter {model!r} is loaded on no replica of its base model {route.base!r}"
    elif route.state == "unplaceable":
        head = f"model {model!r} cannot be placed on any node"
    else:
        head = "the system is stopped: no model is being served"
    return f"{head}: {reason}" if reason else head
