"""The console's Guardrails page (`/guardrails`): guards on or off, the policies, each judge and what is wrong
with it (`ctl guard list`, `ctl guard judge status`), and recent refusals by hazard from the request log.

Refusals are read from the gateways' logs through the same function as `GET /api/v1/requests` (with the
signed-in key): the newest guard refusals of the chosen window, counted by the hazard in `guard_rule`.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from quart import request

from llmgw.console import auth, sessions
from llmgw.console.layout import UNKNOWN, cell, esc, page, table
from llmgw.control.ops.requests import list_page
from llmgw.domain.guard import CATEGORIES, enabled
from llmgw.domain.judges import GUARDS_OFF, guard_files, judge_status
from llmgw.errors import AdminError
from llmgw.wire.logquery import MAX_LIMIT

if TYPE_CHECKING:
    from quart_trio import QuartTrio

    from llmgw.control.context import Context

HOURS = (1, 24, 168)  # the refusal windows offered (the last hour, day, week)
DEFAULT_HOURS = 24
RECENT_SHOWN = 20
JUDGE_ERROR = "judge error"  # a refusal because the judge could not answer (on_error closed)
_HAZARD = re.compile(r"\b(S\d{1,2}),")


@dataclass
class Refusals:
    """Guard refusals counted by hazard: code -> how many requests, which models, the newest time."""

    read: int = 0  # refusal records read
    by_hazard: Counter[str] = field(default_factory=Counter)
    models: dict[str, Counter[str]] = field(default_factory=dict)
    last: dict[str, float] = field(default_factory=dict)
    recent: list[Mapping[str, Any]] = field(default_factory=list)


def hazards(rule: str) -> list[str]:
    """The hazard codes a request log `guard_rule` names (`judge: S6,Specialized Advice | judge: S1,...`),
    each once; `judge error` when a judge could not answer; [] for `judge: safe` or no policy."""
    codes = list(dict.fromkeys(_HAZARD.findall(rule)))
    if not codes and "judge: error" in rule:
        return [JUDGE_ERROR]
    return codes


def count(records: Iterable[Mapping[str, Any]]) -> Refusals:
    out = Refusals()
    for r in records:
        codes = hazards(str(r.get("guard_rule") or ""))
        if not codes:
            continue
        out.read += 1
        if len(out.recent) < RECENT_SHOWN:
            out.recent.append(r)
        for code in codes:
            out.by_hazard[code] += 1
            out.models.setdefault(code, Counter())[str(r.get("model") or "-")] += 1
            t = r.get("time")
            if isinstance(t, (int, float)):
                out.last[code] = max(out.last.get(code, t), t)
    return out


def register(app: QuartTrio) -> None:
    @auth.console_route(app, "/guardrails")
    async def guardrails_page(session: sessions.Session, ctx: Context) -> str:
        state, now = ctx.state(), ctx.clock()
        views = ctx.views()
        judges = judge_status(state, ctx.observed(), views, now)
        try:
            hours = int(request.args.get("hours", DEFAULT_HOURS))
        except ValueError:
            hours = DEFAULT_HOURS
        hours = hours if hours in HOURS else DEFAULT_HOURS
        args = {"status": "400", "since": str(now - hours * 3600), "limit": str(MAX_LIMIT)}
        try:
            doc: dict[str, Any] | str = await list_page(ctx, args, auth.authorization(session))
        except AdminError as e:
            doc = e.message
        body = (switch_html(enabled(state)) + policies_html(state.guard_policies.values()) + judges_html(judges) +
                files_html(guard_files(ctx.observed())) + refusals_html(doc, hours, now))
        return page("Guardrails", "Guardrails", body, session=session)


def switch_html(on: bool) -> str:
    if on:
        return '<p data-testid="guards-state" data-enabled="true">Guards are on: every policy checks.</p>'
    return (f'<div class="banner warn" data-testid="guards-state" data-enabled="false">{esc(GUARDS_OFF)} '
            '(or <a href="/do#do-guards">Do → Guards on</a>)</div>')


def policies_html(policies: Iterable[Any]) -> str:
    rows = [[p.name, p.judge, p.check, ", ".join(p.models),
             ", ".join(f"{c} {CATEGORIES.get(c, '')}" for c in p.categories) or "all 14", p.on_error,
             f"{p.budget_s:g} s"] for p in sorted(policies, key=lambda p: p.name)]
    return ("<h2>Policies</h2>" + table(["Policy", "Judge", "Checks", "Models", "Refuses", "Judge down", "Budget"],
                                        rows, testid="guard-policies",
                                        empty="no guard policy: nothing is checked (llmgw ctl guard set NAME "
                                              "--judge MODEL)"))


def judges_html(judges: list[dict[str, Any]]) -> str:
    rows = []
    for j in judges:
        ready = UNKNOWN if j["ready"] is None else esc(f"{j['ready']} / {j['desired']}")
        age = j.get("last_failure_age_s")
        failure = (f"{esc(j['last_failure'])} ({age:.0f} s ago)" if isinstance(age, (int, float)) else
                   esc(j["last_failure"] or "none"))
        rows.append([esc(j["model"]), esc(", ".join(j["policies"])),
                     f'<span class="status {esc(j["status"])}" data-status="{esc(j["status"])}">{esc(j["status"])}'
                     f"</span>", esc(j["problem"] or "nothing"), ready, failure])
    fix = ('<p>A missing judge is served from <a href="/do#do-judge">Do → Enable the judge</a> '
           '(<code>llmgw ctl guard judge enable</code>).</p>'
           if any(j["status"] in ("missing", "not_a_judge") for j in judges) else "")
    return ("<h2>Judges</h2>" + table(["Judge", "Policies", "Status", "What is wrong", "Ready / desired",
                                       "Last failure to answer"], rows, testid="judges-table",
                                      empty="no policy names a judge") + fix)


def files_html(files: list[dict[str, Any]]) -> str:
    if not files:
        return ""
    rows = [[f["node"], f["path"], f["fabric"] or "-", "shared" if f["shared"] else "local"] for f in files]
    return "<h2>Llama Guard files on the nodes</h2>" + table(["Node", "Path", "Fabric", "Storage"], rows,
                                                             testid="guard-files")


def refusals_html(doc: dict[str, Any] | str, hours: int, now: float) -> str:
    links = " ".join(f'<a href="/guardrails?hours={h}"{" aria-current=page" if h == hours else ""}>'
                     f'{"last hour" if h == 1 else "last day" if h == 24 else "last week"}</a>' for h in HOURS)
    head = f"<h2>Recent refusals by hazard</h2><p>Window: {links}.</p>"
    if isinstance(doc, str):
        return head + f'<div class="banner warn" data-testid="refusals-error">The request log could not be read: ' \
                      f"{esc(doc)}</div>"
    gateways = doc.get("gateways") or {}
    out = head
    unavailable = gateways.get("unavailable") or []
    if unavailable:
        out += ('<div class="banner warn" data-testid="refusals-gateways-unavailable">Not counted: the refusals of '
                + esc("; ".join(f"{u['gateway']} ({u['reason']})" for u in unavailable)) + "</div>")
    if not gateways.get("asked"):
        return out + ('<p data-testid="refusals-none">No gateway has sent usage or follows this leader yet, so no '
                      'request log can be read.</p>')
    found = count(doc.get("requests") or [])
    more = (f" More refusals than these {MAX_LIMIT} requests answered 400 in the window: the counts are of the newest."
            if doc.get("next_cursor") else "")
    out += (f'<p data-testid="refusals-read">{found.read} guard refusal(s) in the last {hours} h, from '
            f'{len(gateways.get("answered") or [])} gateway log(s).{esc(more)}</p>')
    rows = [[code, CATEGORIES.get(code, "the judge could not answer" if code == JUDGE_ERROR else "unknown"), n,
             ", ".join(f"{m} ({k})" for m, k in found.models[code].most_common(3)),
             f"{now - found.last[code]:.0f} s ago" if code in found.last else None]
            for code, n in found.by_hazard.most_common()]
    out += table(["Hazard", "Category", "Refusals", "Models (most)", "Last"], rows, testid="refusals-table",
                 empty="no guard refusal in this window")
    if found.recent:
        recent = [[f'<code>{esc(r.get("id"))}</code>', _when(r.get("time")), esc(r.get("model") or "-"),
                   esc(r.get("key") or "-"), esc(r.get("guard_rule"))] for r in found.recent]
        out += "<h3>The newest</h3>" + table(["Request", "Time", "Model", "Key", "guard_rule"], recent,
                                             testid="refusals-recent")
    return out


def _when(t: Any) -> str:
    if not isinstance(t, (int, float)):
        return cell(None)
    return esc(time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) + " UTC")
