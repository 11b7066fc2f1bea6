"""Gateways: every gateway the leader has seen on its stream (connected or not), and asking a connected
one to restart in place (it drains, then runs again with its listening socket: no client refused), or to
upgrade: fetch a release from this leader and restart in place into it (`ctl upgrade`)."""

from __future__ import annotations

from typing import Any

from llmgw import release
from llmgw.control.context import Context
from llmgw.control.gateway_stream import GatewayHub, GatewayLink, hub_of
from llmgw.control.ops import upgrade as releases
from llmgw.errors import AdminError


async def list_gateways(ctx: Context) -> dict[str, Any]:
    hub = hub_of(ctx.reconciler)
    return {"gateways": [] if hub is None else hub.gateways()}


def _restartable(ctx: Context, name: str, what: str) -> tuple[GatewayHub, GatewayLink]:
    hub = hub_of(ctx.reconciler)
    link = None if hub is None else hub.links.get(name)
    if hub is not None and link is None and name in hub.local:
        raise AdminError(409, "cannot_restart", f"gateway {name} runs inside the control plane's own process "
                                                f"(`llmgw up`): {what} it by restarting `llmgw up`")
    if hub is None or link is None:
        raise AdminError(404, "gateway_not_found", f"no gateway named {name!r} has followed the leader "
                                                   f"(`llmgw ctl gateways` lists them)")
    if not link.connected:
        raise AdminError(409, "gateway_not_connected", f"gateway {name} is not connected: only a gateway that "
                                                       f"follows the leader can be asked to {what}; start it on "
                                                       f"its machine (`llmgw service start gateway`)")
    if not link.restartable:
        raise AdminError(409, "cannot_restart", f"gateway {name} cannot restart in place (an older version, or a "
                                                f"gateway inside another process): {what} it on its machine "
                                                f"(`llmgw service restart gateway`)")
    return hub, link


def _ask(hub: GatewayHub, link: GatewayLink, message: dict[str, Any]) -> None:
    if not hub.ask(link.name, message):
        raise AdminError(503, "gateway_busy", f"gateway {link.name}'s stream did not take the message (backed up or "
                                              f"closing); retry")


async def restart(ctx: Context, name: str) -> dict[str, Any]:
    """Ask a connected gateway, over its stream, to restart in place; with when its current stream
    connected and its program started, so a caller can wait for the next ones."""
    hub, link = _restartable(ctx, name, "restart")
    _ask(hub, link, {"type": "restart_gateway", "reason": "asked by an operator (ctl gateways restart)"})
    return {"restarting": name, "connected_at": link.connected_at, "started_at": link.started_at, "pid": link.pid}


async def upgrade(ctx: Context, name: str, body: Any) -> dict[str, Any]:
    """`POST /api/v1/gateways/NAME/upgrade`: ask a connected gateway, over its stream, to fetch the release from
    this leader (which must hold it) and restart in place into it, or into the file it ran before (`rollback`);
    it drains and hands its listening socket over, as for a restart. Its refusal (the fetch failed, no file ran
    before, ...) shows as its `upgrade_refused` in `GET /api/v1/gateways`. With when its current stream connected
    and its program started, so a caller can wait for the next ones."""
    hub, link = _restartable(ctx, name, "upgrade")
    if link.release_sha256 is None:
        raise AdminError(409, "not_a_zipapp", f"gateway {name} runs no release file ctl upgrade can replace (it "
                                              f"runs from the llmgw package, or is older than ctl upgrade): "
                                              f"upgrade it on its machine")
    rollback = body.get("rollback", False) if isinstance(body, dict) else None
    if not isinstance(body, dict) or set(body) - {"sha256", "rollback"} or not isinstance(rollback, bool) or \
            rollback == ("sha256" in body):
        raise AdminError(400, "invalid_request", 'send either {"sha256": "<64 hex digits>"} or {"rollback": true}')
    try:
        sha = "" if rollback else release.checked_sha256(body["sha256"])
    except release.ReleaseError as e:
        raise AdminError(400, e.code, e.message) from None
    message: dict[str, Any] = {"type": "upgrade_gateway"}
    if rollback:
        message["rollback"] = True
    else:
        await releases.download(ctx, sha)  # held here, or 404 now rather than on the gateway
        message["sha256"] = sha
    link.upgrade_refused = None
    _ask(hub, link, message)
    return {"upgrading": name, "connected_at": link.connected_at, "started_at": link.started_at, "pid": link.pid,
            "from": link.release_sha256, "to": message.get("sha256"), "rollback": rollback}
