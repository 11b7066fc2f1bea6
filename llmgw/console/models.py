"""The console's Models page (`/models`, `/models/NAME`): every definition with its state, replicas and where
they run, last error and memory estimate, as `ctl models` shows them; the activation of a model loading.

The rows come from the same state, agents' reports and reconciler views as `GET /api/v1/models`;
the list is sorted, filtered and paged on the server, so 2,000 models are a page at a time.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence
from urllib.parse import quote

from quart import request

from llmgw.console import listing
from llmgw.console.do_serve import labels
from llmgw.console.auth import console_route
from llmgw.console.sessions import Session, csrf_field
from llmgw.console.layout import UNKNOWN, bar, cell, esc, page, table
from llmgw.domain import summary
from llmgw.domain.memory import MemoryEstimate, WeightsIndex, estimate_for
from llmgw.domain.model import ENGINES, ROLES, ModelDef
from llmgw.domain.observed import ROUTE_STATES, BreakerSeen, Observed
from llmgw.domain.state import ClusterState, Placement

if TYPE_CHECKING:
    from quart_trio import QuartTrio

    from llmgw.control.context import Context

STATES = (*ROUTE_STATES, "unknown")
SORTS = {"name": "name", "state": "state", "engine": "engine", "ready": "ready replicas", "placed": "placed",
         "failures": "failed starts in a row", "memory": "memory estimate"}
WHERE_SHOWN = 4  # nodes named in a row; the rest counted
GIB = 1 << 30


@dataclass(frozen=True)
class Row:
    """One model as the list shows it; None is unknown (the reconciler has not counted it yet)."""

    model: ModelDef
    state: str
    reason: str
    desired: int | None
    ready: int | None
    starting: int | None
    placements: tuple[Placement, ...]
    parked: bool
    failures: int
    last_error: str


def register(app: QuartTrio) -> None:
    @console_route(app, "/models")
    def models_page(session: Session, ctx: Context) -> str:
        state, observed = ctx.state(), ctx.observed()
        query = listing.Query.read("/models", request.args, list(SORTS), ("state", "engine", "role"))
        return page("Models", "Models", render_list(state, observed, ctx.views(), query, ctx.clock()),
                    session=session)

    @console_route(app, "/models/<path:name>")
    def model_page(session: Session, ctx: Context, name: str) -> str:
        body = render_model(ctx.state(), ctx.observed(), ctx.views(), name, ctx.clock(),
                            session=session, breakers=ctx.breakers())
        return page(f"Model {name}", "Models", body, session=session)


def rows(state: ClusterState, views: Mapping[str, Any] | None, only: str | None = None) -> list[Row]:
    """Every model's row (or the one named `only`); placements grouped once, not once per model."""
    placed: dict[str, list[Placement]] = defaultdict(list)
    for p in state.placements.values():
        placed[p.model].append(p)
    out = []
    for name, m in state.models.items():
        if only is not None and name != only:
            continue
        view = views.get(name) if views is not None else None
        health = state.model_health(name)
        out.append(Row(
            model=m, state=view.state if view else "unknown",
            reason=view.reason if view else "the reconciler has not run yet",
            desired=view.desired if view else None, ready=view.ready if view else None,
            starting=view.starting if view else None,
            placements=tuple(sorted(placed.get(name, ()), key=lambda p: (p.placed_at, p.replica_id))),
            parked=health.parked, failures=health.failures_in_row,
            last_error=health.last_error or (view.last_error if view else "")))
    return out


