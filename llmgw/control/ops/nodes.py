"""Nodes: every node the leader knows (connected, disconnected within its grace period, or lost),
forgetting a lost one, approving one (while `nodes.require_approval` is on, a new node is pending), and
cordoning, draining and uncordoning one (maintenance: reconcile/drain.py)."""

from __future__ import annotations

from typing import Any

from llmgw.control.context import Context
from llmgw.control.ops import Commit, command_refusal
from llmgw.domain import commands, levels, summary
from llmgw.domain.observed import NodeInfo
from llmgw.domain.state import ClusterState
from llmgw.domain.trust import machine_id
from llmgw.reconcile.drain import DrainView
from llmgw.errors import AdminError


async def list_nodes(ctx: Context) -> dict[str, Any]:
    return {"nodes": node_docs(ctx)}


async def show(ctx: Context, name: str) -> dict[str, Any]:
    """One node as `list_nodes` has it, with `placements`: the replicas the state places there, each with what
    its agent says of it (`state`, `phase`, `error`, `since`; None: no word from the agent), then the replicas
    the agent runs that no placement puts there (`placed` false: stopping, or left from before). 404 for a
    node the leader does not know."""
    found = node_docs(ctx, only=name)  # the nodes the list has: one known and listed, or none
    if not found:
        raise AdminError(404, "node_not_found", f"no node named {name!r} is known to the leader")
    doc = found[0]
    state = ctx.state()
    reported = ctx.hub.replicas.get(name)
    told = reported or {}

    def agent_says(rid: str) -> dict[str, Any]:
        obs = told.get(rid)
        if obs is None:
            return {"state": None, "phase": None, "error": None, "since": None}
        return {"state": obs.state, "phase": obs.phase or None, "error": obs.error or None, "since": obs.since}

    placements = [{"replica_id": rid, "model": p.model, "gpus": list(p.gpus), "group": p.group or None,
                   "rank": p.rank if p.group else None, "asleep": p.asleep, "placed": True, **agent_says(rid)}
                  for rid, p in sorted(state.placements.items()) if p.node == name]
    placed = {p["replica_id"] for p in placements}
    placements += [{"replica_id": rid, "model": obs.model, "gpus": None, "group": None, "rank": None, "asleep": False,
                    "placed": False, **agent_says(rid)} for rid, obs in sorted(told.items()) if rid not in placed]
    return {"node": doc, "placements": placements, "agent_reported": reported is not None}


async def forget(ctx: Context, commit: Commit, name: str) -> dict[str, Any]:
    """Forget a lost node; 409 while it is within its grace period. The placements the state still holds
    there go first, in the same command as the forgetting (`node.forget`): a new leader rebuilds its nodes
    from the placements, and would otherwise find the forgotten node again. A group below store level 3
    removes them one by one (`placement.remove`)."""
    if ctx.hub.node_state(name) == "unknown":
        raise AdminError(404, "node_not_found", f"no node named {name!r} is known to the leader")
    refusal = ctx.hub.why_not_forget(name)
    if refusal is not None:
        raise AdminError(409, "node_not_lost", refusal)
    state = ctx.state()
    placed = sorted(rid for rid, p in state.placements.items() if p.node == name)
    removed: list[str] = []
    if placed and state.store_level >= levels.op_level("node.forget"):
        removed = list((await commit(commands.forget_node(name, ctx.clock())) or {}).get("removed", []))
    elif placed:
        for rid in placed:
            try:
                await ctx.store.submit(commands.remove_placement(rid, ctx.clock(), reason=f"node {name} forgotten"))
            except commands.CommandError as e:
                raise command_refusal(e) from None
        removed = placed
    ctx.hub.forget(name)
    return {"forgotten": name, "removed_placements": removed}


def known_nodes(ctx: Context) -> list[str]:
    """Every node this leader knows: heard from this term (connected, disconnected or lost, not
    forgotten) or holding a placement in the state."""
    state = ctx.state()
    return sorted(set(ctx.hub.connected_at) | set(ctx.hub.lost) | set(ctx.hub.nodes)
                  | {p.node for p in state.placements.values()})


async def approve(ctx: Context, commit: Commit, name: str) -> dict[str, Any]:
    """Approve a node: placement may use it from now on, whatever `nodes.require_approval` says, and
    the state remembers it (a leader change or its reconnecting never asks again). 404 for a node the
    leader does not know (connect its agent first: it shows as pending); approving twice is no error."""
    state = ctx.state()
    if name in state.approved_nodes:
        return {"approved": name, "already": True, "approved_at": state.approved_nodes[name]}
    if name not in known_nodes(ctx):
        raise AdminError(404, "node_not_found", f"no node named {name!r} is known to the leader: start its agent "
                                                f"first (it shows as pending in `ctl nodes`), then approve it")
    await commit(commands.approve_nodes([name], ctx.clock()))
    return {"approved": name, "already": False, "approved_at": ctx.state().approved_nodes.get(name)}


CORDON_VERBS = {"cordon": "cordon", "drain": "drain", "uncordon": "none"}  # the route's verb -> node.cordon's mode


async def cordon(ctx: Context, commit: Commit, name: str, verb: str) -> dict[str, Any]:
    """Cordon a node (nothing new is placed on it), drain it (also: its replicas move elsewhere, one at a time,
    each replaced before it stops) or uncordon it (either ends). 404 for a node the leader does not know.
    Asking for what holds already is no error (`changed` false)."""
    mode = CORDON_VERBS[verb]
    if name not in known_nodes(ctx) and name not in ctx.state().cordoned_nodes:
        raise AdminError(404, "node_not_found", f"no node named {name!r} is known to the leader")
    before = ctx.state().cordoned_nodes.get(name, "none")
    if before != mode:
        await commit(commands.cordon_nodes([name], mode, ctx.clock()))
    return {"node": name, "cordon": ctx.state().cordoned_nodes.get(name, "none"), "changed": before != mode,
            "drain": drain_doc(ctx, name)}


