"""The console's Overview (`/`): the cluster summary `ctl status` reads (`domain.summary.Summary`), shown
as aggregates first (capacity per GPU class, fabrics, models by state) and the usage rollups' chart.

Lists that grow with the fleet (warnings, parked models, idle models) show their first rows and how
many more, with a link to the page that lists them all, so the page stays small at 2,000 models.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING
from urllib.parse import quote

from llmgw.console import auth, chart, sessions
from llmgw.console.layout import UNKNOWN, bar, cell, esc, page, table
from llmgw.console.models import error_once
from llmgw.domain import usage
from llmgw.domain.judges import Guard
from llmgw.domain.summary import ClusterPart, Summary
from llmgw.domain.summary_fleet import CapacityRow, Fabric, IdleRow

if TYPE_CHECKING:
    from quart_trio import QuartTrio

    from llmgw.control.context import Context

SHOWN = 20  # rows of each growing list on the Overview; the rest are on their own pages
CHART_HOURS = 24


def _more(total: int, shown: int, href: str, what: str) -> str:
    if total <= shown:
        return ""
    return f'<p class="more" data-testid="more-{esc(what)}">… and {total - shown} more: <a href="{esc(href)}">' \
           f'all {esc(what)}</a></p>'


def _section(title: str, testid: str, body: str, *, wide: bool = False) -> str:
    """A card of the grid; `wide`: a table of many columns, given the grid's whole width (never a scrollbar
    of its own at 1280 px and wider)."""
    kind = "card wide" if wide else "card"
    return f'<section class="{kind}" id="{testid}" data-testid="{testid}"><h2>{esc(title)}</h2>{body}</section>'


def _capacity(rows: Sequence[CapacityRow]) -> str:
    body = table(["GPU class", "kind", "used", "free", "unusable", "reserved", "usage", "nodes"], [
        [esc(r.gpu_class), "MIG instance" if r.mig else "whole card", r.used, r.free, r.unusable, r.reserved,
         bar(r.used, r.used + r.free, label=f"{r.used} of {r.used + r.free} usable used"),
         r.nodes] for r in rows], testid="capacity-table", empty="no GPUs reported (CPU nodes only, or none)")
    return _section("Capacity per GPU class", "capacity", body, wide=True)


def _fabrics(rows: Sequence[Fabric]) -> str:
    body = table(["fabric", "nodes", "whole free nodes", "GPUs used", "GPUs free"], [
        [esc(r.fabric or "(none)"), r.nodes, r.whole_free_nodes, r.gpus_used, r.gpus_free]
        for r in rows], testid="fabrics-table", empty="no nodes connected")
    return _section("Free whole nodes per fabric", "fabrics", body)


def _models(s: Summary) -> str:
    totals = s.totals
    replicas = totals.replicas
    counts = table(["models", "satisfied", "short", "starting", "parked", "unplaceable", "stopped", "unknown"],
                   [[totals.models, totals.satisfied, totals.short, totals.starting, totals.parked,
                     totals.unplaceable, totals.stopped, totals.unknown]], sortable=False, testid="models-by-state")
    reps = (f'<p data-testid="replica-counts">replicas: {replicas.ready} ready of {replicas.desired} '
            f'desired, {replicas.starting} starting, {replicas.failed} failed</p>')
    stuck = [m for m in s.models if m.parked or m.state == "unplaceable"]
    rows = [[f'<a href="/models/{esc(quote(m.name, safe=""))}">{esc(m.name)}</a>',
             "parked" if m.parked else "unplaceable", esc(m.reason), error_once(m.reason, m.last_error)]
            for m in stuck[:SHOWN]]
    more = _more(len(stuck), SHOWN, "/models?state=unplaceable", "unplaceable models")
    if more:  # Models filters one state at a time: a link to each
        more = more.removesuffix("</p>") + ', <a href="/models?state=parked">all parked models</a></p>'
    stuck_html = ("<h3>Parked and unplaceable</h3>" + table(["model", "state", "why", "last error"], rows,
                                                            testid="stuck-models", empty="none") + more)
    return _section("Models by state", "models", counts + reps + stuck_html, wide=True)


def _idle(rows: Sequence[IdleRow]) -> str:
    def idle(r: IdleRow) -> str:
        return esc(_duration(r.idle_s)) if r.idle_known else UNKNOWN

    body = table(["model", "mode", "replicas", "GPUs", "idle for", "idle timeout"], [
        [esc(r.model), esc(r.mode), r.replicas, r.gpus, idle(r),
         esc(_duration(r.idle_timeout_s)) if r.idle_timeout_s is not None else "—"] for r in rows[:SHOWN]],
        testid="idle-table", empty="no model holds a replica")
    return _section("Idle models (longest first)", "idle", body + _more(len(rows), SHOWN, "/models", "models"))


def _members(cluster: ClusterPart) -> str:
    rows = cluster.members or ()
    leader = cluster.leader
    floating = cluster.floating_address
    standbys = [r.id for r in rows if r.id != leader]
    head = (f'<p>leader: <strong data-testid="leader">{cell(leader)}</strong>; standbys: '
            f'<span data-testid="standbys">{esc(", ".join(standbys)) or "none"}</span></p>')
    if floating is not None:
        words = esc(floating.state)
        if floating.reason:
            words += f": {esc(floating.reason)}"
        head += (f'<p data-testid="floating-address">floating address: {cell(floating.address)} — '
                 f'{words}</p>')
    else:
        head += '<p data-testid="floating-address">floating address: not configured</p>'
    body = table(["member", "role", "state", "why", "admin URL", "version", "lag"], [
        [esc(r.id), cell(r.role), esc(r.state), esc(r.reason), cell(r.admin_url), cell(r.version), cell(r.lag)]
        for r in rows], testid="members-table", empty="unknown: no member answered")
    return _section("Control planes", "members", head + body + _gateways(cluster), wide=True)


def _gateways(cluster: ClusterPart) -> str:
    """The gateways that follow the leader, `llmgw up`'s own (in process) among them; unknown is unknown."""
    if cluster.gateways is None:
        return f'<p data-testid="gateways">gateways: {UNKNOWN} (the leader did not list them)</p>'
    return "<h3>Gateways</h3>" + table(["gateway", "address", "connected", "runs"], [
        [esc(str(g.get("name", ""))), cell(g.get("address")), "yes" if g.get("connected") else "no",
         "in the control plane's process" if g.get("in_process") else "on its own"]
        for g in cluster.gateways], testid="gateways-table", empty="no gateway follows the leader")


