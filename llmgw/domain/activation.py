"""A model's activation as clients and operators see it: which phase its most advanced starting replica is in,
how big its checkpoint is, when the phase began, and an estimate of when it serves. Owns the rules: which
replica's progress stands for the model (`best`), the ETA (`Progress.eta_s`), a checkpoint's activation
window (`window_s`) and the `Retry-After` a client that does not wait is given (`retry_after_s`).

Pure. Unknown is None, never 0: a checkpoint nobody has measured has no size, and then no ETA.

Phases, in the order a replica goes through them (docs/operations.md, "Cold starts"):

- `placing`: the model is wanted but no agent has said it is starting a replica (no placement yet, or the
  agent has not answered the start).
- `fetching`: the node copies a `mirror://NAME` checkpoint from the control planes into its mirror cache before
  loading it (docs/mirror.md): `bytes_done` of `bytes_total`; the ETA is the copy at the rate it goes (as the
  agent measures it), then the load at the nominal rate.
- `starting`: the agent prepares the engine (checks the source and the weights' header); also what an
  agent that says no phase reports for a replica starting.
- `loading`: the engine process runs and loads the checkpoint until its health check answers. The agent
  sees the checkpoint's size on disk, not how much of it the engine has read: the ETA is the size at the
  nominal load rate (`activation.load_mib_per_s`) past the start, never a measured rate.
- `waking`: an asleep replica's engine wakes (fast wake, `POST /wake_up`): its process runs, no load is
  estimated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

PHASES = ("placing", "fetching", "starting", "loading", "waking")
_RANK = {p: i for i, p in enumerate(PHASES)}  # later is further along
MIB = 1 << 20


@dataclass(frozen=True)
class Progress:
    """How far a model's activation has come. `since`: when its replica began starting (wall clock, seconds
    since the epoch; None before any did). `expected_s`: how long a start of this checkpoint takes at the
    nominal rate, counted from `since` (None: the size is unknown)."""

    phase: str  # one of PHASES
    since: float | None = None
    bytes_done: int | None = None  # fetched so far (the `fetching` phase only; None otherwise)
    bytes_total: int | None = None  # the checkpoint's size on disk; None = unknown
    expected_s: float | None = None

    def eta_s(self, now: float) -> float | None:
        """Seconds left by the estimate; None when there is none or the start has run past it."""
        if self.expected_s is None or self.since is None:
            return None
        left = self.since + self.expected_s - now
        return left if left > 0 else None

    def to_doc(self, now: float | None = None) -> dict[str, Any]:
        """The wire's and the API's form; with `now`, also `eta_s` and `elapsed_s` as of then."""
        doc: dict[str, Any] = {"phase": self.phase, "since": self.since, "bytes_done": self.bytes_done,
                               "bytes_total": self.bytes_total, "expected_s": self.expected_s}
        if now is not None:
            eta = self.eta_s(now)
            doc["eta_s"] = None if eta is None else round(eta, 1)
            doc["elapsed_s"] = None if self.since is None else round(max(0.0, now - self.since), 1)
        return doc

    @classmethod
    def from_doc(cls, d: Mapping[str, Any]) -> Progress:
        """Lenient (a newer peer may say a phase this one does not know: it reads as `starting`)."""
        def number(key: str) -> float | None:
            value = d.get(key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                return None
            return float(value)

        def whole(key: str) -> int | None:
            value = number(key)
            return None if value is None or value < 0 else int(value)

        phase = str(d.get("phase", ""))
        return cls(phase if phase in _RANK else "starting", number("since"), whole("bytes_done"),
                   whole("bytes_total"), number("expected_s"))

    def words(self, now: float) -> str:
        """One line for people: `loading 4.1 GiB for 12 s, about 30 s left`."""
        size = "" if self.bytes_total is None else f" {gib(self.bytes_total)}"
        if self.phase == "placing":
            head = "placing a replica"
        elif self.phase == "fetching":
            done = "?" if self.bytes_done is None else gib(self.bytes_done)
            head = f"fetching the checkpoint: {done} of{size or ' ?'}"
            if self.bytes_done is not None and self.bytes_total:
                head += f" ({100 * self.bytes_done // self.bytes_total}%)"
        elif self.phase == "waking":
            head = "waking the engine from sleep"
        elif self.phase == "loading":
            head = f"loading the{size} checkpoint" if size else "loading the checkpoint (size unknown)"
        else:
            head = "starting the engine" + (f" ({size.strip()} checkpoint)" if size else "")
        if self.since is not None:
            head += f" for {max(0.0, now - self.since):.0f} s"
        eta = self.eta_s(now)
        if eta is not None:
            head += f", about {math.ceil(eta)} s left"
        elif self.expected_s is not None and self.since is not None:
            head += f", past its estimate of {self.expected_s:.0f} s"
        return head


def expected_s(size_bytes: int | None, load_mib_per_s: float, base_s: float) -> float | None:
    """How long a start of a checkpoint of `size_bytes` takes by the estimate: `base_s` (an engine's own
    start) plus the size at the nominal rate; None when the size is unknown."""
    if size_bytes is None or load_mib_per_s <= 0:
        return None
    return base_s + size_bytes / (load_mib_per_s * MIB)


def window_s(model_window_s: float, size_bytes: int | None, load_mib_per_s: float, base_s: float) -> float:
    """The activation window in force: the model's own, or longer when its checkpoint takes longer to load
    by the estimate (a 140 GB checkpoint does not load within a 120 s window)."""
    estimate = expected_s(size_bytes, load_mib_per_s, base_s)
    return model_window_s if estimate is None else max(model_window_s, estimate)


def best(candidates: Iterable[Progress], now: float) -> Progress | None:
    """The progress that stands for the model: the furthest phase, then the soonest ETA, then the oldest."""
    def key(p: Progress) -> tuple[int, float, float]:
        eta = p.eta_s(now)
        return (-_RANK.get(p.phase, 0), math.inf if eta is None else eta, p.since if p.since is not None else math.inf)

    return min(candidates, key=key, default=None)


def retry_after_s(progress: Progress | None, now: float, default_s: float) -> int:
    """Whole seconds a client that does not wait is told to come back after: the ETA when there is one,
    else `default_s`; at least 1."""
    eta = progress.eta_s(now) if progress is not None else None
    return max(1, math.ceil(default_s if eta is None else eta))


def gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n / MIB:.0f} MiB"
