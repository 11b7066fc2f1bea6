"""The `nodes` commands: every node the leader knows (connected, disconnected within its grace
period, or lost), with its GPUs, engines and storage; approving a pending one, cordoning, draining and
uncordoning one (maintenance), and forgetting a lost one."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone
import time
from typing import Annotated, Any

import cyclopts
from cyclopts import Parameter

from llmgw.cli.ctl.render import cell, clean, dig, table
from llmgw.cli.ctl.errors import EXIT_OK, CtlError
from llmgw.cli.ctl.session import SessionParam, api_path
from llmgw.domain.timeouts import TIMEOUTS


def register(app: cyclopts.App) -> None:
    app.command(nodes_app)


nodes_app = cyclopts.App(name="nodes", help="The nodes (agents) the leader knows; show one, approve a pending one, "
                                             "cordon, drain or uncordon one, restart one's agent, forget a lost one.")


@nodes_app.command(name="list")
def nodes_list(*, session: SessionParam) -> int:
    """Every node: state, address, fabric, GPUs (card/migN, class, health), engines, storage."""
    return session.show_answer("GET", api_path("nodes"), render=render_nodes)


nodes_app.default(nodes_list)  # `ctl nodes` alone does the same


@nodes_app.command(name="show")
def nodes_show(name: str, /, *, session: SessionParam) -> int:
    """One node: its state, inventory, GPUs and storage as `nodes list` has them, and the replicas placed
    there with what its agent says of each.

    Parameters
    ----------
    name
        The node's name, as `llmgw ctl nodes` lists it.
    """
    return session.show_answer("GET", api_path("nodes", name), render=render_node)


@nodes_app.command(name="forget")
def nodes_forget(name: str, /, *, session: SessionParam) -> int:
    """Forget a lost node (gone past its grace period); a connected one is refused. Placements still
    on it go with it, so no later leader finds it again. A forgotten node whose agent connects again
    simply reappears.

    Parameters
    ----------
    name
        The node's name, as `llmgw ctl nodes` lists it.
    """
    return session.show_answer("DELETE", api_path("nodes", name),
                               render=_forgot)


def _forgot(d: Any) -> str:
    removed = dig(d, "removed_placements")
    went = f" and its placements {', '.join(cell(r) for r in removed)}" if isinstance(removed, list) and removed else ""
    return f"forgot node {cell(dig(d, 'forgotten'))}{went}"


@nodes_app.command(name="approve")
def nodes_approve(name: str, /, *, session: SessionParam) -> int:
    """Approve a node: while the setting nodes.require_approval is on, a node that connects for the first
    time is pending (listed with its inventory, nothing placed on it) until approved. The cluster remembers
    the approval: a leader change or the node reconnecting does not ask again.

    Parameters
    ----------
    name
        The node's name, as `llmgw ctl nodes` lists it.
    """
    return session.show_answer("POST", api_path("nodes", name, "approve"),
                               render=lambda d: f"node {cell(dig(d, 'approved'))}: "
                                                f"{'already approved' if dig(d, 'already') else 'approved'}")


def _cordon(verb: str, name: str, session: SessionParam) -> int:
    return session.show_answer("POST", api_path("nodes", name, verb), render=render_cordon)


@nodes_app.command(name="cordon")
def nodes_cordon(name: str, /, *, session: SessionParam) -> int:
    """Cordon a node for maintenance: nothing new is placed on it (placement says `cordoned`); what runs
    there stays. `llmgw ctl nodes uncordon NAME` ends it.

    Parameters
    ----------
    name
        The node's name, as `llmgw ctl nodes` lists it.
    """
    return _cordon("cordon", name, session)


@nodes_app.command(name="drain")
def nodes_drain(name: str, /, *, wait: Annotated[bool, Parameter(
        help="Follow the drain until the node is empty, saying each change of its progress (at most "
             "ctl_node_drain_s), or return at once (default).")] = False, session: SessionParam) -> int:
    """Drain a node: cordon it, and move its replicas to other nodes one at a time. Each replacement is
    ready before the old replica leaves the gateways' routes (its requests in flight finish, for at most
    drain_stop_grace_s), so a model never loses its last ready replica. `llmgw ctl nodes` shows the
    progress ("draining: k replicas left") and what blocks it (nowhere to go, with placement's reasons).

    Parameters
    ----------
    name
        The node's name, as `llmgw ctl nodes` lists it.
    """
    if not wait:
        return _cordon("drain", name, session)
    session.request("POST", api_path("nodes", name, "drain"))
    deadline = time.monotonic() + TIMEOUTS.ctl_node_drain_s
    said = ""
    while True:
        _, doc = session.request("GET", api_path("nodes"))
        node = next((n for n in dig(doc, "nodes") or [] if isinstance(n, Mapping) and n.get("node") == name), None)
        drain = node.get("drain") if node is not None else None
        if node is None or not isinstance(drain, Mapping):
            raise CtlError(f"node {name} is no longer draining (uncordoned meanwhile?): `llmgw ctl nodes` says more")
        words = clean(str(drain.get("words")))
        if drain.get("left") == 0:
            session.show(node, lambda n: f"node {name}: {words}")
            return EXIT_OK
        if words != said:
            session.note(f"node {name}: {words}")
            said = words
        if time.monotonic() > deadline:
            raise CtlError(f"node {name} is not drained within {TIMEOUTS.ctl_node_drain_s:g} s: {words} (the drain "
                           f"goes on; `llmgw ctl nodes` follows it)")
        time.sleep(TIMEOUTS.ctl_poll_s)


@nodes_app.command(name="uncordon")
def nodes_uncordon(name: str, /, *, session: SessionParam) -> int:
    """End a node's cordon or drain: it takes replicas again (those already moved stay where they are).

    Parameters
    ----------
    name
        The node's name, as `llmgw ctl nodes` lists it.
    """
    return _cordon("uncordon", name, session)


def render_cordon(doc: Mapping[str, Any]) -> str:
    mode, name = dig(doc, "cordon"), cell(dig(doc, "node"))
    words = {"cordon": "cordoned: nothing new is placed on it", "drain": "draining",
             "none": "uncordoned: it takes replicas again"}.get(str(mode), str(mode))
    drain = dig(doc, "drain")
    if isinstance(drain, Mapping) and drain.get("words"):
        words = clean(str(drain["words"]))
    return f"node {name}: {words}" + ("" if dig(doc, "changed") else " (already so)")


@nodes_app.command(name="restart")
def nodes_restart(name: str, /, *, wait: Annotated[bool, Parameter(
        negative="--no-wait", help="Wait until the agent is back on a new stream (default), or return at once.")
] = True, session: SessionParam) -> int:
    """Restart a connected node's agent in place: it ends its stream, leaves its engines serving, and runs
    again as the same process with the same flags, adopting them (replica ids and engine pids unchanged).

    Parameters
    ----------
    name
        The node's name, as `llmgw ctl nodes` lists it.
    """
    _, asked = session.request("POST", api_path("nodes", name, "restart"))
    before = dig(asked, "connected_at")
    if not wait:
        session.show(asked, lambda d: f"node {cell(dig(d, 'restarting'))}: asked to restart")
        return EXIT_OK
    deadline = time.monotonic() + TIMEOUTS.ctl_node_restart_s
    while True:
        _, doc = session.request("GET", api_path("nodes"))
        node = next((n for n in dig(doc, "nodes") or [] if isinstance(n, Mapping) and n.get("node") == name), None)
        # Back: connected on a new stream, and its replicas reported on it (None until then: not 0).
        if (node is not None and node.get("state") == "connected" and node.get("connected_at") not in (None, before)
                and node.get("replicas") is not None):
            session.show(node, lambda n: f"node {name}: restarted, back on a new stream with "
                                         f"{len(n.get('replicas') or [])} replica(s)")
            return EXIT_OK
        if time.monotonic() > deadline:
            raise CtlError(f"node {name} was asked to restart but is not back within "
                           f"{TIMEOUTS.ctl_node_restart_s:g} s (state: {cell(node.get('state') if node else None)}); "
                           f"its agent's log says why (`llmgw service status agent` on its machine)")
        time.sleep(TIMEOUTS.ctl_poll_s)


# --- rendering: pure functions of the JSON; unknown is `-`, never 0 --------------------------------


def render_nodes(doc: Mapping[str, Any]) -> str:
    nodes = dig(doc, "nodes")
    if not isinstance(nodes, list) or not nodes:
        return "no nodes known: start an agent (`llmgw agent --control URL ...`)"
    out = [table(["NODE", "STATE", "SINCE", "ADDRESS", "FABRIC", "VERSION", "CPUS", "GPUS", "ENGINES", "CERTIFICATE"],
                 [[n.get("node"), _state(n), _since(n), n.get("address"), n.get("fabric"), n.get("version"),
                   n.get("cpus") or None, _gpu_count(n.get("gpus")), _engines(n), _certificate(n.get("certificate"))]
                  for n in nodes if isinstance(n, Mapping)])]
    for n in nodes:
        if not isinstance(n, Mapping):
            continue
        gpus, storage, warnings = n.get("gpus"), n.get("storage"), n.get("warnings")
        if isinstance(gpus, list) and gpus:
            out += ["", f"{cell(n.get('node'))}: GPUs",
                    _indent(table(["GPU", "CLASS", "MEMORY", "HEALTH", "PLACEABLE", "REASON"],
                                  [[_label(g), g.get("gpu_class"), _gib(g.get("memory_total")), _health(g),
                                    g.get("placeable"), g.get("reason")] for g in gpus if isinstance(g, Mapping)]))]
        if isinstance(storage, list) and storage:
            out += ["", f"{cell(n.get('node'))}: storage",
                    _indent(table(["FABRIC", "PATH", "SHARED", "MODELS", "NOT WEIGHTS", "PROBLEM"],
                                  [_storage_row(s) for s in sorted(storage, key=_fabric) if isinstance(s, Mapping)]))]
        if isinstance(warnings, list) and warnings:
            out += ["", *(f"warning: node {cell(n.get('node'))}: {clean(str(w))}" for w in warnings)]
        kept = _reserve(n)
        if kept:
            out += ["", f"{cell(n.get('node'))}: reserved for other work (--reserve): {kept}"]
    for n in nodes:
        drain = n.get("drain") if isinstance(n, Mapping) else None
        if isinstance(drain, Mapping) and drain.get("words"):
            out += ["", f"node {cell(n.get('node'))}: {clean(str(drain['words']))}"]
    if any(isinstance(n, Mapping) and n.get("cordon") in ("cordon", "drain") for n in nodes):
        out += ["", "cordoned and draining nodes take no new replica: `llmgw ctl nodes uncordon NAME` ends it"]
    if any(isinstance(n, Mapping) and n.get("approval") == "pending" for n in nodes):
        out += ["", "pending nodes take no replica until approved: `llmgw ctl nodes approve NAME`"]
    lost = [n for n in nodes if isinstance(n, Mapping) and n.get("state") == "lost"]
    if lost:
        out += ["", "lost nodes stay listed until forgotten: `llmgw ctl nodes forget NAME`"]
    return "\n".join(out)


def render_node(doc: Mapping[str, Any]) -> str:
    """`nodes show`: the node's facts one per line, then its tables (GPUs, replicas, storage) and notes."""
    n = doc.get("node")
    if not isinstance(n, Mapping):
        return "the leader said nothing of the node"
    memory = _gib(n.get("memory_total"))
    lines = [("node", n.get("node")), ("state", _state(n)), ("since", _since(n)), ("address", n.get("address")),
             ("hostname", n.get("hostname")), ("fabric", n.get("fabric")), ("version", n.get("version")),
             ("cpus", n.get("cpus") or None), ("memory", memory), ("gpus", _gpu_count(n.get("gpus"))),
             ("engines", _engines(n)), ("certificate", _certificate(n.get("certificate"))),
             ("reserved for other work", _reserve(n) or None)]
    out = [f"{label}: {cell(value)}" for label, value in lines]
    drain = n.get("drain")
    if isinstance(drain, Mapping) and drain.get("words"):
        out.append(f"drain: {clean(str(drain['words']))}")
    if n.get("upgrade_refused"):
        out.append(f"last upgrade refused: {clean(str(n.get('upgrade_refused')))}")
    gpus = n.get("gpus")
    if isinstance(gpus, list) and gpus:
        out += ["", "GPUs", _indent(table(["GPU", "CLASS", "MEMORY", "HEALTH", "PLACEABLE", "REASON"],
                                          [[_label(g), g.get("gpu_class"), _gib(g.get("memory_total")), _health(g),
                                            g.get("placeable"), g.get("reason")] for g in gpus if isinstance(g, Mapping)]))]
    placements = doc.get("placements")
    if isinstance(placements, list) and placements:
        rows = [[p.get("replica_id"), p.get("model"), _devices(p.get("gpus")), _replica_state(p, doc),
                 p.get("error")] for p in placements if isinstance(p, Mapping)]
        out += ["", "replicas", _indent(table(["REPLICA", "MODEL", "GPUS", "STATE", "ERROR"], rows))]
    elif isinstance(placements, list):
        out += ["", "replicas: none placed here"]
    storage = n.get("storage")
    if isinstance(storage, list) and storage:
        out += ["", "storage", _indent(table(["FABRIC", "PATH", "SHARED", "MODELS", "NOT WEIGHTS", "PROBLEM"],
                                             [_storage_row(s) for s in sorted(storage, key=_fabric)
                                              if isinstance(s, Mapping)]))]
    warnings = n.get("warnings")
    if isinstance(warnings, list) and warnings:
        out += ["", *(f"warning: {clean(str(w))}" for w in warnings)]
    if n.get("cordon") in ("cordon", "drain"):
        out += ["", f"it takes no new replica: `llmgw ctl nodes uncordon {cell(n.get('node'))}` ends the "
                    f"{'drain' if n.get('cordon') == 'drain' else 'cordon'}"]
    if n.get("approval") == "pending":
        out += ["", f"pending: it takes no replica until `llmgw ctl nodes approve {cell(n.get('node'))}`"]
    return "\n".join(out)


def _devices(gpus: Any) -> str | None:
    if not isinstance(gpus, list):
        return None  # not placed here: which devices it holds is the agent's to say
    return ", ".join(str(g) for g in gpus) if gpus else "CPU"


def _replica_state(p: Mapping[str, Any], doc: Mapping[str, Any]) -> str | None:
    """What the agent says of a replica (its state, and phase while starting), `asleep`, and whether a
    placement puts it there; None (`-`) when the agent said nothing (not connected: unknown, not stopped)."""
    state = p.get("state")
    said = None if state is None else str(state) + (f" ({p['phase']})" if p.get("phase") else "")
    if said is None and doc.get("agent_reported") is True:
        said = "not running yet"  # placed, and the connected agent does not list it (yet)
    if p.get("asleep") is True:
        said = f"{said}, asleep" if said else "asleep"
    if p.get("placed") is False:
        said = f"{said}; no placement here (stopping)" if said else "no placement here (stopping)"
    return said


def _state(n: Mapping[str, Any]) -> Any:
    """The node's state, with `pending` while it waits for approval (`nodes.require_approval`)."""
    state = n.get("state")
    if n.get("cordon") == "cordon":
        state = f"{state}, cordoned"
    elif n.get("cordon") == "drain":
        state = f"{state}, draining"
    return f"{state}, pending" if n.get("approval") == "pending" else state


def _certificate(cert: Any) -> str | None:
    """`SERIAL.. until DATE`, or `SERIAL.. revoked`; none: no certificate (an agent inside `llmgw up`)."""
    if not isinstance(cert, Mapping):
        return None
    serial = str(cert.get("serial"))[:12]
    if cert.get("revoked"):
        return f"{serial} revoked"
    until = cert.get("not_after")
    when = datetime.fromtimestamp(until, timezone.utc).strftime("%Y-%m-%d") if isinstance(until, (int, float)) else "?"
    return f"{serial} until {when}"


def _since(n: Mapping[str, Any]) -> str | None:
    gone, grace = n.get("gone_for_s"), n.get("grace_s")
    if n.get("state") == "connected" or not isinstance(gone, (int, float)):
        return None
    text = f"gone {gone:.0f} s"
    if isinstance(grace, (int, float)):
        text += f" (grace {grace:g} s)" if n.get("state") == "lost" else f" (lost in {max(grace - gone, 0):.0f} s)"
    return text


def _gpu_count(gpus: Any) -> str | None:
    if not isinstance(gpus, list):
        return None  # not reported (a node that is gone): unknown, not 0
    usable = [g for g in gpus if isinstance(g, Mapping) and g.get("healthy") is not False and g.get("placeable")
              is not False]
    return f"{len(usable)}/{len(gpus)} usable" if gpus else "0 (CPU)"


def _engines(n: Mapping[str, Any]) -> str | None:
    versions = n.get("engine_versions")
    if isinstance(versions, Mapping) and versions:
        return ", ".join(f"{name} {version}" if version else str(name) for name, version in sorted(versions.items()))
    engines = n.get("engines")
    return ", ".join(str(e) for e in engines) if isinstance(engines, list) and engines else None


def _label(g: Mapping[str, Any]) -> Any:
    return g.get("label") if g.get("label") is not None else g.get("index")


def _health(g: Mapping[str, Any]) -> str | None:
    healthy = g.get("healthy")
    return None if healthy is None else ("healthy" if healthy else "unhealthy")


def _reserve(n: Mapping[str, Any]) -> str:
    """What the node keeps for other work, in words ("" when nothing, or when its leader does not say)."""
    gpus = dig(n, "gpu_counts", "reserved")
    said = [f"GPU {', '.join(clean(str(g)) for g in gpus)}"] if isinstance(gpus, list) and gpus else []
    memory, vram = _gib(n.get("reserved_memory")), _gib(n.get("reserved_vram"))
    said += [f"{memory} of memory"] if memory else []
    said += [f"{vram} of each GPU"] if vram else []
    return "; ".join(said)


def _gib(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return None
    return f"{value / 2**30:.1f} GiB"


def _fabric(s: Any) -> str:
    return str(dig(s, "fabric") or "")


def _storage_row(s: Mapping[str, Any]) -> list[Any]:
    models, rejected = s.get("models"), s.get("not_weights")
    count = len(models) if isinstance(models, list) else None
    omitted = s.get("omitted")
    omitted = omitted if isinstance(omitted, int) else 0
    refused = len(rejected) + omitted if isinstance(rejected, list) else None
    return [s.get("fabric"), s.get("path"), s.get("shared"), count, refused, s.get("error")]


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())