def _guard(guard: Guard) -> str:
    state = "on" if guard.enabled else "off (guard.enabled is false: every policy checks nothing)"
    head = (f'<p>guards: <strong data-testid="guards-state">{esc(state)}</strong>; '
            f'{guard.policies} policies</p>')
    body = table(["judge", "status", "what is wrong"], [
        [esc(j.model), esc(j.status), esc(j.problem)] for j in guard.judges],
        testid="judges-table", empty="no policy names a judge")
    return _section("Judges and guards", "guard", head + body)


def _warnings(s: Summary) -> str:
    out = ""
    if not s.notify.webhooks:
        out += ('<div class="banner warn" id="no-webhook" data-testid="no-webhook">No webhook set '
                '(notify.webhooks): lost nodes, parked models and judges down reach nobody. Set one on '
                '<a href="/settings">Settings</a> or with <code>llmgw ctl settings notify.webhooks '
                '\'["https://..."]\'</code>.</div>')
    warnings = [w for w in s.warnings if not w.startswith("no notify.webhooks set")]
    if warnings:
        below = _rows_below(s)
        items = "".join(f"<li>{esc(_said_below(w, below))}</li>" for w in warnings[:SHOWN])
        out += (f'<section class="card" data-testid="warnings"><h2>Warnings ({len(warnings)})</h2><ul>{items}'
                f'</ul>{_more(len(warnings), SHOWN, "/models", "models")}</section>')
    return out


def _rows_below(s: Summary) -> list[tuple[str, str, str]]:
    """(how a warning on it starts, its reason, the card whose row says it): the models of the Parked and
    unplaceable table and the judges of the Judges table."""
    rows = [(f"model {m.name} ", m.reason, "Models by state") for m in
            [m for m in s.models if m.parked or m.state == "unplaceable"][:SHOWN]]
    return rows + [(f"judge {j.model} ", j.problem, "Judges and guards") for j in s.guard.judges]


def _said_below(warning: str, below: Sequence[tuple[str, str, str]]) -> str:
    """A warning on a row of a card below, its reason left to that row: each reason once on the page."""
    for start, words, card in below:
        if words and warning.startswith(start) and words in warning:
            return warning.replace(words, f"why in {card}, below")
    return warning


def _usage(ctx: Context) -> str:
    now = ctx.clock()
    rows = usage.query(ctx.state(), since=now - CHART_HOURS * 3600, until=now + 3600, by="hour")
    requests = chart.hourly(rows, now, CHART_HOURS, "requests")
    tokens = chart.hourly(rows, now, CHART_HOURS, ("tokens_in", "tokens_out"))
    body = (chart.bars("requests per hour", requests, testid="chart-requests") +
            chart.bars("tokens per hour (prompt + completion)", tokens, testid="chart-tokens") +
            f'<p data-testid="usage-totals">last {CHART_HOURS} h: {int(sum(v or 0 for _, v in requests))} requests, '
            f'{int(sum(v or 0 for _, v in tokens))} tokens (the gateways\' usage rollups, as '
            f'<code>GET /api/v1/usage</code> gives them)</p>')
    return _section("Requests and tokens per hour (UTC)", "usage", body)


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    if seconds < 172800:
        return f"{seconds // 3600} h {seconds % 3600 // 60} min"
    return f"{seconds // 86400} d {seconds % 86400 // 3600} h"


def render(s: Summary, ctx: Context) -> str:
    """The Overview's body from the summary (the context's `look`)."""
    nodes = s.node_counts
    head = (f'<p data-testid="node-counts">{nodes.connected} nodes connected, {nodes.not_connected} not '
            f'connected; state revision {esc(s.cluster.revision)}</p>')
    grid = "".join([_capacity(s.capacity), _fabrics(s.fabrics), _models(s), _idle(s.idle),
                    _members(s.cluster), _guard(s.guard), _usage(ctx)])
    return head + _warnings(s) + f'<div class="grid">{grid}</div>'


def register(app: QuartTrio) -> None:
    @auth.console_route(app, "/")
    async def overview(session: sessions.Session, ctx: Context) -> str:
        look = await ctx.look_beside(await ctx.cluster(auth.authorization(session)))
        return page("Overview", "Overview", render(look.summary, ctx), session=session)