def render_list(state: ClusterState, observed: Observed, views: Mapping[str, Any] | None, query: listing.Query,
                now: float) -> str:
    every = rows(state, views)
    shown = [r for r in every if _wanted(r, query)]
    index = WeightsIndex.of(observed.nodes)
    estimates: dict[str, MemoryEstimate] = {}

    def estimate(r: Row) -> MemoryEstimate:
        if r.model.name not in estimates:
            estimates[r.model.name] = estimate_for(r.model, observed.nodes, index, observed.sources)
        return estimates[r.model.name]

    keys = {"name": lambda r: r.model.name, "state": lambda r: STATES.index(r.state) if r.state in STATES else 99,
            "engine": lambda r: r.model.engine, "ready": lambda r: r.ready, "placed": lambda r: len(r.placements),
            "failures": lambda r: r.failures, "memory": lambda r: estimate(r).total_bytes}
    # LoRA adapters go under their base (sorted among themselves by name), not in the sort and pages.
    bases = {r.model.name for r in shown if not r.model.base}
    adapters: dict[str, list[Row]] = defaultdict(list)
    for r in shown:
        if r.model.base in bases:
            adapters[r.model.base].append(r)
    shown = [r for r in shown if r.model.base not in bases]
    part = listing.page_of(listing.sort_rows(shown, keys[query.sort], query.descending), query)
    by_state: dict[str, int] = defaultdict(int)
    for r in every:
        by_state[r.state] += 1
    said = ", ".join(f"{n} {s}" for s, n in sorted(by_state.items()))
    head = (f'<p data-testid="models-counts">{len(every)} model(s){": " + esc(said) if said else ""}; '
            f'{len(shown)} match.</p>')
    if not every:
        head = ('<p data-testid="models-counts">No model is defined: serve one from <a href="/do">Do</a> or with '
                '<code>llmgw ctl model serve</code>.</p>')
    controls = listing.controls(query, sorts=SORTS, testid="models", selects={
        "state": ("State", STATES), "engine": ("Engine", ENGINES), "role": ("Role", ROLES)})
    body = []
    for r in part.rows:
        body.append([f'<a href="/models/{esc(quote(r.model.name, safe=""))}" data-testid="model-link">'
                     f'{esc(r.model.name)}</a>', r.model.engine, r.model.role, r.model.mode, state_html(r, now),
                     counts(r), where(r.placements), r.last_error or "", estimate_html(estimate(r))])
        body.extend(_adapter_row(a, observed, now) for a in adapters.get(r.model.name, ()))
    return (head + controls + listing.pages(part, query) +
            table(["Model", "Engine", "Role", "Mode", "State", "Ready / desired", "Runs on", "Last error",
                   "Memory (one replica)"], body, testid="models-table", empty="no model matches") +
            listing.pages(part, query))


def _adapter_row(r: Row, observed: Observed, now: float) -> list[str]:
    """A LoRA adapter's row, under its base's: where it is loaded (the replicas of its base that list it)."""
    states = dict(on_replicas(r.model.name, observed))
    loaded = [rid for rid, state in states.items() if state == "loaded"]
    runs = ("loaded on " + ", ".join(loaded[:WHERE_SHOWN])) if loaded else "loaded nowhere"
    failed = [f"{rid}: {state}" for rid, state in states.items() if state.startswith("failed")]
    return [f'<span class="adapter">↳ <a href="/models/{esc(quote(r.model.name, safe=""))}" '
            f'data-testid="adapter-link">{esc(r.model.name)}</a></span>', r.model.engine, r.model.role,
            f"adapter of {esc(r.model.base)}", state_html(r, now), esc(f"{len(loaded)} / {len(states)} loaded"),
            esc(runs), esc(failed[0]) if failed else "", ""]


def on_replicas(name: str, observed: Observed) -> list[tuple[str, str]]:
    """(replica id, the adapter's state there) for each replica asked to load adapter `name`."""
    return sorted((rid, obs.adapter(name)) for rid, obs in observed.replicas.items() if obs.adapter(name))


def _wanted(r: Row, query: listing.Query) -> bool:
    f = query.filters
    if f.get("state") and r.state != f["state"]:
        return False
    if f.get("engine") and r.model.engine != f["engine"]:
        return False
    if f.get("role") and r.model.role != f["role"]:
        return False
    return listing.matches(query.q, r.model.name, r.model.source, r.model.engine, r.last_error,
                           *(p.node for p in r.placements))


