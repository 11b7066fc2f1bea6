"""Failpoints: faults a test injects into a running member's store, as etcd's robustness tests do
with gofail. Off, and free, unless `LLMGW_FAILPOINTS` names a directory when the process starts.

Three faults a network namespace cannot make (tests/support/campaign.py uses them beside the
namespaces' partitions):

- **the clock**: the store's monotonic clock (pysyncobj's election and heartbeat timers, the read
  barrier's resends) runs `clock_offset_s` ahead of the process's; a test changes the offset to
  make the member's clock jump, forward or back;
- **Raft messages**: each message to a peer is dropped with probability `drop` or held for a time
  drawn from `delay_s` = [low, high], per peer address or for every peer (`"*"`). Held messages
  keep their order, as TCP keeps it under a delaying network (netem's reordering reaches packets,
  never the stream); a dropped one is gone, which TCP never does within one connection but Raft
  must survive anyway;
- **power loss**: every flush (fsync) of a file in the Raft directory is recorded in the ledger
  `DIR/flushed/`: a small file's whole flushed content, a large one's flushed length. After a
  SIGKILL, `lose_unflushed(raft_dir, DIR)` puts each file back to what its last flush made
  durable, dropping every write that was not flushed, as lazyfs does.

`DIR/control.json` holds the first two, e.g. `{"clock_offset_s": 30, "send": {"*": {"drop": 0.2,
"delay_s": [0, 0.05]}}}`; it is read again within `failpoints_poll_s` of a change (a missing or unreadable file:
no fault). Nothing here is reachable from the API or the command line.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import json
import os
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from llmgw.domain.timeouts import TIMEOUTS

ENV = "LLMGW_FAILPOINTS"
SMALL = 64 * 1024  # a flushed file up to this size is recorded whole; a larger one by its length


@dataclass(frozen=True)
class SendFault:
    drop: float = 0.0
    delay_s: tuple[float, float] = (0.0, 0.0)


@dataclass
class Controls:
    clock_offset_s: float = 0.0
    send: dict[str, SendFault] = field(default_factory=dict)

    def for_peer(self, address: str) -> SendFault | None:
        return self.send.get(address) or self.send.get("*")


def parse(doc: Any) -> Controls:
    """`control.json`'s document as Controls; ValueError when it is not one."""
    if not isinstance(doc, dict):
        raise ValueError("control.json: not an object")
    send: dict[str, SendFault] = {}
    for peer, rule in (doc.get("send") or {}).items():
        low, high = rule.get("delay_s", (0.0, 0.0))
        send[str(peer)] = SendFault(float(rule.get("drop", 0.0)), (float(low), float(high)))
    return Controls(float(doc.get("clock_offset_s", 0.0)), send)


def write_controls(directory: Path, doc: dict[str, Any]) -> None:
    """The test's side: replace `control.json` at once (a reader never sees half of it)."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / "control.json.tmp"
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, directory / "control.json")


class Failpoints:
    """The member's failpoints, read from `directory`; one per process (`active()`)."""

    def __init__(self, directory: Path, *, poll: bool = False) -> None:
        """`poll`: re-read `control.json` every `failpoints_poll_s` in a thread of its own (else on `refresh`)."""
        self.directory = directory
        self.controls = Controls()
        self._seen: tuple[int, int] | None = None
        self._lock = threading.Lock()
        (directory / "flushed").mkdir(parents=True, exist_ok=True)
        self.refresh()
        if poll:
            threading.Thread(target=self._poll, name="llmgw-failpoints", daemon=True).start()

    def refresh(self) -> None:
        path = self.directory / "control.json"
        try:
            st = path.stat()
            seen = (st.st_mtime_ns, st.st_size)
            if seen == self._seen:
                return
            controls = parse(json.loads(path.read_text()))
        except (OSError, ValueError, TypeError, AttributeError):
            controls, seen = Controls(), None
        self._seen = seen
        self.controls = controls

    def _poll(self) -> None:
        while True:
            time.sleep(TIMEOUTS.failpoints_poll_s)
            self.refresh()

    def monotonic(self) -> float:
        return time.monotonic() + self.controls.clock_offset_s

    def flushed(self, path: Path, fd: int) -> None:
        """Record what a flush of `path` (open as `fd`) made durable."""
        size = os.fstat(fd).st_size
        record = self.directory / "flushed" / path.name
        kept = b"W" + os.pread(fd, size, 0) if size <= SMALL else b"L" + str(size).encode()
        with self._lock:
            tmp = record.with_suffix(".tmp")
            tmp.write_bytes(kept)
            os.replace(tmp, record)


