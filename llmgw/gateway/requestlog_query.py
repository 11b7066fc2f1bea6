"""Reading a gateway's request log: the newest records matching a filter, by cursor, and one by id; and
the gateway's own query endpoint (`PATH`, admin key) that control fans `GET /api/v1/requests` out to.

Fast without an index: segments are read newest first through `mmap`; a segment whose summary
lacks the filter's key, model or status is skipped; within one, the filter's most selective field
is found as bytes (`"key":"K",`) with `rfind`, so only candidate lines are parsed and checked.
"""

from __future__ import annotations

import json
import mmap
import re
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote

import trio

from llmgw.domain.keys import hash_key
from llmgw.errors import OpenAIError
from llmgw.gateway.requestlog import RequestLog, read_summary, record_doc, segments
from llmgw.interfaces import StateReader
from llmgw.trust.ca import CaError, identity
from llmgw.trust.tls import peer_certificate
from llmgw.wire.asgi import dumps
from llmgw.wire.logquery import ID_RE, MAX_LIMIT, PATH, Filters, QueryError, json_bytes

_CURSOR_RE = re.compile(r"(\d{1,10}):(\d{1,15})\Z")


def parse_cursor(raw: str | None) -> tuple[int, int] | None:
    """`SEQ:OFFSET`: records before byte OFFSET of segment SEQ, then older segments."""
    if not raw:
        return None
    m = _CURSOR_RE.match(raw)
    if m is None:
        raise QueryError(f"cursor must be SEQ:OFFSET, not {raw!r:.40}")
    return int(m.group(1)), int(m.group(2))


def query(directory: Path, filters: Filters, limit: int,
          before: tuple[int, int] | None = None) -> tuple[list[dict[str, Any]], list[str], str | None]:
    """The newest `limit` matching records (newest first), the cursor after each, and the cursor of the
    next page (None: no more). Synchronous: run it in a worker thread."""
    found: list[dict[str, Any]] = []
    positions: list[str] = []
    for seq, path in reversed(segments(directory)):
        if before is not None and seq > before[0]:
            continue
        skip, needles, offsets = filters.plan(read_summary(path))
        if skip:
            continue
        end = before[1] if before is not None and seq == before[0] else None
        for offset, doc in _scan(path, end, needles, offsets, filters, limit - len(found)):
            found.append(doc)
            positions.append(f"{seq}:{offset}")
            if len(found) == limit:
                return found, positions, positions[-1]
    return found, positions, None


def find(directory: Path, request_id: str) -> dict[str, Any] | None:
    """The record of one request id, or None. Synchronous."""
    needle = b'"id":' + json_bytes(request_id) + b","
    for _, path in reversed(segments(directory)):
        for _, doc in _scan(path, None, [needle], None, Filters(), 1):
            if doc.get("id") == request_id:
                return doc
    return None


def _scan(path: Path, end: int | None, needles: list[bytes], offsets: list[int] | None, filters: Filters,
          want: int) -> list[tuple[int, dict[str, Any]]]:
    """Matching lines of one segment before byte `end`, newest first: (line offset, record). The
    candidates: the lines at `offsets` when given, else those holding the first needle, else all."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            if size == 0:
                return []
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        return []
    out: list[tuple[int, dict[str, Any]]] = []
    timed = filters.since is not None or filters.until is not None
    try:
        # Whole lines only: a tail without its newline is a write in progress or a torn one.
        stop = data.rfind(b"\n", 0, size if end is None else min(end, size)) + 1
        listed = iter(reversed(offsets)) if offsets is not None else None
        first, rest = (needles[0], needles[1:]) if needles and listed is None else (None, needles)
        while stop > 0 and len(out) < want:
            if listed is not None:
                start = next(listed, -1)
                if start < 0:
                    break
                if start >= stop:
                    continue
                line_end = data.find(b"\n", start, stop)
                if line_end < 0:
                    continue
            elif first is not None:
                pos = data.rfind(first, 0, stop)
                if pos < 0:
                    break
                start = data.rfind(b"\n", 0, pos) + 1
                line_end = data.find(b"\n", pos, stop)
            else:
                line_end = stop - 1
                start = data.rfind(b"\n", 0, line_end) + 1
            line = data[start:line_end]
            stop = start
            if rest and not all(n in line for n in rest):
                continue
            if timed and not filters.in_time(_line_time(line)):
                continue
            doc = record_doc(line)
            if doc is not None and filters.match(doc):
                out.append((start, doc))
    finally:
        data.close()
    return out


def _line_time(line: bytes) -> float | None:
    """The record's `time`, read from its bytes without parsing the line (a cheap first check)."""
    at = line.find(b'"time":')
    comma = line.find(b",", at)
    try:
        return float(line[at + 7:comma]) if at >= 0 and comma > at else None
    except ValueError:
        return None


# --- the gateway's endpoint -----------------------------------------------------------------


async def answer(scope: dict[str, Any] | Any, state: StateReader, rlog: RequestLog) -> tuple[int, bytes]:
    """`GET PATH?model=&key=&status=&since=&until=&priority=&limit=&cursor=` or `GET PATH/{id}`: (status, JSON body).
    Only an admin key of the cluster may ask (the key control's stream uses)."""
    if scope["method"] != "GET":
        raise OpenAIError(405, "method_not_allowed", f"{scope['method']} is not allowed on {PATH}")
    _admin(scope, state)
    rest = scope["path"][len(PATH):]
    base = {"gateway": rlog.gateway, "statistics": rlog.statistics()}
    if rest and rest != "/":
        if not rest.startswith("/"):
            raise OpenAIError(404, "not_found", f"unknown path {scope['path']}")
        request_id = unquote(rest[1:])
        if rlog.dir is None or not ID_RE.match(request_id):
            return 200, dumps({**base, "request": None})
        doc = await trio.to_thread.run_sync(find, rlog.dir, request_id)
        return 200, dumps({**base, "request": doc})
    params = {k: v[-1] for k, v in parse_qs(scope.get("query_string", b"").decode("latin-1"),
                                             keep_blank_values=True).items()}
    try:
        filters = Filters.parse(params)
        before = parse_cursor(params.get("cursor"))
        limit = _limit(params.get("limit"))
    except QueryError as e:
        raise OpenAIError(400, "invalid_request", str(e)) from None
    if rlog.dir is None:
        return 200, dumps({**base, "requests": [], "positions": [], "cursor": None})
    records, positions, cursor = await trio.to_thread.run_sync(query, rlog.dir, filters, limit, before)
    return 200, dumps({**base, "requests": records, "positions": positions, "cursor": cursor})


def _limit(raw: str | None) -> int:
    if not raw:
        return 100
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIMIT:
        raise QueryError(f"limit must be a whole number from 1 to {MAX_LIMIT}")
    return int(raw)


def _admin(scope: Any, state: StateReader) -> None:
    """A control plane's certificate (its TLS handshake verified the chain against the cluster's bundle),
    or an admin or viewer key (a control plane asking over loopback, or an operator)."""
    peer = peer_certificate()
    if peer is not None:
        try:
            if identity(peer).role == "control":
                return
        except CaError:
            pass
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, key = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and key.strip():
                found = state.snapshot().keys.get(hash_key(key.strip()))
                if found is not None and found.role in ("admin", "viewer"):  # reading: a viewer may
                    return
    raise OpenAIError(401, "invalid_api_key", "this gateway's request log answers a control plane's certificate, "
                      "or an admin or viewer key",
                      headers=[(b"www-authenticate", b"Bearer")])