def drain_doc(ctx: Context, name: str) -> dict[str, Any] | None:
    """A draining node's progress as the reconciler's last pass saw it: `left` (replicas still placed there),
    `moving` (the model whose replacement starts), `blocked` (why the next cannot move), `words`; None
    when the node is not draining."""
    state = ctx.state()
    if state.cordoned_nodes.get(name) != "drain":
        return None
    plan = ctx.reconciler.last_plan
    seen = plan.drains.get(name) if plan is not None else None
    if seen is None:  # drained from this command on: the reconciler has not passed yet
        left = len({p.group or p.replica_id for p in state.placements.values() if p.node == name})
        seen = DrainView(name, left)
    return {"left": seen.left, "moving": seen.moving or None, "blocked": seen.blocked or None, "words": seen.words()}


def approval(state: ClusterState, name: str) -> str:
    """approved (an operator approved it, or it was known when approval was first required); pending
    (approval is required and it has none: nothing is placed on it); not_required (the setting is off)."""
    if name in state.approved_nodes:
        return "approved"
    return "pending" if state.pending_nodes((name,)) else "not_required"


async def restart(ctx: Context, name: str) -> dict[str, Any]:
    """Ask a connected node's agent to restart in place (its engines keep serving and are adopted), with
    when its current stream connected, so a caller can wait for the next one."""
    state = ctx.hub.node_state(name)
    if state == "unknown":
        raise AdminError(404, "node_not_found", f"no node named {name!r} is known to the leader")
    if state != "connected":
        raise AdminError(409, "node_not_connected", f"node {name} is {state}: only a connected agent can be asked to "
                                                    f"restart; start it on its machine (`llmgw service start agent`)")
    since = ctx.hub.connected_at.get(name)
    if not ctx.hub.send(name, {"type": "restart_agent", "reason": "asked by an operator (ctl nodes restart)"}):
        raise AdminError(503, "node_busy", f"node {name}'s stream did not take the message (backed up or "
                                           f"closing); retry")
    return {"restarting": name, "connected_at": since}


def node_docs(ctx: Context, only: str | None = None) -> list[dict[str, Any]]:
    """Each node as the summary lists it, with how the leader sees it: `state` (connected,
    disconnected: within its grace period, lost: past it, unknown: placed on but never heard of
    in this term), since when, and the rest of its inventory. Unknown values are None. `only`: that
    node's alone."""
    hub = ctx.hub
    observed = hub.observed()
    now = ctx.clock()

    def age(at: float | None) -> float | None:
        return None if at is None else round(max(now - at, 0.0), 3)

    docs = []
    state = ctx.state()
    for doc in summary.nodes(state, observed):
        name = str(doc["node"])
        if only is not None and name != only:
            continue
        info = observed.nodes.get(name)
        lost_at = hub.lost.get(name)
        gpus = None if info is None else [{**g.to_doc(), "label": g.label} for g in info.gpus]
        reported = hub.replicas.get(name)
        docs.append({
            **doc,
            **_inventory(info),
            "gpus": gpus,
            "state": hub.node_state(name),
            "approval": approval(state, name),
            "cordon": state.cordoned_nodes.get(name, "none"),  # cordon | drain | none (`ctl nodes cordon|drain`)
            "drain": drain_doc(ctx, name),
            "lost_at": lost_at,
            "grace_s": hub.grace_s,
            "lost_after": None if lost_at is None else lost_at + hub.grace_s,
            "gone_for_s": age(lost_at),
            "last_contact": hub.last_contact.get(name),
            "connected_at": hub.connected_at.get(name) if name in hub.links else None,
            "last_contact_age_s": age(hub.last_contact.get(name)),
            "replicas": None if reported is None else sorted(reported),
            "certificate": _certificate(state, name),
            # The release file its agent runs, by sha256 (None, with why), and why it refused the last upgrade.
            "release_sha256": hub.releases.get(name, (None, ""))[0] if name in hub.links else None,
            "release_reason": (hub.releases.get(name, (None, ""))[1] or None) if name in hub.links else "not connected",
            "upgrade_refused": hub.upgrade_refused.get(name),
        })
    return docs


def _certificate(state: ClusterState, node: str) -> dict[str, Any] | None:
    """The node's agent certificate as the cluster holds it: its newest serial and expiry, or the
    revoked one (None: it holds none: an agent in `llmgw up`'s own process)."""
    held = state.machines.get(machine_id("agent", node))
    if held is not None:
        return {"serial": held.serials[-1], "not_after": held.not_after, "revoked": False}
    revoked = [r for r in state.revoked.values() if r.role == "agent" and r.name == node]
    if revoked:
        newest = max(revoked, key=lambda r: r.not_after)
        return {"serial": newest.serial, "not_after": newest.not_after, "revoked": True}
    return None


def _inventory(info: NodeInfo | None) -> dict[str, Any]:
    keys = ("address", "fabric", "version", "probe", "warnings", "engine_versions", "storage", "cpu_flags")
    if info is None:
        return {k: None for k in keys}
    doc = info.to_doc()
    return {k: doc.get(k) for k in keys}
