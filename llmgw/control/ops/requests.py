"""The request log and usage: requests asked of the gateways that hold the records, merged newest first,
with the gateways that did not answer named; one request by id; the committed usage rollups.

The raw log stays on each gateway (never in the Raft state): the leader fans a query out over HTTP to
each gateway's own endpoint (`logquery.PATH`, the caller's admin key), at the URL the gateway
announced. Gateways are known from their streams and, durably, from the usage batches they committed.
"""

from __future__ import annotations

import base64
import heapq
import ipaddress
import json
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
import trio

from llmgw.control.context import Context
from llmgw.control.gateway_stream import hub_of, reachable_url
from llmgw.domain import usage
from llmgw.errors import AdminError
from llmgw.wire.logquery import ID_RE, MAX_LIMIT, PATH, Filters, QueryError, gateway_tag

_FILTERS = ("model", "key", "status", "since", "until", "priority")


def known_gateways(ctx: Context) -> dict[str, str]:
    """Gateway name -> the URL its log answers at: each that committed usage within the retention
    (durable: a gateway lost since is still asked, and named when it does not answer), and each
    following this leader now (its latest word wins)."""
    out = {name: reachable_url(mark.query_url, "127.0.0.1") for name, mark in
           usage.gateways(ctx.state()).items()}
    hub = hub_of(ctx.reconciler)
    for name, link in (hub.links.items() if hub is not None else ()):
        if link.query_url or name not in out:
            out[name] = link.query_url
    return out


async def _ask(clients: _Clients, name: str, url: str, path: str, params: dict[str, str],
               auth: str, answers: dict[str, Any], failures: dict[str, str]) -> None:
    if not url:
        failures[name] = "it announced no address for its request log"
        return
    try:
        if url.startswith("https://"):
            if clients.tls is None:
                failures[name] = "it serves TLS, and this control plane holds no certificate to ask it with"
                return
            # This member's certificate is the credential: the caller's key never goes to a machine.
            response = await clients.tls.get(url + path, params=params)
        elif _loopback(url):  # a gateway in this machine (`llmgw up`'s own, a test's): the caller's key
            response = await clients.plain.get(url + path, params=params, headers={"authorization": auth})
        else:
            failures[name] = ("it serves plain HTTP off this machine: an admin key is never sent there (start it "
                              "with TLS: docs/security.md)")
            return
        doc = response.json()
        if response.status_code != 200 or not isinstance(doc, dict):
            failures[name] = f"it answered {response.status_code}"
        elif not doc.get("statistics", {}).get("keeps_log", True):
            failures[name] = "it keeps no request log (started without --state-dir)"
        else:
            answers[name] = doc
    except (httpx.HTTPError, ValueError) as e:
        failures[name] = f"{url} did not answer: {type(e).__name__}: {e}"


async def fan_out(ctx: Context, gateways: dict[str, str], path: str,
                  params: dict[str, dict[str, str]], authorization: str | None
                  ) -> tuple[dict[str, Any], dict[str, str]]:
    """Ask each gateway (in parallel, each within `requests_query_s`) with the caller's `authorization`:
    its answers and why the others did not."""
    answers: dict[str, Any] = {}
    failures: dict[str, str] = {}
    auth = authorization or ""
    timeout = ctx.timeouts.requests_query_s
    tls = ctx.trust.client_context() if ctx.trust is not None else None
    async with httpx.AsyncClient(timeout=timeout) as plain, \
            httpx.AsyncClient(timeout=timeout, verify=tls if tls is not None else True) as with_tls:
        clients = _Clients(plain, with_tls if tls is not None else None)
        async with trio.open_nursery() as nursery:
            for name, url in gateways.items():
                nursery.start_soon(_ask, clients, name, url, path, params.get(name, {}), auth, answers, failures)
    return answers, failures


@dataclass(frozen=True)
class _Clients:
    plain: httpx.AsyncClient  # gateways on this machine's loopback, asked with the caller's key
    tls: httpx.AsyncClient | None  # gateways serving TLS, asked with this member's certificate


def _loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _only(args: Any, known: tuple[str, ...]) -> None:
    """400 for a query parameter the route does not take: a misspelt filter must not answer unfiltered."""
    unknown = sorted(set(args) - set(known))
    if unknown:
        raise AdminError(400, "invalid_query", f"unknown query parameter {unknown[0]!r:.60}; this route takes "
                                               f"{', '.join(known)}")


def _read_cursor(raw: str | None) -> dict[str, str | None] | None:
    if not raw:
        return None
    try:
        doc = json.loads(base64.urlsafe_b64decode(raw.encode() + b"=" * (-len(raw) % 4)))
    except (ValueError, UnicodeError, RecursionError):  # a forged cursor may nest deeper than json can
        doc = None
    if not isinstance(doc, dict) or not all(isinstance(v, (str, type(None))) for v in doc.values()):
        raise AdminError(400, "invalid_query", "cursor is not one this API gave (pass next_cursor as it came)")
    return doc


def _write_cursor(positions: dict[str, str | None]) -> str:
    return base64.urlsafe_b64encode(json.dumps(positions, separators=(",", ":")).encode()).decode().rstrip("=")