def state_html(r: Row, now: float) -> str:
    text = f'<span class="state {esc(r.state)}" data-state="{esc(r.state)}" title="{esc(r.reason)}">' \
           f'{esc(r.state)}</span>'
    if r.parked and r.state != "parked":
        text += " (parked)"
    progress = activation(r, now)
    if progress is not None:
        text += "<br>" + progress_html(progress)
    return text


def counts(r: Row) -> str:
    if r.ready is None or r.desired is None:
        return UNKNOWN
    starting = f", {r.starting} starting" if r.starting else ""
    return esc(f"{r.ready} / {r.desired}{starting}")


def where(placements: Sequence[Placement]) -> str:
    nodes = list(dict.fromkeys(p.node for p in placements))
    if not nodes:
        return "nowhere"
    more = f" +{len(nodes) - WHERE_SHOWN}" if len(nodes) > WHERE_SHOWN else ""
    return esc(", ".join(nodes[:WHERE_SHOWN]) + more)


def estimate_html(e: MemoryEstimate) -> str:
    if e.total_bytes is None:
        return f'{UNKNOWN} <small>{esc(e.detail)}</small>' if e.detail else UNKNOWN
    at_least = "" if e.complete else "≥ "
    per = f" ({e.devices} devices)" if e.devices > 1 else ""
    return f'<span title="{esc(e.detail)}">{at_least}{e.total_bytes / GIB:.1f} GiB{esc(per)}</span>'


# --- activation: a model that is loading -------------------------------------------------------------


@dataclass(frozen=True)
class Activation:
    starting: int
    since: float | None  # when the oldest replica still starting was placed (None: not placed yet)
    elapsed_s: float | None
    window_s: float


def activation(r: Row, now: float) -> Activation | None:
    """The progress of a model with replicas starting, against its activation window; None when none is."""
    if not r.starting:
        return None
    since = min((p.placed_at for p in r.placements), default=None)
    elapsed = None if since is None else max(now - since, 0.0)
    return Activation(r.starting, since, elapsed, r.model.activation_window_s)


def progress_html(a: Activation) -> str:
    if a.elapsed_s is None:
        words = f"{a.starting} replica(s) waiting for a place (activation window {a.window_s:g} s)"
        return f'<span class="activation" data-testid="activation">{esc(words)}</span>'
    if a.elapsed_s <= a.window_s:
        words = f"{a.starting} starting for {a.elapsed_s:.0f} s of its {a.window_s:g} s activation window"
    else:
        words = (f"{a.starting} starting for {a.elapsed_s:.0f} s: past its {a.window_s:g} s activation window "
                 f"by {a.elapsed_s - a.window_s:.0f} s")
    return (f'<span class="activation" data-testid="activation" data-elapsed-s="{a.elapsed_s:.0f}" '
            f'data-window-s="{a.window_s:g}">{bar(min(a.elapsed_s, a.window_s), a.window_s, label=words)}</span>')


def phase_html(status: Mapping[str, Any]) -> str:
    """The activation's phase and estimate (`model_status`'s `activation`), with its window in force."""
    doc = status.get("activation")
    window = status.get("window_s")
    window_words = f" (activation window {window:.0f} s)" if isinstance(window, (int, float)) else ""
    if not isinstance(doc, Mapping):
        return f'<span data-testid="activation-phase">not activating{esc(window_words)}</span>'
    attrs = "".join(f' data-{k.replace("_", "-")}="{esc(str(doc[k]))}"'
                    for k in ("phase", "bytes_done", "bytes_total", "eta_s") if doc.get(k) is not None)
    return (f'<span data-testid="activation-phase"{attrs}>{esc(str(doc.get("words", doc.get("phase", ""))))}'
            f'{esc(window_words)}</span>')


# --- one model --------------------------------------------------------------------------------------


