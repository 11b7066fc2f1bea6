"""Gateways: every gateway the leader has seen on its stream (connected or not), and asking a connected
one to restart in place (it drains, then runs again with its listening socket: no client refused)."""

from __future__ import annotations

from typing import Any

from llmgw.control.context import Context
from llmgw.control.gateway_stream import hub_of
from llmgw.errors import AdminError


async def list_gateways(ctx: Context) -> dict[str, Any]:
    hub = hub_of(ctx.reconciler)
    return {"gateways": [] if hub is None else hub.gateways()}


async def restart(ctx: Context, name: str) -> dict[str, Any]:
    """Ask a connected gateway, over its stream, to restart in place; with when its current stream
    connected and its program started, so a caller can wait for the next ones."""
    hub = hub_of(ctx.reconciler)
    link = None if hub is None else hub.links.get(name)
    if hub is None or link is None:
        raise AdminError(404, "gateway_not_found", f"no gateway named {name!r} has followed the leader "
                                                   f"(`llmgw ctl gateways` lists them)")
    if not link.connected:
        raise AdminError(409, "gateway_not_connected", f"gateway {name} is not connected: only a gateway that "
                                                       f"follows the leader can be asked to restart; start it on "
                                                       f"its machine (`llmgw service start gateway`)")
    if not link.restartable:
        raise AdminError(409, "cannot_restart", f"gateway {name} cannot restart in place (an older version, or a "
                                                f"gateway inside another process): restart it on its machine "
                                                f"(`llmgw service restart gateway`)")
    if not hub.ask(name, {"type": "restart_gateway", "reason": "asked by an operator (ctl gateways restart)"}):
        raise AdminError(503, "gateway_busy", f"gateway {name}'s stream did not take the message (backed up or "
                                              f"closing); retry")
    return {"restarting": name, "connected_at": link.connected_at, "started_at": link.started_at, "pid": link.pid}
