"""The console's page shell (nav, banners, live updates) and its small HTML helpers: `page`, `esc`,
`table`, `pager`, `bar`. Every console page is built from these, so all pages look and update alike.

A page asked with `?fragment=1` (console.js asks every few seconds) is answered with its banners and
main content only, which the script swaps in without reloading the page.
"""

from __future__ import annotations

import html as _html
from typing import TYPE_CHECKING, Any, Iterable, Sequence
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from quart import current_app, request

if TYPE_CHECKING:
    from llmgw.console.sessions import Session

NAV = (("Overview", "/"), ("Nodes", "/nodes"), ("Models", "/models"), ("Requests", "/requests"),
       ("Guardrails", "/guardrails"), ("Mirror", "/mirror"), ("Settings", "/settings"), ("Do", "/do"))
UNKNOWN = '<span class="unknown">unknown</span>'  # never shown as zero, idle or healthy


def esc(value: object) -> str:
    """`value` as HTML text (quotes escaped too, so it is safe in an attribute); None is ''."""
    return "" if value is None else _html.escape(str(value), quote=True)


def cell(value: object) -> str:
    """A table cell's HTML from a plain value: None is shown as unknown (never as zero)."""
    return UNKNOWN if value is None else esc(value)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, sortable: bool = True,
          testid: str = "", empty: str = "none") -> str:
    """A table. Headers are text (escaped here); a cell that is a `str` is HTML as given (use `esc` for
    text), any other value is shown by `cell` (None as unknown). `sortable`: a click on a header sorts
    the rows shown (console.js)."""
    attrs = f' data-testid="{esc(testid)}"' if testid else ""
    sort = ' data-sort="1"' if sortable else ""
    head = "".join(f"<th{sort}>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c if isinstance(c, str) else cell(c)}</td>" for c in row) + "</tr>"
                   for row in rows)
    if not body:
        body = f'<tr class="empty"><td colspan="{len(headers)}">{esc(empty)}</td></tr>'
    # In a box of its own: a table wider than its place (a narrow window) scrolls as a whole, its card does not.
    return f'<div class="table-wrap"><table class="{"sortable" if sortable else "plain"}"{attrs}><thead><tr>' \
           f'{head}</tr></thead><tbody>{body}</tbody></table></div>'


def with_query(base_url: str, **params: object) -> str:
    """`base_url` with these query parameters set (None removes one); the others kept."""
    parts = urlsplit(base_url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k not in params]
    query += [(k, str(v)) for k, v in params.items() if v is not None]
    return urlunsplit(("", "", parts.path or "/", urlencode(query), ""))


def page_number(raw: str | None, total: int, per_page: int) -> int:
    """The 1-based page asked (`?page=`), kept within 1..last; anything unreadable is page 1."""
    last = max(1, -(-total // per_page))
    try:
        wanted = int(raw or "1")
    except ValueError:
        wanted = 1
    return min(max(1, wanted), last)


def pager(total: int, page: int, per_page: int, base_url: str) -> str:
    """'rows a-b of total' with first/previous/next/last links (`page=` set on `base_url`)."""
    last = max(1, -(-total // per_page))
    first_row = 0 if total == 0 else (page - 1) * per_page + 1
    last_row = min(total, page * per_page)
    links = []
    for label, name, target in (("« first", "first", 1), ("‹ previous", "previous", page - 1),
                                ("next ›", "next", page + 1), ("last »", "last", last)):
        if 1 <= target <= last and target != page:
            links.append(f'<a href="{esc(with_query(base_url, page=target))}" data-testid="pager-{name}">'
                         f'{esc(label)}</a>')
    return (f'<nav class="pager" data-testid="pager" data-total="{total}" data-page="{page}">'
            f'<span>rows {first_row}–{last_row} of {total} (page {page} of {last})</span>{"".join(links)}</nav>')


def bar(used: float | None, total: float | None, *, label: str = "") -> str:
    """A usage bar: `used` of `total`; unknown when either is unknown."""
    if used is None or total is None:
        return UNKNOWN
    share = 0.0 if total <= 0 else max(0.0, min(1.0, used / total))
    title = esc(label or f"{used:g} of {total:g}")
    return (f'<span class="bar" role="meter" aria-valuenow="{share * 100:.0f}" title="{title}">'
            f'<span style="width:{share * 100:.1f}%"></span></span> {title}')


def _banners() -> str:
    """The banners every page shows: the system stopped, this member a standby."""
    from llmgw.console.sessions import console_of
    from llmgw.domain.settings import effective

    console = console_of(current_app)  # type: ignore[arg-type]
    store = console.ctx.store
    out = []
    if effective(store.snapshot().settings, "serving.stopped"):
        out.append('<div class="banner stopped" id="stopped-banner" data-testid="stopped-banner">The system is '
                   'stopped (serving.stopped): no model runs and the gateways answer 503 system_stopped. '
                   'Start it from Do, or with <code>llmgw start</code>.</div>')
    if not store.is_leader():
        out.append('<div class="banner info" data-testid="standby-banner">This control plane is a standby: it '
                   'shows the replicated state; what the nodes report live and every action are on the leader.'
                   '</div>')
    return "".join(out)


def is_fragment() -> bool:
    return bool(request.args.get("fragment"))


def page(title: str, active: str, body: str, *, session: Session) -> str:
    """A whole console page (or, asked with `?fragment=1`, its banners and content only). `active` is the
    nav link's name (Overview, Nodes, ...) to mark; `body` is HTML."""
    content = f'<div id="banners">{_banners()}</div><h1>{esc(title)}</h1>{body}'
    if is_fragment():
        return content
    from llmgw.console.sessions import console_of, csrf_field

    current = ' class="active" aria-current="page"'
    refresh_s = console_of(current_app).ctx.reconciler.timeouts.console_refresh_s  # type: ignore[arg-type]
    nav = "".join(f'<a href="{href}" id="nav-{name.lower()}" data-testid="nav-{name.lower()}"'
                  f'{current if name == active else ""}>{name}</a>' for name, href in NAV)
    who = (f'<span class="who" data-testid="signed-in-as">{esc(session.key_id)} ({esc(session.role)})'
           f' <form method="post" action="/signout" id="signout-form">{csrf_field(session)}'
           f'<button type="submit" data-testid="signout">Sign out</button></form></span>')
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{esc(title)} · llmgw</title>'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<link rel="stylesheet" href="/console/static/console.css"></head>'
            f'<body data-refresh-s="{refresh_s:g}"><header><strong>llmgw</strong><nav>{nav}</nav>{who}</header>'
            f'<main id="main" data-testid="main">{content}</main>'
            f'<script src="/console/static/console.js"></script></body></html>')


def bare(title: str, body: str) -> str:
    """A page without nav (sign-in, refusals when signed out)."""
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{esc(title)} · llmgw</title>'
            f'<link rel="stylesheet" href="/console/static/console.css"></head>'
            f'<body><header><strong>llmgw</strong></header><main id="main">{body}</main></body></html>')
