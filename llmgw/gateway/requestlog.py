"""The gateway's request log: one `RequestRecord` per request, queued off the request path, written by a
background task to size-bounded segment files in the state dir, and folded into per-hour usage rollups.

`record()` is all the request path pays: one deque append, never a wait. When the queue is full the
record is dropped and counted (`statistics()`), so a slow disk never slows or blocks a request. The
writer wakes every `requestlog_flush_s`, formats and writes the batch in a worker thread, seals a
segment at `SEGMENT_BYTES` (with a summary beside it) and removes the oldest past the settings'
byte and age limits. Prompts and completions never reach a record (only counts do).
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import zlib
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from llmgw.domain.commands import CommandError, usage
from llmgw.domain.priority import CLASSES
from llmgw.domain.settings import SETTINGS
from llmgw.domain.timeouts import TIMEOUTS, Timeouts
from llmgw.interfaces import RequestFacts
from llmgw.wire.logquery import gateway_tag

log = logging.getLogger("llmgw.gateway.requestlog")

SEGMENT_BYTES = 8 << 20  # a segment is sealed (summary written) past this size
RARE = 64  # a segment's summary lists the lines of each key, model and status seen at most this often
QUEUE_RECORDS = 100_000  # records waiting for the writer; beyond, new ones are dropped and counted
SEGMENT_RE = re.compile(r"seg-(\d{10})\.log\Z")

# The fields, in the order every line has them: the query module finds `"key":...,` and
# `"model":...,` and `"status":N,` as bytes, so their order and separators never change.
FIELDS = ("id", "time", "key", "model", "status", "error", "replica", "node", "endpoint", "tokens_in",
          "tokens_out", "latency_ms", "ttft_ms", "guard_rule", "gateway", "served_model", "priority", "queue_ms")


@dataclass(slots=True)
class RequestRecord:
    """One request's facts; never its prompt or completion. Unknown is None, not 0."""

    id: str
    time: float  # unix seconds when the request arrived
    key: str  # the client key's id ("" when no valid key was sent)
    model: str  # a catalog name ("" when the request named none that exists)
    status: int  # the HTTP status answered; 499 when the client went away first
    error: str = ""  # the error code answered ("" for a success or an engine's own answer)
    replica: str = ""
    node: str = ""
    endpoint: str = ""  # the path asked, e.g. /v1/chat/completions
    tokens_in: int | None = None  # from the engine's usage (None: it gave none)
    tokens_out: int | None = None
    latency_ms: float = 0.0
    ttft_ms: float | None = None  # time to the first streamed chunk (None: not streamed)
    guard_rule: str = ""  # the judges' verdicts, `judge: S6,Specialized Advice` ("": no policy applied)
    gateway: str = ""
    served_model: str = ""  # the model that served `model` (an alias's, a fallback, or itself); "": none did
    priority: str = ""  # the request's priority class (llmgw/domain/priority.py); "" when no key was admitted
    queue_ms: float | None = None  # its wait for a slot of its replica (0: none); None: it never asked for one

    def line(self) -> bytes:
        """`CRC32HEX JSON\\n`: the checksum makes a torn or damaged line skipped, not fatal."""
        doc = json.dumps({f: getattr(self, f) for f in FIELDS}, separators=(",", ":"), ensure_ascii=False).encode()
        return b"%08x %s\n" % (zlib.crc32(doc), doc)

    @property
    def end(self) -> float:
        return self.time + self.latency_ms / 1000


def record_doc(line: bytes) -> dict[str, Any] | None:
    """The record on one line (without its newline), or None when its checksum or JSON is wrong."""
    if len(line) < 10 or line[8:9] != b" ":
        return None
    doc = line[9:]
    try:
        if int(line[:8], 16) != zlib.crc32(doc):
            return None
        value = json.loads(doc)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


