"""The console's Nodes page (`/nodes`, `/nodes/NAME`): every node the leader knows, as `ctl nodes` lists it
(the admin API's `node_docs`), sorted, filtered and paged on the server; one node's GPUs and storage.

Unknown stays unknown: a node that is gone has no GPUs, engines or storage to show, not none.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any, Mapping, Sequence
from urllib.parse import quote

from quart import request

from llmgw.console import listing
from llmgw.console.auth import console_route
from llmgw.console.sessions import Session
from llmgw.console.layout import UNKNOWN, cell, esc, page, table
from llmgw.control.ops.nodes import node_docs

if TYPE_CHECKING:
    from quart_trio import QuartTrio

    from llmgw.control.context import Context

STATES = ("connected", "disconnected", "lost", "unknown")
SORTS = {"node": "name", "state": "state", "fabric": "fabric", "gpus": "usable GPUs", "free": "free GPUs",
         "health": "problems", "contact": "last contact", "version": "version"}
GIB = 1 << 30


def register(app: QuartTrio) -> None:
    @console_route(app, "/nodes")
    def nodes_page(session: Session, ctx: Context) -> str:
        docs = node_docs(ctx)
        query = listing.Query.read("/nodes", request.args, list(SORTS), ("state", "class"))
        return page("Nodes", "Nodes", render_list(docs, query), session=session)

    @console_route(app, "/nodes/<path:name>")
    def node_page(session: Session, ctx: Context, name: str) -> str:
        doc = next((d for d in node_docs(ctx) if d.get("node") == name), None)
        return page(f"Node {name}", "Nodes", render_node(doc, name), session=session)


# --- the list ---------------------------------------------------------------------------------------


def render_list(docs: Sequence[Mapping[str, Any]], query: listing.Query) -> str:
    classes = sorted({c for d in docs for c in gpu_classes(d)})
    shown = filtered(docs, query)
    part = listing.page_of(listing.sort_rows(shown, lambda d: sort_key(d, query.sort), query.descending), query)
    counts = {s: sum(1 for d in docs if d.get("state") == s) for s in STATES}
    said = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    head = (f'<p data-testid="nodes-counts">{len(docs)} node(s) known{": " + esc(said) if said else ""}; '
            f'{len(shown)} match.</p>')
    if not docs:
        head = ('<p data-testid="nodes-counts">No nodes known: start an agent '
                '(<code>llmgw agent --control URL ...</code>).</p>')
    controls = listing.controls(query, sorts=SORTS, testid="nodes",
                                selects={"state": ("State", STATES), "class": ("GPU class", classes)})
    rows = [row(d) for d in part.rows]
    lost = counts["lost"]
    foot = ('<p>Lost nodes stay listed until forgotten: <code>llmgw ctl nodes forget NAME</code>.</p>'
            if lost else "")
    return (head + controls + listing.pages(part, query) +
            table(["Node", "State", "Fabric", "GPUs by class", "Health", "Engines", "Storage per fabric",
                   "Last contact", "Version"], rows, testid="nodes-table", empty="no node matches") +
            listing.pages(part, query) + foot)


def filtered(docs: Sequence[Mapping[str, Any]], query: listing.Query) -> list[Mapping[str, Any]]:
    state, gpu_class = query.filters.get("state", ""), query.filters.get("class", "")
    out = []
    for d in docs:
        if state and d.get("state") != state:
            continue
        if gpu_class and gpu_class not in gpu_classes(d):
            continue
        if not listing.matches(query.q, d.get("node"), d.get("hostname"), d.get("address"), d.get("fabric"),
                               d.get("version"), *gpu_classes(d), *(engines(d) or ())):
            continue
        out.append(d)
    return out


def sort_key(d: Mapping[str, Any], sort: str) -> Any:
    counts = d.get("gpu_counts")
    if sort == "state":
        return STATES.index(str(d.get("state"))) if d.get("state") in STATES else len(STATES)
    if sort == "fabric":
        return d.get("fabric")
    if sort in ("gpus", "free"):
        if not isinstance(counts, Mapping):
            return None
        return counts.get("free", 0) + (counts.get("used", 0) if sort == "gpus" else 0)
    if sort == "health":
        problems = health(d)
        return None if problems is None else len(problems)
    if sort == "contact":
        return d.get("last_contact_age_s")
    if sort == "version":
        return d.get("version")
    return str(d.get("node"))


def row(d: Mapping[str, Any]) -> list[Any]:
    name = str(d.get("node"))
    link = f'<a href="/nodes/{esc(quote(name, safe=""))}" data-testid="node-link">{esc(name)}</a>'
    problems = health(d)
    if problems is None:
        health_html = UNKNOWN
    elif not problems:
        health_html = '<span class="ok">healthy</span>'
    else:
        health_html = '<ul class="problems">' + "".join(f"<li>{esc(p)}</li>" for p in problems) + "</ul>"
    fabric = d.get("fabric")
    return [link, state_html(d), None if fabric is None else (fabric or "-"), gpus_html(d),
            health_html, engines_html(d), storage_html(d.get("storage")), contact_html(d), d.get("version")]


def state_html(d: Mapping[str, Any]) -> str:
    state = str(d.get("state"))
    text = f'<span class="state {esc(state)}" data-state="{esc(state)}">{esc(state)}</span>'
    gone, grace = d.get("gone_for_s"), d.get("grace_s")
    if state != "connected" and isinstance(gone, (int, float)):
        text += f" for {gone:.0f} s"
        if isinstance(grace, (int, float)) and state == "disconnected":
            text += f" (lost in {max(grace - gone, 0):.0f} s)"
    if d.get("approval") == "pending":  # nodes.require_approval: nothing is placed on it until approved
        text += (' <span class="state pending" data-testid="node-pending">pending approval</span> '
                 f'(<code>llmgw ctl nodes approve {esc(str(d.get("node")))}</code>)')
    drain = d.get("drain")
    if d.get("cordon") == "drain" and isinstance(drain, Mapping):  # `ctl nodes drain`: its progress, what blocks it
        text += f' <span class="state draining" data-testid="node-draining">{esc(str(drain.get("words")))}</span>'
    elif d.get("cordon") == "cordon":
        text += ' <span class="state cordoned" data-testid="node-cordoned">cordoned: nothing new is placed</span>'
    return text


def gpu_classes(d: Mapping[str, Any]) -> list[str]:
    gpus = d.get("gpus")
    if not isinstance(gpus, list):
        return []
    return sorted({str(g.get("gpu_class")) for g in gpus if isinstance(g, Mapping) and g.get("gpu_class")})


def gpus_html(d: Mapping[str, Any]) -> str:
    """Usable devices by class (free of total), a MIG class's instances by label (`card/migN`);
    None (a node that is gone) is unknown, no GPU is CPU only."""
    gpus, counts = d.get("gpus"), d.get("gpu_counts")
    if not isinstance(gpus, list):
        return UNKNOWN
    if not gpus:
        return "none (CPU only)"
    by_class = counts.get("by_class", {}) if isinstance(counts, Mapping) else {}
    labels: dict[str, list[str]] = defaultdict(list)
    for g in gpus:
        if isinstance(g, Mapping) and g.get("mig_profile"):
            labels[str(g.get("gpu_class"))].append(str(g.get("label")))
    lines = []
    for cls, c in sorted(by_class.items()):
        free, used = int(c.get("free", 0)), int(c.get("used", 0))
        mig = f" ({', '.join(labels[cls])})" if labels.get(cls) else ""
        lines.append(f'<li data-class="{esc(cls)}">{esc(cls)}: {free} free of {free + used}{esc(mig)}</li>')
    kept = counts.get("reserved") if isinstance(counts, Mapping) else None
    if kept:
        lines.append(f'<li data-reserved="{len(kept)}">reserved for other work: {esc(", ".join(map(str, kept)))}</li>')
    if not lines:
        lines.append("<li>no usable device</li>")
    return '<ul class="gpus">' + "".join(lines) + "</ul>"


def health(d: Mapping[str, Any]) -> list[str] | None:
    """What is wrong with the node's devices and probe, in words, each fact once; None when it is unknown
    (gone)."""
    devices = device_problems(d)
    if devices is None:
        return None
    return [line for line, _ in devices] + probe_warnings(d, [reason for _, reason in devices])


def device_problems(d: Mapping[str, Any]) -> list[tuple[str, str]] | None:
    """(line, reason): one line per reason, naming every device it keeps out (a MIG card and its instances,
    or eight cards in MIG mode, share theirs); None when unknown."""
    counts = d.get("gpu_counts")
    if d.get("gpus") is None or not isinstance(counts, Mapping):
        return None
    said: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for u in counts.get("unusable", ()):
        what = "unhealthy" if u.get("healthy") is False else "not placeable"
        said.setdefault((what, str(u.get("reason") or "no reason given")), []).append(u)
    out = []
    for (what, reason), devices in said.items():
        labels = ", ".join(str(u.get("label")) for u in devices)
        classes = ", ".join(dict.fromkeys(str(u.get("class")) for u in devices))
        out.append((f"{'GPUs' if len(devices) > 1 else 'GPU'} {labels} ({classes}) {what}: {reason}", reason))
    return out


def probe_warnings(d: Mapping[str, Any], reasons: Sequence[str]) -> list[str]:
    """The probe's warnings that say something the devices' reasons do not: "GPU 0: <a reason>" is said."""
    out: list[str] = []
    for w in d.get("warnings") or ():
        words = str(w).partition(": ")[2] or str(w)
        if not (len(words) >= 16 and any(words in r for r in reasons)) and str(w) not in out:
            out.append(str(w))
    return out


def engines(d: Mapping[str, Any]) -> list[str] | None:
    versions = d.get("engine_versions")
    if isinstance(versions, Mapping) and versions:
        return [f"{n} {v}" if v else str(n) for n, v in sorted(versions.items())]
    names = d.get("engines")
    return [str(e) for e in names] if isinstance(names, list) else None


def engines_html(d: Mapping[str, Any]) -> str:
    found = engines(d)
    if found is None:
        return UNKNOWN
    return esc(", ".join(found)) if found else "none"


def storage_html(storage: Any) -> str:
    """Each fabric's directories: path, shared or local, how many weights, its problem."""
    if not isinstance(storage, list):
        return UNKNOWN
    if not storage:
        return "none configured"
    by_fabric: dict[str, list[str]] = defaultdict(list)
    for s in storage:
        if not isinstance(s, Mapping):
            continue
        models = s.get("models")
        n = f"{len(models)} weights" if isinstance(models, list) else "weights unknown"
        error = f"; {s.get('error')}" if s.get("error") else ""
        by_fabric[str(s.get("fabric") or "-")].append(
            f"{s.get('path')} ({'shared' if s.get('shared') else 'local'}, {n}{error})")
    return '<ul class="storage">' + "".join(f"<li>{esc(f)}: {esc('; '.join(v))}</li>"
                                            for f, v in sorted(by_fabric.items())) + "</ul>"