def render_model(state: ClusterState, observed: Observed, views: Mapping[str, Any] | None, name: str, now: float,
                 *, session: Session, breakers: Sequence[BreakerSeen] = ()) -> str:
    m = state.models.get(name)
    if m is None:
        return (f'<p class="refusal" data-testid="model-missing">No model named {esc(name)} is defined. '
                f'<a href="/models">All models</a></p>')
    r = rows(state, views, only=name)[0]
    status = summary.model_status(state, observed, name, views.get(name) if views is not None else None, now)
    estimate = estimate_for(m, observed.nodes, sources=observed.sources)
    facts = [("State", state_html(r, now)), ("Why", esc(r.reason) if r.reason else ""),
             ("Ready / desired", counts(r)), ("Activation", phase_html(status)),
             ("Parked", "yes" if r.parked else "no"),
             ("Failed starts in a row", cell(r.failures)),
             ("Last error", esc(r.last_error) if r.last_error else "none"),
             ("Memory (one replica)", f'{estimate_html(estimate)} <small>{esc(estimate.detail)}</small>')]
    if "schedule" in status:  # a model with schedule rules: which rules now and the next change
        facts.append(("Schedule", f'<span data-testid="model-schedule">{esc(status["schedule"]["words"])}</span>'))
    out = [table(["Fact", "Value"], [[k, v] for k, v in facts], sortable=False, testid="model-status")]
    if r.parked:
        hint = ('<form method="post" action="/do/retry" data-testid="retry-form">'
                f'<input type="hidden" name="name" value="{esc(name)}">'
                f'{csrf_field(session)}<button type="submit">Retry…</button></form>' if session.role == "admin" else
                "an admin can retry it from Do")
        out.append(f'<p class="banner warn" data-testid="parked-notice">Parked after {r.failures} failed start(s): '
                   f'not placed again until its definition changes or it is retried. {hint}</p>')
    if m.base:  # a LoRA adapter: no replicas of its own; its state on each replica of its base
        base = f'<a href="/models/{esc(quote(m.base, safe=""))}">{esc(m.base)}</a>'
        out.append(f'<h2>On the replicas of {base}</h2><p>A LoRA adapter of {base}: served by its replicas whose '
                   f'engine lists it loaded.</p>')
        out.append(table(["Replica", "Adapter"], [[esc(rid), esc(state)] for rid, state in on_replicas(name, observed)],
                         testid="adapter-replicas", empty="no replica asked to load it yet"))
    elif adapters := sorted(n for n, a in state.models.items() if a.base == name):
        out.append("<h2>LoRA adapters</h2><p>" + ", ".join(
            f'<a href="/models/{esc(quote(n, safe=""))}" data-testid="adapter-link">{esc(n)}</a>' for n in adapters)
                   + "</p>")
    out.append("<h2>Replicas</h2>")
    out.append(table(["Replica", "Node", "Devices", "State", "URL", "Error"],
                     [[x["replica_id"], x["node"], labels(list(x["gpus"])) or "CPU", x["state"], x["url"] or "",
                       x["error"] or ""] for x in status["replicas"]],
                     testid="model-replicas", empty="no replica placed"))
    if mine := [b for b in breakers if b.model == name]:
        out.append("<h2>Out of rotation</h2><p>A gateway's circuit breaker keeps these replicas out of its rotation "
                   "after failed requests; one request probes each again after breaker_open_s.</p>")
        out.append(table(["Replica", "Gateway", "Open for", "Why"],
                         [[esc(b.replica_id), esc(b.gateway), f"{max(0.0, now - b.since):.0f} s"
                           + (" (probing)" if b.half_open else ""), esc(b.reason)] for b in mine],
                         testid="model-breakers"))
    out.append("<h2>Definition</h2>")
    out.append(table(["Field", "Value"], [[k, _plain(v)] for k, v in m.to_doc().items()], sortable=False,
                     testid="model-definition"))
    return "".join(out)


def _plain(value: Any) -> str:
    if isinstance(value, Mapping):
        return esc(", ".join(f"{k}={_plain_text(v)}" for k, v in value.items()))
    return esc(_plain_text(value))


def _plain_text(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return "unset" if value is None else str(value)
