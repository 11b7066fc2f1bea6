"""The leader's notifier: the conditions of each check in, one event per start and resolution out to every
webhook, each webhook served by its own task from its own bounded queue (a slow or dead endpoint delays
nothing else), retried with backoff, the outcome of each delivery kept in memory (`status()`).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import trio

from llmgw.domain.conditions import CRITICAL, Condition
from llmgw.domain.timeouts import TIMEOUTS, Timeouts
from llmgw.notify.hooks import TEST_CONDITION, Event, Webhook, body

log = logging.getLogger("llmgw.notify")

ATTEMPTS = 5  # tries per event and webhook (waits between them: notify_retry_first_s, doubling)
FAILING_AFTER = 3  # failed attempts in a row after which a webhook is failing (a condition)
QUEUE_MAX = 100  # events waiting per webhook; past it the oldest is dropped (and counted)
KEPT_DELIVERIES = 20  # finished deliveries kept per webhook for `ctl notify status`
ERROR_MAX_CHARS = 300
# The conditions of the group itself that a new leader sees while its Raft links to the others are still
# connecting (a member starting, an election just won): posted only once this leader has led for
# `notify_election_settle_s` and they are still true.
SETTLING_KINDS = frozenset({"member_missing", "member_lagging"})

# POST `body` (JSON) to `url`; returns the HTTP status, raises when no answer came. The seam tests fill
# with a real loopback server; the default is httpx's (`notify.watch.http_post`).
Post = Callable[[str, bytes], Awaitable[int]]


@dataclass
class Delivery:
    """One event's delivery to one webhook."""

    event: str
    kind: str
    subject: str
    queued_at: float
    outcome: str = "queued"  # queued, sending, retrying, delivered, failed, dropped
    attempts: int = 0
    status: int | None = None  # the last attempt's HTTP status (None: no answer)
    error: str = ""
    finished_at: float | None = None

    def doc(self) -> dict[str, Any]:
        return {"event": self.event, "kind": self.kind, "subject": self.subject, "queued_at": self.queued_at,
                "outcome": self.outcome, "attempts": self.attempts, "status": self.status, "error": self.error,
                "finished_at": self.finished_at}


@dataclass
class _Outbox:
    hook: Webhook
    queue: deque[tuple[Event, Delivery]] = field(default_factory=deque)
    history: deque[Delivery] = field(default_factory=lambda: deque(maxlen=KEPT_DELIVERIES))
    wake: trio.Event = field(default_factory=trio.Event)
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    in_flight: Delivery | None = None
    delivered: int = 0
    failed: int = 0
    dropped: int = 0
    attempts: int = 0
    failures_in_row: int = 0
    last_error: str = ""
    last_ok_at: float | None = None
    last_failure_at: float | None = None

    def health(self) -> dict[str, Any]:
        return {"id": self.hook.id, "failing": self.failures_in_row >= FAILING_AFTER,
                "failures_in_row": self.failures_in_row, "last_error": self.last_error,
                "queued": len(self.queue) + (self.in_flight is not None), "dropped": self.dropped}


@dataclass
class _Active:
    condition: Condition
    since: float
    clear_since: float | None = None  # when it was first seen gone (resolved once gone notify_resolve_hold_s)


