"""The console's Requests page (`/requests`): the gateways' request logs through the same function as
`GET /api/v1/requests` (`admin_requests.list_page`: its filters, its cursor), asked with the signed-in
key, and which gateways did not answer and why.

Times in the form are UTC dates (2026-01-31, 2026-01-31T12:00) or unix seconds; an empty field is no filter.
"""

from __future__ import annotations

import calendar
import time
from typing import TYPE_CHECKING, Any, Mapping

from llmgw.console import auth, sessions
from llmgw.console.layout import cell, esc, page, table, with_query
from llmgw.control.ops.requests import list_page
from llmgw.errors import AdminError

if TYPE_CHECKING:
    from quart_trio import QuartTrio

    from llmgw.control.context import Context

FILTERS = ("model", "key", "status", "since", "until", "priority")
PER_PAGE = 50
_FORMATS = ("%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M", "%Y-%m-%d")


def unix_time(text: str) -> str:
    """A form's time as the API's unix seconds; AdminError naming the field's forms otherwise."""
    text = text.strip().removesuffix("Z")
    try:
        return str(float(text))
    except ValueError:
        pass
    for fmt in _FORMATS:
        try:
            return str(calendar.timegm(time.strptime(text, fmt)))
        except ValueError:
            continue
    raise AdminError(400, "invalid_query", f"{text!r:.40} is not a time: give a UTC date (2026-01-31, "
                                           "2026-01-31T12:00) or unix seconds")


def api_args(args: Mapping[str, str]) -> dict[str, str]:
    """The API's query from the page's: filters given (empty ones left out), times made unix seconds."""
    out = {k: args[k].strip() for k in FILTERS if args.get(k, "").strip()}
    for k in ("since", "until"):
        if k in out:
            out[k] = unix_time(out[k])
    if args.get("cursor"):
        out["cursor"] = args["cursor"]
    out["limit"] = str(PER_PAGE)
    return out


def _when(t: Any) -> str:
    if not isinstance(t, (int, float)):
        return cell(None)
    return esc(time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) + " UTC")


def _form(args: Mapping[str, str]) -> str:
    fields = "".join(f'<label>{k} <input name="{k}" id="filter-{k}" data-testid="filter-{k}" value="'
                     f'{esc(args.get(k, ""))}" size="{12 if k in ("since", "until") else 14}"></label> '
                     for k in FILTERS)
    return (f'<form method="get" action="/requests" id="requests-filter" data-testid="requests-filter">{fields}'
            '<button type="submit">Filter</button> <a href="/requests">clear</a></form>'
            '<p class="hint">status: a code (429) or a class (4xx); key: a key id (key_...); since/until: UTC '
            '(2026-01-31T12:00) or unix seconds; priority: system, interactive, default or bulk.</p>')


def render(doc: Mapping[str, Any], args: Mapping[str, str]) -> str:
    gateways = doc["gateways"]
    unavailable = gateways.get("unavailable") or []
    out = ""
    if unavailable:
        items = "".join(f'<li><strong>{esc(u["gateway"])}</strong>: {esc(u["reason"])}</li>' for u in unavailable)
        out += (f'<div class="banner warn" data-testid="gateways-unavailable">{len(unavailable)} of '
                f'{len(gateways.get("asked") or [])} gateways did not answer: their requests are missing from this '
                f'list.<ul>{items}</ul></div>')
    dropped = {n: d for n, d in (gateways.get("dropped") or {}).items() if d}
    if dropped:
        out += ('<div class="banner warn" data-testid="gateways-dropped">records dropped (queue full): ' +
                esc(", ".join(f"{n}: {d}" for n, d in sorted(dropped.items()))) + "</div>")
    out += (f'<p data-testid="gateways-asked">gateways asked: {esc(", ".join(gateways.get("asked") or [])) or "none"}'
            f'; answered: {esc(", ".join(gateways.get("answered") or [])) or "none"}</p>')
    rows = [[f'<code>{esc(r.get("id"))}</code>', _when(r.get("time")), esc(_model(r)),
             esc(r.get("key") or "—"), cell(r.get("status")), esc(r.get("error") or ""),
             cell(r.get("latency_ms")), cell(r.get("tokens_in")), cell(r.get("tokens_out")),
             esc(r.get("priority") or "-"), esc(_ms(r.get("queue_ms")) or "-"),  # unknown: `-`, as in `ctl requests`
             esc(r.get("guard_rule") or ""), esc(r.get("node") or ""), esc(r.get("gateway") or "")]
            for r in doc["requests"]]
    out += table(["id", "time", "model", "key", "status", "error", "latency ms", "tokens in", "tokens out",
                  "class", "queue ms", "guard_rule", "node", "gateway"], rows, testid="requests-table",
                 empty="no request matches")
    base = with_query("/requests", **{k: args.get(k) or None for k in FILTERS})
    links = []
    if args.get("cursor"):
        links.append(f'<a href="{esc(base)}" data-testid="pager-newest">« newest</a>')
    if doc.get("next_cursor"):
        links.append(f'<a href="{esc(with_query(base, cursor=doc["next_cursor"]))}" data-testid="pager-next">'
                     f'older ›</a>')
    out += f'<nav class="pager" data-testid="pager"><span>{len(doc["requests"])} shown</span>{"".join(links)}</nav>'
    return out


def register(app: QuartTrio) -> None:
    @auth.console_route(app, "/requests")
    async def requests_page(session: sessions.Session, ctx: Context) -> str:
        from quart import request

        args = {k: v for k, v in request.args.items() if k in (*FILTERS, "cursor")}
        try:
            doc = await list_page(ctx, api_args(args), auth.authorization(session))
        except AdminError as e:
            body = _form(args) + (f'<div class="banner warn" data-testid="requests-error">{esc(e.message)}</div>')
            return page("Requests", "Requests", body, session=session)
        body = _form(args) + render(doc, args)
        # The page a cursor points at changes as requests come: only the newest page updates live.
        return page("Requests", "Requests", body if not args.get("cursor") else
                    f'<div data-no-refresh>{body}</div>', session=session)


def _ms(value: Any) -> str | None:
    """A wait in ms as `ctl requests` shows it (one decimal); None: unknown (never asked for a slot)."""
    return f"{value:.1f}" if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _model(r: Any) -> str:
    """The name asked for, and the model that served it when another did (an alias's, a fallback)."""
    asked, served = r.get("model") or "—", r.get("served_model")
    return f"{asked} → {served}" if isinstance(served, str) and served and served != r.get("model") else asked