def _merge(answers: dict[str, Any], cursor: dict[str, str | None],
           limit: int) -> tuple[list[dict[str, Any]], dict[str, str | None]]:
    """The newest `limit` records of all answers (by when each request ended), and each gateway's next
    position: after the last of its records taken (so pages never skip or repeat a record)."""
    def tagged(name: str, doc: dict[str, Any]) -> list[tuple[float, str, int, dict[str, Any]]]:
        return [(-(r.get("time", 0) + (r.get("latency_ms") or 0) / 1000), name, i, r)
                for i, r in enumerate(doc.get("requests", []))]

    merged = heapq.merge(*(tagged(n, d) for n, d in sorted(answers.items())))
    taken: dict[str, int] = {}
    records: list[dict[str, Any]] = []
    for _, name, i, record in merged:
        if len(records) == limit:
            break
        records.append(record)
        taken[name] = i + 1
    positions: dict[str, str | None] = dict(cursor)
    for name, doc in answers.items():
        got, n = doc.get("requests", []), taken.get(name, 0)
        if n == len(got):
            positions[name] = doc.get("cursor") if n == limit else None
        elif n:
            positions[name] = doc.get("positions", [None] * n)[n - 1]
    return records, positions


async def list_page(ctx: Context, args: Mapping[str, str], authorization: str | None) -> dict[str, Any]:
    """`GET /api/v1/requests`'s answer for these query `args` (the console calls it too): the newest
    records of every gateway, the cursor of the next page, and which gateways did not answer."""
    _only(args, (*_FILTERS, "limit", "cursor"))
    empty = [k for k in ("status", "since", "until", "priority") if args.get(k) == ""]
    if empty:  # read as "no filter" by the gateways: say so rather than answer unfiltered
        raise AdminError(400, "invalid_query", f"{empty[0]} is empty: give a value, or leave it out")
    query = {k: args[k] for k in _FILTERS if k in args}
    try:
        Filters.parse(query)  # refused here once, not by every gateway
    except QueryError as e:
        raise AdminError(400, "invalid_query", str(e)) from None
    raw_limit = args.get("limit", "50")
    # ASCII digits, a few: `str.isdigit` takes '²' and int() takes no more than 4300 digits (both were 500s).
    if not re.fullmatch(r"[0-9]{1,9}", raw_limit) or not 1 <= int(raw_limit) <= MAX_LIMIT:
        raise AdminError(400, "invalid_query", f"limit must be a whole number from 1 to {MAX_LIMIT}")
    limit = int(raw_limit)
    cursor = _read_cursor(args.get("cursor"))
    gateways = known_gateways(ctx)
    ask = {n: u for n, u in gateways.items() if cursor is None or n not in cursor or cursor[n] is not None}
    params = {n: {**query, "limit": str(limit), **({"cursor": c} if (c := (cursor or {}).get(n)) else {})}
              for n in ask}
    answers, failures = await fan_out(ctx, ask, PATH, params, authorization)
    records, positions = _merge(answers, cursor or {}, limit)
    more = any(p is not None for p in positions.values())  # a gateway that failed keeps its place
    return {
        "requests": records,
        "next_cursor": _write_cursor(positions) if more else None,
        "gateways": {"asked": sorted(ask), "answered": sorted(answers),
                     "unavailable": [{"gateway": n, "reason": failures[n]} for n in sorted(failures)],
                     "dropped": {n: a.get("statistics", {}).get("dropped") for n, a in sorted(answers.items())}},
    }


async def one(ctx: Context, request_id: str, authorization: str | None) -> dict[str, Any]:
    """One request's record, from the gateway its id names."""
    m = ID_RE.match(request_id)
    if m is None:
        raise AdminError(404, "request_not_found", f"{request_id!r:.80} is not a request id of this cluster "
                                                   "(req-GATEWAY-HEX16)")
    gateways = {n: u for n, u in known_gateways(ctx).items() if gateway_tag(n) == m.group(1)}
    if not gateways:
        raise AdminError(404, "request_not_found", f"no gateway known to this cluster is named "
                                                   f"{m.group(1)!r}, the gateway that request id names")
    answers, failures = await fan_out(ctx, gateways, f"{PATH}/{request_id}", {}, authorization)
    for name, doc in sorted(answers.items()):
        if doc.get("request"):
            return {"request": doc["request"], "gateway": name}
    if failures:
        raise AdminError(503, "gateway_unavailable", "the gateway holding this request did not answer: " +
                         "; ".join(f"{n}: {why}" for n, why in sorted(failures.items())))
    raise AdminError(404, "request_not_found", f"gateway {', '.join(sorted(answers))} has no record of "
                                               f"{request_id} (past its retention, or never logged)")


async def usage_rollups(ctx: Context, args: Mapping[str, str]) -> dict[str, Any]:
    """The committed usage rollups in a time window, by total, hour or day."""
    _only(args, ("since", "until", "key", "model", "by"))
    now = time.time()
    try:
        since = float(args.get("since", now - 86400))
        until = float(args.get("until", now + 3600))
    except ValueError:
        raise AdminError(400, "invalid_query", "since and until are unix seconds") from None
    if not (math.isfinite(since) and math.isfinite(until)):  # nan and inf parse, but are no time (nor JSON)
        raise AdminError(400, "invalid_query", "since and until must be finite unix seconds")
    by = args.get("by", "total")
    if by not in ("total", "hour", "day"):
        raise AdminError(400, "invalid_query", "by must be total, hour or day")
    rows = usage.query(ctx.state(), since=since, until=until, key=args.get("key"),
                       model=args.get("model"), by=by)
    totals = {n: sum(r[n] for r in rows) for n in usage.COUNTS}
    return {"since": since, "until": until, "by": by, "usage": rows, "totals": totals}
