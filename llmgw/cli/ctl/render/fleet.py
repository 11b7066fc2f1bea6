"""The pages `ctl status` and `ctl plan` print: the cluster summary as aggregates (capacity
bars per GPU class, fabrics, model counts, the unasked-for, warnings) and a what-if placement.

Pure functions of the API's JSON, readable at 200 nodes: a few dozen lines, never one per node
(`ctl nodes` has that table); unknown is `-`, never 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from llmgw.cli.ctl.render import (
    NO_MODELS,
    _activation,
    _ago,
    _floating_line,
    _gateways,
    _gib,
    _known_count,
    _ratio,
    _reason,
    _reported,
    _short,
    _state,
    cell,
    clean,
    dig,
    table,
)
from llmgw.cli.ctl.render.guard import status_header, status_section

SMALL_FLEET = 8  # up to this many nodes, the page lists each one too
MODEL_ROWS = 12  # models listed: all of them up to this many, else the ones short of what they want
IDLE_ROWS = 6
WARNING_ROWS = 10
HELD_WIDTH = 90  # a fabric's "holds" line is cut here; --json has every name
BAR = 20


def render_status(doc: Mapping[str, Any]) -> str:
    cluster = dig(doc, "cluster") or {}
    out = [_header(cluster), *status_header(doc)]  # guards off: said under the header
    if isinstance(dig(cluster, "floating_address"), Mapping):
        out.append(_floating_line(dig(cluster, "floating_address")))
    members = dig(cluster, "members")
    if isinstance(members, list) and members:
        out += ["", "CONTROL PLANES"]
        rows = ([dig(m, "id"), dig(m, "role"), dig(m, "state"), _known_count(dig(m, "lag")),
                 _ago(dig(m, "last_contact_age_s")), _short(dig(m, "reason"))] for m in members)
        out.append(table(["MEMBER", "ROLE", "STATE", "LAG", "LAST CONTACT", "REASON"], rows))
    out += _nodes(doc, cluster)
    if "gateways" in cluster:
        out += ["", "GATEWAYS"] + _gateways(cluster)
    out += _capacity(dig(doc, "capacity"))
    out += _fabrics(dig(doc, "fabrics"))
    out += _models(doc)
    out += status_section(doc)  # the guard judges (render/guard.py)
    out += _idle(doc)
    out += _warnings(doc)
    return "\n".join(out)


def _total(doc: Mapping[str, Any], name: str, rows: Any) -> int:
    """How many rows list `name` has: its page's `total` (a paged document: `GET /api/v1/status` lists a page of
    each list that grows with the fleet), else the rows there are (`?full=1`, or an older control plane)."""
    total = dig(doc, "pages", name, "total")
    if isinstance(total, int) and not isinstance(total, bool):
        return total
    return len(rows) if isinstance(rows, list) else 0


def _header(cluster: Mapping[str, Any]) -> str:
    stopped = dig(cluster, "stopped")
    serving = {
        True: "STOPPED (serving.stopped is set; `llmgw start` serves again)",
        False: "serving",
    }
    parts = [
        f"leader: {cell(dig(cluster, 'leader'))}",
        f"revision: {cell(dig(cluster, 'revision'))}",
        serving.get(stopped, "serving: -") if isinstance(stopped, bool) else "serving: -",
    ]
    return "   ".join(parts)


# --- nodes and capacity ---------------------------------------------------------------


def _nodes(doc: Mapping[str, Any], cluster: Mapping[str, Any]) -> list[str]:
    """A small fleet's node table; a large one's counts (`ctl nodes` lists each)."""
    nodes = dig(doc, "nodes")
    total = _total(doc, "nodes", nodes)
    if not isinstance(nodes, list) or not total:
        return ["", "NODES", "no nodes have reported"]
    if total > SMALL_FLEET or len(nodes) < total:
        down = (dig(doc, "node_counts", "not_connected") if len(nodes) < total
                else sum(1 for n in nodes if dig(n, "connected") is False))
        down = down if isinstance(down, int) else 0
        line = f"NODES  {total - down} connected" + (f", {down} not connected" if down else "")
        return ["", line + "  (`llmgw ctl nodes` lists each)"]
    agents = dig(cluster, "agents")  # the agents' last contact, when the leader listed them
    contact = {dig(a, "node"): dig(a, "last_contact_age_s") for a in agents} if isinstance(agents, list) else None
    rows = ([dig(n, "node"), dig(n, "hostname"), dig(n, "connected"), _reported(dig(n, "cpus")),
             _gib(dig(n, "memory_total")), _gpus(dig(n, "gpus")), _names(dig(n, "engines")),
             *([_ago(contact.get(dig(n, "node")))] if contact is not None else [])] for n in nodes)
    headers = ["NODE", "HOSTNAME", "CONNECTED", "CPUS", "MEMORY", "GPUS", "ENGINES",
               *(["LAST CONTACT"] if contact is not None else [])]
    return ["", "NODES", table(headers, rows)]


def _gpus(value: Any) -> str | None:
    if not isinstance(value, list):
        return None
    if not value:
        return "0"
    classes: dict[str, int] = {}
    for gpu in value:
        name = dig(gpu, "gpu_class") or dig(gpu, "name") or "?"
        classes[str(name)] = classes.get(str(name), 0) + 1
    return ", ".join(f"{n}x {c}" for c, n in classes.items())


def _names(value: Any) -> str | None:
    if not isinstance(value, list):
        return None
    if not value:
        return "none"
    return ",".join(str(dig(v, "name") or v) if isinstance(v, Mapping) else str(v) for v in value)


def bar(used: Any, free: Any, unusable: Any, width: int = BAR) -> str | None:
    """`#` used, `.` free, `x` unusable, in proportion; `-` when a count is unknown."""
    counts = [used, free, unusable]
    if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts):
        return None
    u, bad = int(used), int(unusable)
    total = u + int(free) + bad
    if not total:
        return "[" + " " * width + "]"
    marks = [round(width * u / total), 0, round(width * bad / total)]
    marks[1] = width - marks[0] - marks[2]
    return "[" + "#" * marks[0] + "." * marks[1] + "x" * marks[2] + f"] {100 * u // total}% used"


def _capacity(rows: Any) -> list[str]:
    if not isinstance(rows, list):
        return []
    if not rows:
        return ["", "CAPACITY  no GPUs reported"]
    return ["", "CAPACITY (GPUs per class; unusable, reserved for other work: neither used nor free)", table(
        ["CLASS", "NODES", "USED", "FREE", "UNUSABLE", "RESERVED", "USAGE"],
        ([dig(r, "class"), _known_count(dig(r, "nodes")), _known_count(dig(r, "used")),
          _known_count(dig(r, "free")), _known_count(dig(r, "unusable")), _known_count(dig(r, "reserved")),
          bar(dig(r, "used"), dig(r, "free"), dig(r, "unusable"))] for r in rows))]


def _fabrics(rows: Any) -> list[str]:
    """Per fabric: nodes, whole free nodes (what a multi-node replica needs), GPUs, and what its
    storage holds (a shared directory once, local copies counted by node)."""
    if not isinstance(rows, list) or not rows:
        return []
    out = ["", "FABRICS", table(
        ["FABRIC", "NODES", "WHOLE FREE", "GPUS USED", "GPUS FREE", "SHARED DIRS", "LOCAL DIRS", "WEIGHTS"],
        ([_fabric_name(r), _known_count(dig(r, "nodes")), _known_count(dig(r, "whole_free_nodes")),
          _known_count(dig(r, "gpus_used")), _known_count(dig(r, "gpus_free")),
          len(dig(r, "shared") or []), _known_count(dig(r, "local_dirs")),
          len(dig(r, "models") or [])] for r in rows))]
    for r in rows:
        held = [_held(m) for m in dig(r, "models") or []]
        if held:
            line = f"  {_fabric_name(r)} holds: " + ", ".join(held)
            out.append(clean(_short(line, HELD_WIDTH)))
    return out


def _fabric_name(row: Any) -> str:
    return str(dig(row, "fabric") or "(no fabric)")


def _held(m: Any) -> str:
    where = []
    if dig(m, "shared") is True:
        where.append("shared")
    local = dig(m, "local_nodes")
    if isinstance(local, int) and local:
        where.append(f"{local} node{'s' if local > 1 else ''}")
    return f"{dig(m, 'name')} ({' + '.join(where) or '-'})"


# --- models, the unasked-for, warnings ----------------------------------------------


def _models(doc: Mapping[str, Any]) -> list[str]:
    models = dig(doc, "models")
    short_only = dig(doc, "pages", "models", "short") is True  # `ctl status` asked for the short ones
    count = dig(doc, "totals", "models") if short_only else _total(doc, "models", models)
    if not isinstance(models, list) or not isinstance(count, int) or not count:
        return ["", "MODELS", NO_MODELS]
    head = "MODELS" + _totals_line(dig(doc, "totals"))
    shown: Sequence[Any] = models
    left = ""
    if count > MODEL_ROWS:
        # A large catalog: the models short of what they should have now (or not judged yet).
        short = models if short_only else [m for m in models if dig(m, "satisfied") is not True]
        shown = short[:MODEL_ROWS]
        short_count = len(short)
        if short_only:
            short_count = _total(doc, "models", short)
        elif len(models) < count and isinstance(dig(doc, "totals", "satisfied"), int):
            short_count = count - dig(doc, "totals", "satisfied")  # a page of the models: the totals count them
        fine = count - short_count
        left = (f"  … {short_count - len(shown)} more short, " if short_count > len(shown) else "  … ") + \
            f"{fine} satisfied not listed (`llmgw ctl models` lists each)"
    out = ["", head]
    if shown:
        out.append(table(["NAME", "ENGINE", "ROLE", "READY/DESIRED", "STATE", "REASON"],
                         ([dig(m, "name"), dig(m, "engine"), dig(m, "role"), _ratio(dig(m, "ready"), dig(m, "desired")),
                           _state(m), _short(_why(m))] for m in shown)))
        out += [f"  {cell(dig(m, 'name'))}: {cell(words)}" for m in shown if (words := _activation(m))]
        out += [f"  {cell(dig(m, 'name'))}: schedule {cell(words)}" for m in shown if (words := dig(m, "schedule"))]
    if left:
        out.append(left)
    return out


def _why(m: Mapping[str, Any]) -> Any:
    """The model's reason; a model short of replicas with failed starts says its last error."""
    reason = _reason(m)
    if not reason and dig(m, "satisfied") is False and dig(m, "last_error"):
        return f"{_known_count(dig(m, 'failures_in_row'))} failed start(s) in a row: {dig(m, 'last_error')}"
    return reason