def contact_html(d: Mapping[str, Any]) -> str:
    age = d.get("last_contact_age_s")
    if not isinstance(age, (int, float)):
        return UNKNOWN
    return f'<span data-age-s="{age:.0f}">{age:.0f} s ago</span>'


# --- one node ----------------------------------------------------------------------------------------


def render_node(d: Mapping[str, Any] | None, name: str) -> str:
    if d is None:
        return (f'<p class="refusal" data-testid="node-missing">No node named {esc(name)} is known to the leader '
                f'(forgotten, or never connected). <a href="/nodes">All nodes</a></p>')
    facts = [("State", state_html(d)), ("Address", cell(d.get("address"))), ("Fabric", cell(d.get("fabric"))),
             ("Hostname", cell(d.get("hostname"))), ("CPUs", cell(d.get("cpus") or None)),
             ("Memory", cell(_gib(d.get("memory_total")))), ("Version", cell(d.get("version"))),
             ("GPU probe", cell(d.get("probe") or None)), ("Engines", engines_html(d)),
             ("Last contact", contact_html(d)),
             ("Replicas reported", cell(", ".join(d["replicas"]) if isinstance(d.get("replicas"), list) else None))]
    out = [table(["Fact", "Value"], [[k, v] for k, v in facts], sortable=False, testid="node-facts")]
    # Each device's reason is in its row of the GPU table below: here only what the rows do not say.
    problems = probe_warnings(d, [str(g.get("reason") or "") for g in d.get("gpus") or () if isinstance(g, Mapping)])
    if problems:
        out.append('<h2>Probe warnings</h2><ul data-testid="node-problems">' +
                   "".join(f"<li>{esc(p)}</li>" for p in problems) + "</ul>")
    gpus = d.get("gpus")
    out.append("<h2>GPUs</h2>")
    if not isinstance(gpus, list):
        out.append(f"<p>{UNKNOWN}: the node is not connected, so its devices are not known now.</p>")
    else:
        out.append(table(["GPU", "Class", "Memory", "Used", "Health", "Placeable", "Reason", "Util %", "Temp °C",
                          "Power W", "Processes"],
                         [[g.get("label"), g.get("gpu_class"), _gib(g.get("memory_total")),
                           _gib(g.get("memory_used"), zero=True),
                           "healthy" if g.get("healthy") else "unhealthy", "yes" if g.get("placeable") else "no",
                           g.get("reason") or "", g.get("utilization"), g.get("temperature_c"), g.get("power_w"),
                           ", ".join(str(p) for p in g.get("processes") or ())]
                          for g in gpus if isinstance(g, Mapping)], testid="node-gpus", empty="no GPU (CPU only)"))
    out.append("<h2>Storage</h2>")
    out.append(storage_table(d.get("storage")))
    return "".join(out)


def storage_table(storage: Any) -> str:
    if not isinstance(storage, list):
        return f"<p>{UNKNOWN}</p>"
    rows = []
    for s in sorted((s for s in storage if isinstance(s, Mapping)), key=lambda s: str(s.get("fabric") or "")):
        models = s.get("models")
        names = ", ".join(str(m.get("name")) for m in models if isinstance(m, Mapping)) if isinstance(
            models, list) else None
        refused = s.get("not_weights")
        rows.append([s.get("fabric") or "-", s.get("path"), "shared" if s.get("shared") else "local", names,
                     len(refused) + int(s.get("omitted") or 0) if isinstance(refused, list) else None,
                     s.get("error") or ""])
    return table(["Fabric", "Path", "Shared", "Weights", "Not weights", "Problem"], rows, testid="node-storage",
                 empty="no storage directory configured")


def _gib(value: Any, *, zero: bool = False) -> str | None:
    """Bytes as GiB; unknown (None) when not a number, or 0 where 0 means "not said" (a total)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or (value == 0 and not zero):
        return None
    return f"{value / GIB:.1f} GiB"
