"""The streams' WebSocket routes: agents (`protocol.STREAM_PATH`) and remote gateways
(`protocol.GATEWAY_STREAM_PATH`) open one each to the leader; each is authenticated here, once, by
`authenticate`, then run by its session (control/agent_stream.py, control/gateway_stream.py).

A machine authenticates with its certificate from the cluster's CA (mutual TLS), for its role only:
an agent's certificate speaks the agent stream for its own node, a gateway's the gateway stream
under its own name; no key is taken here, an admin key included. A stream whose certificate is
revoked while it runs is closed within `trust_revoke_s` (`_while_trusted`)."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio
from quart import Response, websocket
from quart_trio import QuartTrio

from llmgw.control import agent_stream, gateway_stream
from llmgw.control.context import LOCAL_PREFIX, Context
from llmgw.control.ops import trust
from llmgw.domain.trust import hash_token
from llmgw.errors import AdminError
from llmgw.trust.ca import Identity
from llmgw.trust.peer import PeerRefused, authorize
from llmgw.trust.tls import peer_certificate
from llmgw.wire import protocol

log = logging.getLogger("llmgw.control.trust")


def authenticate(ctx: Context, role: str, cert_der: bytes | None, *, local: str | None = None) -> Identity | AdminError:
    """The one check for a stream to control: the certificate of this connection (`cert_der`), for
    `role`; or the in-memory credential of a machine inside this process (`local`: `llmgw up`'s own
    agent, over loopback or TLS: a plain listener is on loopback only). The machine's identity, or the
    refusal (401/403, in the admin error shape)."""
    if local is not None:
        who = ctx.local_machines.get(hash_token(local))
        if who is None:
            return AdminError(401, "unauthorized", "not a credential of a machine inside this control plane's process")
        if who.role != role:
            return AdminError(403, "forbidden", f"a {who.role}'s credential cannot speak as a {role}")
        return who
    if ctx.trust is None:
        return AdminError(409, "no_tls", "this control plane serves plain HTTP on loopback, where machines cannot "
                          "authenticate; start it bound to another address or with --tls (docs/security.md)")
    try:
        return authorize(cert_der, ctx.state(), ctx.clock(), role=role)
    except PeerRefused as e:
        return AdminError(403 if e.code == "forbidden" else 401, e.code, e.message)


async def _send(text: str) -> None:
    await websocket.send(text)


async def _agent(ctx: Context, who: Identity) -> None:
    async def renew(node: str, csr: str) -> dict[str, Any]:
        answer = await trust.renew(ctx, "agent", node, csr)
        return {"type": "certificate", "certificate": answer["certificate"], "ca": answer["ca"]}

    await agent_stream.session(websocket.receive, _send, ctx.hub, is_leader=ctx.store.is_leader,
                               leader_info=ctx.store_status, self_id=ctx.self_id, machine=who.name,
                               renew=renew if who.serial != "local" else None)


async def _gateway(ctx: Context, who: Identity) -> None:
    remote = websocket.remote_addr
    await gateway_stream.session(ctx, websocket.receive, _send, str(remote) if remote else "", machine=who.name)


STREAMS: dict[str, tuple[str, Callable[[Context, Identity], Awaitable[None]]]] = {
    protocol.STREAM_PATH: ("agent", _agent),
    protocol.GATEWAY_STREAM_PATH: ("gateway", _gateway),
}


async def _while_trusted(ctx: Context, who: Identity, run: Callable[[], Awaitable[None]]) -> None:
    """`run()` until it ends or the machine's certificate stops admitting it (revoked, its authority
    dropped): then the stream is closed with the reason."""
    if who.serial == "local":  # a machine inside this process: no certificate to revoke
        await run()
        return
    async with trio.open_nursery() as nursery:
        async def watch() -> None:
            state = ctx.state()
            while who.serial not in state.revoked and who.issuer_serial in state.authorities:
                state = await ctx.store.wait_changed(state.revision)
            log.warning("closing the stream of %s %s: its certificate (serial %s) was revoked", who.role, who.name,
                        who.serial)
            if who.role == "agent":
                ctx.hub.lose_now(who.name, f"its agent's certificate (serial {who.serial}) was revoked")
            with trio.move_on_after(ctx.timeouts.revoke_notice_s):
                await websocket.send(protocol.dumps({"type": "refused", "reason": "this machine's certificate was "
                                                     "revoked", "code": "revoked"}))
            nursery.cancel_scope.cancel()

        nursery.start_soon(watch)
        await run()
        nursery.cancel_scope.cancel()


def local_credential(headers: Any) -> str | None:
    scheme, _, value = headers.get("authorization", "").partition(" ")
    value = value.strip()
    return value if scheme.lower() == "bearer" and value.startswith(LOCAL_PREFIX) else None


def register(app: QuartTrio, ctx: Context) -> None:
    """Add each stream's route: refused (401/403, in the admin error shape) before the upgrade, or
    accepted and run until it ends."""
    for path, (role, run) in STREAMS.items():
        def route(role: str = role, run: Callable[[Context, Identity], Awaitable[None]] = run
                  ) -> Callable[[], Awaitable[Any]]:
            async def stream() -> Any:
                who = authenticate(ctx, role, peer_certificate(), local=local_credential(websocket.headers))
                if isinstance(who, AdminError):
                    log.warning("refused the %s stream from %s: %s", role, websocket.remote_addr, who.message)
                    return Response(json.dumps(who.doc()), status=who.status, content_type="application/json")
                await websocket.accept()
                await _while_trusted(ctx, who, lambda: run(ctx, who))
                return None
            stream.__name__ = f"stream_{role}"
            return stream
        app.websocket(path)(route())