def _totals_line(t: Any) -> str:
    if not isinstance(t, Mapping):
        return ""
    words = [f"{_known_count(t.get('satisfied'))} satisfied", f"{_known_count(t.get('short'))} short"]
    words += [f"{t[k]} {k}" for k in ("starting", "parked", "unplaceable", "stopped", "unknown")
              if isinstance(t.get(k), int) and t[k] > 0]
    r = t.get("replicas")
    reps = ""
    if isinstance(r, Mapping):
        reps = "   replicas: " + ", ".join(f"{_known_count(r.get(k))} {k}"
                                           for k in ("ready", "desired", "starting", "failed"))
    return f"  {_known_count(t.get('models'))}: " + ", ".join(words) + reps


def idle_for(seconds: Any) -> str | None:
    """How long unasked-for: negative (never observed since this leader began) is unknown."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0:
        return None
    s = int(seconds)
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min"
    return f"{s // 3600} h {s % 3600 // 60} min"


def _idle(doc: Mapping[str, Any]) -> list[str]:
    """Models holding replicas, longest unasked-for first: what could be stopped."""
    rows = dig(doc, "idle")
    if not isinstance(rows, list) or not rows:
        return []
    total = _total(doc, "idle", rows)
    out = ["", "UNASKED-FOR (longest idle first; - = not observed since this leader started)", table(
        ["MODEL", "MODE", "REPLICAS", "GPUS", "IDLE FOR", "STOPS AFTER"],
        ([dig(r, "model"), dig(r, "mode"), _known_count(dig(r, "replicas")), _known_count(dig(r, "gpus")),
          idle_for(dig(r, "idle_s")), idle_for(dig(r, "idle_timeout_s"))] for r in rows[:IDLE_ROWS]))]
    if total > IDLE_ROWS:
        out.append(f"  … {total - IDLE_ROWS} more (`--json` lists each)")
    return out


def _warnings(doc: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    warnings = dig(doc, "warnings")
    if isinstance(warnings, list) and warnings:
        out += ["", "WARNINGS"]
        # The models' own warnings last: the models table already shows them.
        ordered = sorted(warnings, key=lambda w: str(w).startswith("model "))
        out += [f"  ! {_short(clean(str(w)), 160)}" for w in ordered[:WARNING_ROWS]]
        if len(warnings) > WARNING_ROWS:
            out.append(f"  … {len(warnings) - WARNING_ROWS} more (`--json` lists each)")
    webhooks = dig(doc, "notify", "webhooks")
    said = isinstance(warnings, list) and any("webhook" in str(w) for w in warnings)
    if webhooks == 0 and not said:  # say so, and how to set one
        out += [
            "",
            "notifications: no webhook set; lost nodes and parked models reach nobody."
            " Set one: llmgw ctl settings notify.webhooks '[\"https://...\"]'",
        ]
    return out


# --- ctl plan -------------------------------------------------------------------------

PLAN_NODES_SHOWN = 4  # node names per reason; --json has every node's verdict
VERDICT_WORDS = {"not_now": "not now", "never": "never"}


def render_plan(doc: Mapping[str, Any]) -> str:
    """Where one more replica would land (node, devices, score, a multi-node replica's members),
    or that it fits nowhere and why; then every refusal grouped by verdict and reason."""
    name, nodes = cell(dig(doc, "model")), _known_count(dig(doc, "nodes"))
    out = [f"plan for {name} (revision {cell(dig(doc, 'revision'))}, {nodes} nodes connected; nothing was changed)"]
    choice = dig(doc, "choice")
    if isinstance(choice, Mapping):
        out.append(f"fits: node {cell(dig(choice, 'node'))}, devices {_devices(dig(choice, 'gpus'))}, "
                   f"score {cell(dig(choice, 'score'))} of 100")
        members = dig(choice, "members")
        if isinstance(members, list) and members:
            out.append(f"  a {len(members)}-node replica in fabric {cell(dig(choice, 'fabric'))}:")
            out += [f"    rank {i}: {cell(dig(m, 'node'))} devices {_devices(dig(m, 'gpus'))}"
                    for i, m in enumerate(members)]
        extra = {k: v for k, v in choice.items() if k not in ("node", "gpus", "score", "members", "fabric")}
        out += [f"  {k}: {cell(v)}" for k, v in sorted(extra.items())]
    elif dig(doc, "groups") or dig(doc, "summary"):
        # The table below has each node's reason: the line says only what spans nodes.
        out.append(f"fits nowhere now: {_short(clean(str(dig(doc, 'summary') or 'no node fits')), 300)}")
    else:
        out.append(f"fits nowhere now: {_short(cell(dig(doc, 'reason')), 300)}")
    estimate = dig(doc, "estimate")
    if isinstance(estimate, Mapping):
        out.append(f"memory: {_estimate(estimate)}")
    existing = dig(doc, "existing")
    if dig(existing, "defined") is True:
        same = "this definition" if dig(existing, "same_definition") else "another definition (a change)"
        out.append(f"already defined with {same}: {_known_count(dig(existing, 'replicas'))} replica(s) placed; "
                   f"the plan is for one more")
    groups = dig(doc, "groups")
    if isinstance(groups, list) and groups:
        out += ["", "REFUSED (by verdict and reason; `--json` has every node's)"]
        rows = []
        for g in groups:
            for m in dig(g, "messages") or []:
                rows.append([VERDICT_WORDS.get(str(dig(g, "verdict")), dig(g, "verdict")),
                             dig(g, "code"), _known_count(len(dig(m, "nodes") or [])),
                             _short(_message(m)), _some(dig(m, "nodes"))])
        out.append(table(["VERDICT", "REASON", "NODES", "WHY", "E.G."], rows))
    return "\n".join(out)


def _devices(gpus: Any) -> str:
    if not isinstance(gpus, list):
        return "-"
    return ",".join(str(g) for g in gpus) if gpus else "none (CPU)"


def _estimate(e: Mapping[str, Any]) -> str:
    total = dig(e, "bytes")
    detail = dig(e, "detail")
    if not isinstance(total, int) or isinstance(total, bool):
        return "unknown" + (f" ({clean(str(detail))})" if detail else "; set profile.memory_gib to say")
    text = f"{total / 2**30:.1f} GiB" + ("" if dig(e, "complete") is not False else " at least")
    return text + (f" ({clean(str(detail))})" if detail else "")


def _message(m: Mapping[str, Any]) -> str:
    """A refusal's words, and anything placement added to it (how short, which fabric...)."""
    extra = [_extra(k, v) for k, v in sorted(m.items()) if k not in ("message", "nodes") and v not in (None, "", {}, [])]
    return clean(str(dig(m, "message") or "-")) + (f" [{' '.join(extra)}]" if extra else "")


def _some(nodes: Any) -> str:
    if not isinstance(nodes, list) or not nodes:
        return "-"
    shown = ", ".join(str(n) for n in nodes[:PLAN_NODES_SHOWN])
    return shown + (f" +{len(nodes) - PLAN_NODES_SHOWN}" if len(nodes) > PLAN_NODES_SHOWN else "")


def _extra(key: str, value: Any) -> str:
    if isinstance(value, Mapping):
        return " ".join(f"{k}={cell(v)}" for k, v in value.items())
    return f"{key}={cell(value)}"
