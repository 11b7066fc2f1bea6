"""One replica's circuit breaker, as each gateway keeps it (the router holds one per replica): a pure state
machine over the trio clock's readings, with no I/O.

closed: every request may go. After `failures` consecutive failures (a 5xx answer from the engine, an
upstream timeout, a connection broken before or during the answer) it opens: the router sends the replica
nothing while another replica of the model is in rotation. After `open_s` (`breaker_open_s`) it lets exactly
one request through (half-open, the probe); the probe's success closes it, its failure opens it again for
`open_s`. A probe that never reports (its client went away) does not wedge it: after another `open_s` the
next request probes. A success (any answer below 500: a 4xx is the client's error) resets the count.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Breaker", "BreakerOpen"]


@dataclass(frozen=True)
class BreakerOpen:
    """An open breaker as the operator sees it: why (the last failure and how many in a row) and since when
    (trio clock of this gateway)."""

    reason: str
    since: float
    half_open: bool  # a probe is in flight


class Breaker:
    """closed -> open after `failures` consecutive failures -> half-open (one probe) after `open_s` ->
    closed on the probe's success, open again on its failure."""

    __slots__ = ("consecutive", "reason", "opened_at", "probe_at", "probing")

    def __init__(self) -> None:
        self.consecutive = 0  # failures in a row
        self.reason = ""  # the last failure, in words
        self.opened_at: float | None = None  # None: closed
        self.probe_at = 0.0  # while open: when the next request may probe it
        self.probing = False  # half-open: a probe is in flight

    @property
    def is_open(self) -> bool:
        return self.opened_at is not None

    def admits(self, now: float) -> bool:
        """Whether a request may go to the replica now (closed, or open with a probe due)."""
        return self.opened_at is None or now >= self.probe_at

    def probe(self, now: float, open_s: float) -> None:
        """A request was sent to it: when open, that request is the probe (the next one is due `open_s` later)."""
        if self.opened_at is not None:
            self.probing = True
            self.probe_at = now + open_s

    def failed(self, now: float, reason: str, failures: int, open_s: float) -> bool:
        """A failure; True when it opens the breaker now (it was closed)."""
        self.consecutive += 1
        self.reason = reason
        self.probing = False
        if self.opened_at is not None:  # the probe failed (or a request sent while all were open)
            self.probe_at = now + open_s
            return False
        if self.consecutive < failures:
            return False
        self.opened_at = now
        self.probe_at = now + open_s
        return True

    def succeeded(self) -> bool:
        """An answer (below 500); True when it closes the breaker now (it was open)."""
        self.consecutive = 0
        self.probing = False
        if self.opened_at is None:
            return False
        self.opened_at = None
        return True

    def state(self) -> BreakerOpen | None:
        """None while closed."""
        if self.opened_at is None:
            return None
        return BreakerOpen(f"{self.consecutive} consecutive failures; last: {self.reason}", self.opened_at,
                           self.probing)