@dataclass
class Limits:
    """Retention, from the cluster settings (`requestlog.*`)."""

    max_bytes: int
    max_age_s: float

    @classmethod
    def of(cls, settings: Mapping[str, Any]) -> Limits:
        def get(key: str) -> Any:
            return settings[key] if key in settings else SETTINGS[key].default
        return cls(int(get("requestlog.max_bytes")), float(get("requestlog.max_age_days")) * 86400)


class SegmentWriter:
    """The files: `seg-NNNNNNNNNN.log` (appended), and `.sum` beside each sealed one. Synchronous: it
    runs in a worker thread. A start never appends to an old segment (its tail may be torn): it opens
    the next one."""

    def __init__(self, directory: Path, segment_bytes: int = SEGMENT_BYTES) -> None:
        self.dir = directory
        self.segment_bytes = segment_bytes
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        existing = segments(directory)
        self.seq = existing[-1][0] + 1 if existing else 1
        self._file: Any = None
        self._size = 0
        self._summary = _Summary()

    def write(self, records: list[RequestRecord]) -> None:
        for chunk in _chunks(records):
            if self._file is None:
                self._file = open(self.dir / f"seg-{self.seq:010d}.log", "ab", buffering=0)  # noqa: SIM115
                self._size = 0
                self._summary = _Summary()
            lines = [r.line() for r in chunk]
            data = b"".join(lines)
            self._file.write(data)  # one write per batch: a reader sees whole lines but the last
            self._summary.add(chunk, lines, self._size)
            self._size += len(data)
            if self._size >= self.segment_bytes:
                self.seal()

    def seal(self) -> None:
        """Close the open segment and write its summary (what the query skips segments by)."""
        if self._file is None:
            return
        self._file.close()
        self._file = None
        path = self.dir / f"seg-{self.seq:010d}.sum"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._summary.doc()))
        os.replace(tmp, path)
        self.seq += 1

    def prune(self, limits: Limits, now: float) -> int:
        """Remove the oldest sealed segments past the byte limit, and those whose newest record is
        older than the age limit. Returns how many were removed."""
        sealed = [(seq, path) for seq, path in segments(self.dir) if self._file is None or seq != self.seq]
        sizes = {seq: _size(path) for seq, path in sealed}
        total = sum(sizes.values()) + (self._size if self._file is not None else 0)
        removed = 0
        for seq, path in sealed:
            summary = read_summary(path)
            newest = summary.get("end_max") if summary else None
            too_old = isinstance(newest, (int, float)) and newest < now - limits.max_age_s
            if not too_old and total <= limits.max_bytes:
                break
            total -= sizes[seq]
            for p in (path, path.with_suffix(".sum")):
                p.unlink(missing_ok=True)
            removed += 1
        return removed

    def close(self) -> None:
        self.seal()