_active: Failpoints | None = None
_active_lock = threading.Lock()


def active() -> Failpoints | None:
    """This process's failpoints, or None (no `LLMGW_FAILPOINTS`)."""
    global _active
    directory = os.environ.get(ENV)
    if not directory:
        return None
    with _active_lock:
        if _active is None:
            _active = Failpoints(Path(directory), poll=True)
        return _active


def install(transport: Callable[..., Any], fp: Failpoints) -> tuple[Callable[..., Any], Callable[[], float]]:
    """Put `fp` under this process's Raft member: pysyncobj's timers on its clock, and `transport`
    (the factory SyncObj is given) wrapped. Returns the wrapped factory and the clock."""
    import pysyncobj.syncobj

    pysyncobj.syncobj.monotonicTime = fp.monotonic  # the name syncobj's timers call, bound at its import
    return faulty_transport(transport, fp), fp.monotonic


def flushed(path: Path, fd: int) -> None:
    """Called after each fsync of a Raft file: a no-op unless failpoints are on."""
    fp = _active or (active() if ENV in os.environ else None)
    if fp is not None:
        fp.flushed(path, fd)


def lose_unflushed(raft_dir: Path, directory: Path) -> list[str]:
    """After the member was killed: put each file of `raft_dir` back to its last flush (a file
    never flushed since the ledger began is left). Returns what was changed, in words."""
    changed: list[str] = []
    for record in sorted((directory / "flushed").glob("*")):
        if record.suffix == ".tmp":
            continue
        target = raft_dir / record.name
        if not target.exists():
            continue
        data = record.read_bytes()
        now = target.read_bytes()
        if data[:1] == b"W":
            if now != data[1:]:
                target.write_bytes(data[1:])
                changed.append(f"{record.name}: back to its flushed {len(data) - 1} bytes (was {len(now)})")
        elif len(now) > int(data[1:]):
            os.truncate(target, int(data[1:]))
            changed.append(f"{record.name}: cut to its flushed {int(data[1:])} bytes (was {len(now)})")
    return changed


# -- Raft messages ---------------------------------------------------------------------------


def faulty_transport(base: Callable[..., Any], fp: Failpoints) -> Callable[..., Any]:
    """`base` (a transport factory SyncObj calls) with messages dropped and delayed as `fp` says."""
    cls = base.func if isinstance(base, functools.partial) else base

    class Faulty(cls):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self._held: list[tuple[float, int, Any, Any]] = []
            self._last_due: dict[Any, float] = {}
            self._order = itertools.count()
            self._rng = random.Random()
            super().__init__(*args, **kwargs)

        def send(self, node: Any, message: Any) -> bool:
            rule = fp.controls.for_peer(str(node.address))
            if rule is not None and rule.drop and self._rng.random() < rule.drop:
                return True  # lost on the way: the sender cannot tell
            now = time.monotonic()
            delay = self._rng.uniform(*rule.delay_s) if rule is not None and rule.delay_s[1] > 0 else 0.0
            # never before a message sent to the same peer earlier: the stream keeps its order
            due = max(now + delay, self._last_due.get(node, 0.0))
            if due <= now:
                return bool(super().send(node, message))
            self._last_due[node] = due
            heapq.heappush(self._held, (due, next(self._order), node, message))
            return True

        def _onTick(self) -> None:
            super()._onTick()
            now = time.monotonic()
            while self._held and self._held[0][0] <= now:
                _, _, node, message = heapq.heappop(self._held)
                super().send(node, message)

    if isinstance(base, functools.partial):
        return functools.partial(Faulty, *base.args, **base.keywords)
    return Faulty