class Notifier:
    """Run `run()` in a nursery first; then, while leading, `configure()` and `observe()` each check."""

    def __init__(self, post: Post, *, clock: Callable[[], float] = time.time, timeouts: Timeouts = TIMEOUTS,
                 cluster: Callable[[], Mapping[str, Any]] = dict, queue_max: int = QUEUE_MAX) -> None:
        self._post = post
        self._clock = clock
        self._timeouts = timeouts
        self._cluster = cluster
        self._queue_max = queue_max
        self._boxes: dict[str, _Outbox] = {}
        self._active: dict[tuple[str, str], _Active] = {}
        self._totals = {"delivered": 0, "failed": 0, "dropped": 0}
        self._nursery: trio.Nursery | None = None
        self.conditions: list[Condition] = []  # the last check's (leader only; [] on a standby)
        self.checked_at: float | None = None
        self.leading_since: float | None = None  # the first check of this term of leading

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hold the webhooks' tasks until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    # -- what the leader's check calls -----------------------------------------------------------

    def configure(self, hooks: Iterable[Webhook]) -> None:
        """The webhooks in force (the setting, live): a new one gets its task, a removed one's task ends
        and its queue goes."""
        if self._nursery is None:
            raise RuntimeError("Notifier.run() is not running")
        wanted = {h.url: h for h in hooks}
        for url, box in list(self._boxes.items()):
            if url not in wanted:
                box.scope.cancel()
                del self._boxes[url]
        for url, hook in wanted.items():
            if url in self._boxes:
                self._boxes[url].hook = hook  # its format may have changed: the next body uses the new one
            else:
                self._boxes[url] = _Outbox(hook)
                self._nursery.start_soon(self._work, self._boxes[url])

    def observe(self, found: Iterable[Condition], now: float) -> None:
        """The conditions true now. A new one is posted at once ("started"; again when its severity rises
        to critical); one gone is posted "resolved" once it has stayed gone `notify_resolve_hold_s`, and
        nothing is posted if it comes back before: a condition flapping within the hold is one event.
        The group's own conditions (`SETTLING_KINDS`) wait until this leader has led `notify_election_settle_s`:
        links still connecting after an election or a start are no failure."""
        self.conditions, self.checked_at = sorted(found), now
        if self.leading_since is None:
            self.leading_since = now
        settling = now < self.settled_at()
        seen = set()
        for c in self.conditions:
            seen.add(c.key)
            active = self._active.get(c.key)
            if active is None:
                if settling and c.kind in SETTLING_KINDS:
                    continue
                self._active[c.key] = _Active(c, now)
                self._emit(Event("started", c, now, since=now, cluster=self._cluster()))
                continue
            if c.severity == CRITICAL and active.condition.severity != CRITICAL:
                self._emit(Event("started", c, now, since=active.since, cluster=self._cluster()))
            active.condition, active.clear_since = c, None
        for key, active in list(self._active.items()):
            if key in seen:
                continue
            if active.clear_since is None:
                active.clear_since = now
            if now - active.clear_since >= self._timeouts.notify_resolve_hold_s:
                del self._active[key]
                self._emit(Event("resolved", active.condition, now, since=active.since, cluster=self._cluster()))

    def step_down(self) -> None:
        """No longer the leader: forget the conditions (the next leader posts what it finds). Events
        already queued are still delivered."""
        self._active.clear()
        self.conditions, self.checked_at, self.leading_since = [], None, None

    def settled_at(self) -> float:
        """When this leader's group conditions are posted from (inf: not leading)."""
        if self.leading_since is None:
            return float("inf")
        return self.leading_since + self._timeouts.notify_election_settle_s

    async def test(self) -> list[dict[str, Any]]:
        """Post a test event to every webhook at once, one attempt each (within `notify_post_s`); each
        outcome, kept like any delivery."""
        event = Event("test", TEST_CONDITION, self._clock(), cluster=self._cluster())
        out: dict[str, dict[str, Any]] = {}

        async def one(box: _Outbox) -> None:
            d = Delivery("test", "test", "", event.at, outcome="sending")
            ok = await self._attempt(box, body(event, box.hook.format), d)
            self._finish(box, d, "delivered" if ok else "failed")
            out[box.hook.url] = {"id": box.hook.id, "format": box.hook.format, **d.doc()}

        async with trio.open_nursery() as nursery:
            for box in list(self._boxes.values()):
                nursery.start_soon(one, box)
        return [out[url] for url in self._boxes if url in out]

    # -- what the status shows ------------------------------------------------------------------------

    def health(self) -> list[dict[str, Any]]:
        """Each webhook's health, as `conditions.conditions(webhooks=...)` reads it."""
        return [box.health() for box in self._boxes.values()]

    def deliveries(self) -> dict[str, int]:
        """Finished deliveries by outcome (delivered, failed, dropped), every webhook's summed, since this
        member started (the metrics' counter: a removed webhook's stay counted)."""
        return dict(self._totals)

    def status(self) -> dict[str, Any]:
        """`GET /api/v1/notify/status`: each webhook (by id, never its URL), its counts and recent
        deliveries (newest first), and the conditions active now with when they started."""
        hooks = []
        for box in self._boxes.values():
            recent = [box.in_flight] if box.in_flight is not None else []
            recent += reversed(box.history)
            hooks.append({**box.health(), "format": box.hook.format, "delivered": box.delivered, "failed": box.failed,
                          "attempts": box.attempts, "last_ok_at": box.last_ok_at,
                          "last_failure_at": box.last_failure_at, "deliveries": [d.doc() for d in recent]})
        active = [{**a.condition.to_doc(), "since": a.since, "clearing_since": a.clear_since}
                  for _, a in sorted(self._active.items())]
        settled = self.settled_at()
        return {"checked_at": self.checked_at, "leading_since": self.leading_since,
                "settling_until": settled if settled != float("inf") else None, "webhooks": hooks, "active": active}

    # -- delivery ---------------------------------------------------------------------------------------

    def _emit(self, event: Event) -> None:
        c = event.condition
        (log.warning if event.kind == "started" else log.info)("condition %s: %s %s: %s", event.kind, c.kind,
                                                                c.subject, c.words)
        for box in self._boxes.values():
            d = Delivery(event.kind, c.kind, c.subject, event.at)
            if len(box.queue) >= self._queue_max:
                _, oldest = box.queue.popleft()
                oldest.error = f"dropped: more than {self._queue_max} events waited for this webhook"
                self._finish(box, oldest, "dropped")
            box.queue.append((event, d))
            box.wake.set()

    async def _work(self, box: _Outbox) -> None:
        with box.scope:
            while True:
                if not box.queue:
                    box.wake = trio.Event()
                    await box.wake.wait()
                    continue
                event, d = box.queue.popleft()
                box.in_flight = d
                try:
                    await self._deliver(box, event, d)
                finally:
                    box.in_flight = None

    async def _deliver(self, box: _Outbox, event: Event, d: Delivery) -> None:
        """Up to ATTEMPTS tries, waiting notify_retry_first_s, then twice as long each time (at most
        notify_retry_max_s). The webhook's format is read at each try (the setting may change)."""
        for attempt in range(1, ATTEMPTS + 1):
            d.outcome = "sending"
            if await self._attempt(box, body(event, box.hook.format), d):
                self._finish(box, d, "delivered")
                return
            if attempt < ATTEMPTS:
                d.outcome = "retrying"
                await trio.sleep(retry_wait(attempt, self._timeouts))
        self._finish(box, d, "failed")
        log.warning("webhook %s: %s event %s %s not delivered after %d attempts: %s", box.hook.id, d.event, d.kind,
                    d.subject, d.attempts, d.error)

    async def _attempt(self, box: _Outbox, data: bytes, d: Delivery) -> bool:
        d.attempts += 1
        box.attempts += 1
        status: int | None = None
        error = ""
        with trio.move_on_after(self._timeouts.notify_post_s) as scope:
            try:
                status = await self._post(box.hook.url, data)
            except Exception as e:  # no answer (refused, reset, TLS, DNS...), or a bug in the seam
                error = f"{type(e).__name__}: {e}".replace(box.hook.url, box.hook.id)[:ERROR_MAX_CHARS]
        if scope.cancelled_caught:
            error = f"no answer within {self._timeouts.notify_post_s:g} s (notify_post_s)"
        elif status is not None and not 200 <= status < 300:
            error = f"answered HTTP {status}"
        d.status, d.error = status, error
        now = self._clock()
        if not error:
            if box.failures_in_row >= FAILING_AFTER:
                log.info("webhook %s answers again (HTTP %s)", box.hook.id, status)
            box.failures_in_row, box.last_ok_at = 0, now
            return True
        box.failures_in_row += 1
        box.last_error, box.last_failure_at = error, now
        return False

    def _finish(self, box: _Outbox, d: Delivery, outcome: str) -> None:
        d.outcome, d.finished_at = outcome, self._clock()
        self._totals[outcome] += 1
        if outcome == "delivered":
            box.delivered += 1
        elif outcome == "failed":
            box.failed += 1
        else:
            box.dropped += 1
        box.history.append(d)


def retry_wait(attempt: int, timeouts: Timeouts = TIMEOUTS) -> float:
    """Seconds to wait after the `attempt`-th failed try: 1, 2, 4, ... up to notify_retry_max_s."""
    return float(min(timeouts.notify_retry_first_s * 2.0 ** (attempt - 1), timeouts.notify_retry_max_s))