def _chunks(records: list[RequestRecord], size: int = 512) -> list[list[RequestRecord]]:
    return [records[i:i + size] for i in range(0, len(records), size)]


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def segments(directory: Path) -> list[tuple[int, Path]]:
    """(seq, path) of each segment file, oldest first."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    found = [(int(m.group(1)), directory / n) for n in names if (m := SEGMENT_RE.match(n))]
    return sorted(found)


def read_summary(segment: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(segment.with_suffix(".sum").read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


class _Summary:
    """What one segment holds, for skipping it and for finding its rare values without a scan: the
    count of each key, model and status, its time span, and the line offsets of each value seen
    at most `RARE` times."""

    def __init__(self) -> None:
        self.counts: dict[str, dict[str, int]] = {"key": {}, "model": {}, "status": {}}
        self.offsets: dict[str, dict[str, list[int]]] = {"key": {}, "model": {}, "status": {}}
        self.time_min = float("inf")
        self.end_max = float("-inf")
        self.count = 0

    def add(self, records: list[RequestRecord], lines: list[bytes], offset: int) -> None:
        for r, line in zip(records, lines):
            for field, value in (("key", r.key), ("model", r.model), ("status", str(r.status))):
                counts = self.counts[field]
                n = counts[value] = counts.get(value, 0) + 1
                offsets = self.offsets[field]
                if n <= RARE:
                    offsets.setdefault(value, []).append(offset)
                elif n == RARE + 1:
                    del offsets[value]
            self.time_min = min(self.time_min, r.time)
            self.end_max = max(self.end_max, r.end)
            offset += len(line)
        self.count += len(records)

    def doc(self) -> dict[str, Any]:
        return {"count": self.count, "counts": self.counts, "rare": self.offsets,
                "time_min": self.time_min, "end_max": self.end_max}


class Rollups:
    """Per-hour usage deltas (requests, tokens in/out, errors, refusals per key and model) not yet
    committed, cut into numbered batches. A batch is sent until acknowledged, always with the same
    `seq`: the leader applies each (gateway, boot, seq) once, so a retry never counts twice."""

    def __init__(self, gateway: str, boot: str | None = None) -> None:
        self.gateway = gateway
        self.boot = boot or os.urandom(6).hex()  # this process: its seqs start again at 1
        self._pending: dict[tuple[int, str, str], list[int]] = {}
        self._in_flight: dict[str, Any] | None = None
        self._seq = 0

    def add(self, records: list[RequestRecord]) -> None:
        pending = self._pending
        for r in records:
            row = pending.get(k := (int(r.time // 3600) * 3600, r.key, r.model))
            if row is None:
                row = pending[k] = [0, 0, 0, 0, 0]
            row[0] += 1
            row[1] += r.tokens_in or 0
            row[2] += r.tokens_out or 0
            if r.status >= 400:
                row[4 if not r.replica else 3] += 1  # refused by the gateway / failed at a replica

    def batch(self) -> dict[str, Any] | None:
        """The batch to send now: the unacknowledged one again, else a new one (None: nothing to send)."""
        if self._in_flight is None and self._pending:
            rows = []
            for k in list(self._pending)[:usage.MAX_ROWS]:
                counts = self._pending.pop(k)
                rows.append(usage.row_doc(k[0], k[1], k[2], *counts))
            self._seq += 1
            self._in_flight = {"boot": self.boot, "seq": self._seq, "rows": rows}
        return self._in_flight

    def acked(self, boot: str, seq: int) -> bool:
        if self._in_flight is not None and boot == self.boot and seq == self._in_flight["seq"]:
            self._in_flight = None
            return True
        return False

    def unsent(self) -> int:
        return len(self._pending) + (len(self._in_flight["rows"]) if self._in_flight else 0)


class RequestLog:
    """One gateway's log. `directory` None keeps no files (the records still feed the rollups)."""

    def __init__(self, directory: Path | None, gateway: str, *,
                 settings: Callable[[], Mapping[str, Any]] = dict,
                 timeouts: Timeouts = TIMEOUTS, queue_records: int = QUEUE_RECORDS,
                 segment_bytes: int = SEGMENT_BYTES) -> None:
        self.dir = directory
        self.gateway = gateway
        self.tag = gateway_tag(gateway)
        self.settings = settings  # the cluster's settings now (retention); may raise before the first table
        self.timeouts = timeouts
        self.rollups = Rollups(gateway)
        self.queue_records = queue_records
        self.segment_bytes = segment_bytes
        self.query_url = ""  # where control asks this gateway (set once it listens)
        self._queue: deque[RequestRecord] = deque()
        self.dropped = 0
        self.written = 0
        self.write_errors = 0
        self._prefix = f"req-{self.tag}-"

    # --- the request path -------------------------------------------------------------------

    def new_id(self) -> str:
        return self._prefix + os.urandom(8).hex()

    def record(self, record: RequestRecord) -> None:
        """Queue one record; never waits. A full queue drops it (counted in `dropped`)."""
        if len(self._queue) < self.queue_records:
            self._queue.append(record)
        else:
            self.dropped += 1

    def finish(self, ex: RequestFacts, path: str, status: int, wall: float, started: float) -> RequestRecord:
        """Record a finished request from what the app knows of it (`started`: trio time, `wall`: unix);
        the record is returned for the metrics' counters (llmgw/metrics/gateway.py)."""
        now = trio.current_time()
        ticket = ex.ticket
        self.record(record := RequestRecord(
            ex.request_id, wall, ex.key.id if ex.key is not None else "", "" if ex.model == "-" else ex.model,
            status, ex.error or ("client_disconnected" if status == 499 else ""),
            "" if ex.replica == "-" else ex.replica, ex.node, path[:200], ex.tokens_in, ex.tokens_out,
            round((now - started) * 1000, 3), None if ex.ttft is None else round((ex.ttft - started) * 1000, 3),
            ex.guard_rule, self.gateway, ex.served, "" if ticket is None else CLASSES[ticket.rank],
            None if ticket is None or ticket.waited < 0 else round(ticket.waited * 1000, 3)))
        return record

    # --- the writer -------------------------------------------------------------------------

    def statistics(self) -> dict[str, Any]:
        return {"queued": len(self._queue), "dropped": self.dropped, "written": self.written,
                "write_errors": self.write_errors, "keeps_log": self.dir is not None,
                "usage_rows_unsent": self.rollups.unsent()}

    def take(self) -> list[RequestRecord]:
        """Everything queued, oldest first, for the writer (and the rollups)."""
        queue, self._queue = self._queue, deque()
        return list(queue)

    def limits(self) -> Limits:
        try:
            return Limits.of(self.settings())
        except Exception:  # no table yet (a remote gateway before its first): the defaults
            return Limits.of({})

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Drain the queue every `requestlog_flush_s` until cancelled; on the way out, write what is left."""
        writer = SegmentWriter(self.dir, self.segment_bytes) if self.dir is not None else None
        task_status.started()
        pruned_at = float("-inf")
        try:
            while True:
                await trio.sleep(self.timeouts.requestlog_flush_s)
                now = time.time()
                prune = now - pruned_at >= self.timeouts.requestlog_prune_s
                if prune:
                    pruned_at = now
                await self.flush(writer, prune=prune, now=now)
        finally:
            with trio.CancelScope(shield=True):
                await self.flush(writer, prune=False, now=time.time())
                if writer is not None:
                    await trio.to_thread.run_sync(writer.close)

    async def flush(self, writer: SegmentWriter | None, *, prune: bool, now: float) -> None:
        batch = self.take()
        if batch:
            self.rollups.add(batch)
        if writer is None or not (batch or prune):
            return
        limits = self.limits() if prune else None

        def work() -> None:
            if batch:
                writer.write(batch)
            if limits is not None:
                writer.prune(limits, now)

        try:
            await trio.to_thread.run_sync(work)
            self.written += len(batch)
        except OSError as e:
            self.write_errors += 1
            self.dropped += len(batch)
            log.warning("request log: %d record(s) not written to %s: %s", len(batch), self.dir, e)


async def push_usage(rlog: RequestLog, submit: Callable[[dict[str, Any]], Any], *,
                     task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Commit the rollups straight to the store (a gateway in the control's process, as in `llmgw up`)."""
    task_status.started()
    while True:
        await trio.sleep(rlog.timeouts.usage_report_s)
        while (batch := rlog.rollups.batch()) is not None:
            command = usage.add_usage(rlog.gateway, batch["boot"], batch["seq"], batch["rows"],
                                      rlog.query_url, time.time())
            try:
                await submit(command)
            except CommandError as e:  # refused as malformed: sending it again cannot help
                log.warning("usage batch %d refused (%s): its counts are lost", batch["seq"], e)
            except Exception as e:  # the store is not ready, or lost its leader: the same batch again later
                log.info("usage batch %d not committed yet: %s", batch["seq"], e)
                break
            rlog.rollups.acked(batch["boot"], batch["seq"])
