"""The leader's notifier: the conditions of each check in, one event per start and resolution out to every
webhook, each webhook served by its own task from its own bounded queue (a slow or dead endpoint delays
nothing else), retried with backoff, the outcome of each delivery kept in memory (`status()`).

Which conditions were posted as started is kept in the replicated state (`ClusterState.active_conditions`),
committed before the post (`check`): a new leader posts the "resolved" of what its predecessor posted as
"started" and never a "started" twice, and a leader that lost its majority posts nothing.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import trio

from llmgw.domain.active_conditions import ActiveCondition, Updated, state_key, update
from llmgw.domain.commands import update_conditions, with_cid
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
# Starts (and resolutions) one `condition.update` carries at most: 500 of the longest words are 2 MB, within a
# Raft command's size; more (a whole fleet lost at once) go out at the next checks.
UPDATE_BATCH = 500

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


# Commit a `condition.update` command (`commands.update_conditions`, with its `cid`) through Raft; returns its
# result (`Updated.to_doc()`), raises NotRecorded. The control plane's: `control.ops.notify.record`.
Record = Callable[[dict[str, Any]], Awaitable[Any]]


@dataclass(frozen=True)
class Ledger:
    """Where the leader keeps the conditions it posted (the replicated state): `active()` what it holds now,
    `record` commits a `condition.update`; `ready()` false while the group cannot record them (below store
    level 3: the notifier then keeps them in its own memory, `Notifier.observe`)."""

    active: Callable[[], Mapping[str, ActiveCondition]]
    record: Record
    ready: Callable[[], bool]


class NotRecorded(Exception):
    """The conditions' update was not committed (`Record`): nothing is posted. `maybe`: its commit was not
    confirmed, it may still apply (the same command, with its id, is sent again first at the next check)."""

    def __init__(self, words: str, *, maybe: bool = False) -> None:
        super().__init__(words)
        self.maybe = maybe


class Notifier:
    """Run `run()` in a nursery first; then, while leading, `configure()` and `check()` (against the replicated
    state) or `observe()` (against its own memory) each check; `step_down()` once no longer leading."""

    def __init__(self, post: Post, *, clock: Callable[[], float] = time.time, timeouts: Timeouts = TIMEOUTS,
                 cluster: Callable[[], Mapping[str, Any]] = dict, queue_max: int = QUEUE_MAX) -> None:
        self._post = post
        self._clock = clock
        self._timeouts = timeouts
        self._cluster = cluster
        self._queue_max = queue_max
        self._boxes: dict[str, _Outbox] = {}
        # The conditions posted as started at the last check: the replicated state's (`check`), or this
        # member's own (`observe`: `_memory`, while the group cannot record them).
        self._view: Mapping[str, ActiveCondition] = {}
        self._memory: dict[str, ActiveCondition] = {}
        self._seen: dict[tuple[str, str], Condition] = {}  # each active condition as last seen (its freshest words)
        self._clear_since: dict[tuple[str, str], float] = {}  # when each active one was first seen gone
        self._pending: tuple[dict[str, Any], bool] | None = None  # a commit not confirmed: sent again first
        self._totals = {"delivered": 0, "failed": 0, "dropped": 0}
        self._nursery: trio.Nursery | None = None
        self.conditions: list[Condition] = []  # the last check's (leader only; [] on a standby)
        self.checked_at: float | None = None
        self.leading_since: float | None = None  # the first check of this term of leading
        self.recorded = False  # the last check's active conditions were the replicated state's
        self.record_error = ""  # why the last update of the active conditions was not committed ("" it was)

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
        """The conditions true now, against what this member posted itself (a group that cannot record them
        yet: below store level 3). A new one is posted at once ("started"; again when its severity rises
        to critical); one gone is posted "resolved" once it has stayed gone `notify_resolve_hold_s`, and
        nothing is posted if it comes back before: a condition flapping within the hold is one event.
        The group's own conditions (`SETTLING_KINDS`) wait until this leader has led `notify_election_settle_s`:
        links still connecting after an election or a start are no failure."""
        start, resolve = self._plan(found, now, self._memory)
        if start or resolve:
            self._memory, updated = update(self._memory, start, resolve, now)
            self._post_updated(updated, now)
        self._view, self.recorded = self._memory, False

    async def check(self, found: Iterable[Condition], now: float, ledger: Ledger) -> None:
        """As `observe`, against the conditions the replicated state holds as posted (`ledger.active()`): what
        starts, rises or resolves is committed first (`ledger.record`), then posted as the commit's outcome
        says (not as this member's view did: a new leader whose view lags its predecessor's last update
        posts nothing twice). A commit that fails posts nothing (a leader that lost its majority cannot
        commit); the next check works it out again. A commit not confirmed (it may still apply) is sent
        again, with its id, before anything else: applied or not, it is posted once.

        At-most-once across a leader change: a leader that committed and then stopped before its webhook
        took the event (a crash, its queue's retries) loses that one post, which the next leader does not
        repeat (the state says it was posted); a post is never made twice nor by a leader that could not
        commit. While the same leader lives, each event is tried ATTEMPTS times (at least once)."""
        found = sorted(found)
        self.conditions, self.checked_at = found, now  # what it sees, posted or not
        self.leading_since = now if self.leading_since is None else self.leading_since
        if not self._boxes and self._pending is None:
            # No webhook: nothing is posted, so nothing is recorded (no write per condition for nobody). A
            # webhook set later hears `started` of what is active then, `resolved` of what ended meanwhile.
            self._clear_since.clear()
            self._view, self.recorded = ledger.active(), True
            return
        if self._pending is not None:
            command, post = self._pending
            self._pending = None
            if not await self._record(ledger, command, now, post=post):
                return
        if self._memory:  # posted before the group could record (it just reached level 3): recorded, not reposted
            command = with_cid(update_conditions([a.condition() for a in self._memory.values()], [], now), _cid())
            if not await self._record(ledger, command, now, post=False):
                return
            self._memory.clear()
        start, resolve = self._plan(found, now, ledger.active())
        if start or resolve:
            command = with_cid(update_conditions(start, resolve, now), _cid())
            if not await self._record(ledger, command, now, post=True):
                return
        self._view, self.recorded = ledger.active(), True

    async def _record(self, ledger: Ledger, command: dict[str, Any], now: float, *, post: bool) -> bool:
        # Said before each try, each a write to the replicated state (tests/support/campaign.py counts them).
        log.info("recording conditions: %d to start, %d to resolve (condition.update %s)", len(command["start"]),
                 len(command["resolve"]), command.get("cid"))
        try:
            result = await ledger.record(command)
        except NotRecorded as e:
            if e.maybe:
                self._pending = (command, post)
            if not self.record_error:
                log.warning("conditions not posted: their update was not committed (%s); trying again at the "
                            "next check", e)
            self.record_error = str(e) or type(e).__name__
            return False
        if self.record_error:
            log.info("conditions' updates commit again")
        self.record_error = ""
        if post:
            self._post_updated(Updated.from_doc(result), now)
        return True

    def _plan(self, found: Iterable[Condition], now: float,
              active: Mapping[str, ActiveCondition]) -> tuple[list[Condition], list[tuple[str, str]]]:
        """What to start (new, or risen to critical) and resolve (gone for the hold) against `active`."""
        self.conditions, self.checked_at = sorted(found), now
        if self.leading_since is None:
            self.leading_since = now
        settling = now < self.settled_at()
        seen = {c.key for c in self.conditions}
        start = []
        for c in self.conditions:
            self._seen[c.key] = c
            self._clear_since.pop(c.key, None)
            posted = active.get(state_key(*c.key))
            if posted is None:
                if not (settling and c.kind in SETTLING_KINDS):
                    start.append(c)
            elif c.severity == CRITICAL and posted.severity != CRITICAL:
                start.append(c)
        # Nothing resolves before this leader's graces are over: what a predecessor posted may only be unseen
        # yet (its agents not reported, its links connecting), not gone.
        grace = max(self._timeouts.agent_report_grace_s, self._timeouts.notify_election_settle_s)
        resolve = []
        for posted in active.values():
            if posted.key not in seen:
                gone = self._clear_since.setdefault(posted.key, now)
                if now - gone >= self._timeouts.notify_resolve_hold_s and now >= self.leading_since + grace:
                    resolve.append(posted.key)
        keep = seen | {posted.key for posted in active.values()}
        for kept in (self._seen, self._clear_since):
            for key in [k for k in kept if k not in keep]:
                del kept[key]
        return start[:UPDATE_BATCH], resolve[:UPDATE_BATCH]

    def _post_updated(self, updated: Updated, now: float) -> None:
        for a in (*updated.started, *updated.raised):
            self._emit(Event("started", self._seen.get(a.key, a.condition()), now, since=a.since,
                             cluster=self._cluster()))
        for a in updated.resolved:
            self._emit(Event("resolved", self._seen.pop(a.key, a.condition()), now, since=a.since,
                             cluster=self._cluster()))
            self._clear_since.pop(a.key, None)

    def step_down(self) -> None:
        """No longer the leader: forget what this member saw (the next leader reads the replicated state, or,
        in a group that cannot record, posts what it finds). Events already queued are still delivered."""
        self._memory.clear()
        self._seen.clear()
        self._clear_since.clear()
        self._view, self._pending, self.recorded, self.record_error = {}, None, False, ""
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
        active = [{**self._seen.get(a.key, a.condition()).to_doc(), "since": a.since,
                   "clearing_since": self._clear_since.get(a.key)} for a in sorted(self._view.values(), key=_by_key)]
        settled = self.settled_at()
        return {"checked_at": self.checked_at, "leading_since": self.leading_since,
                "settling_until": settled if settled != float("inf") else None, "webhooks": hooks, "active": active,
                "recorded": self.recorded, "record_error": self.record_error}

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


def _by_key(a: ActiveCondition) -> tuple[str, str]:
    return a.key


def _cid() -> str:
    """A `condition.update` command's idempotency id: a retry of a commit not confirmed applies it once."""
    return f"notify-{uuid.uuid4().hex}"


def retry_wait(attempt: int, timeouts: Timeouts = TIMEOUTS) -> float:
    """Seconds to wait after the `attempt`-th failed try: 1, 2, 4, ... up to notify_retry_max_s."""
    return float(min(timeouts.notify_retry_first_s * 2.0 ** (attempt - 1), timeouts.notify_retry_max_s))
