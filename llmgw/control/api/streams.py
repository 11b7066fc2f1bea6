"""The streams' WebSocket routes: agents (`protocol.STREAM_PATH`) and remote gateways
(`protocol.GATEWAY_STREAM_PATH`) open one each to the leader; each is authenticated here, once, by
`authenticate`, then run by its session (control/agent_stream.py, control/gateway_stream.py)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from quart import Response, websocket
from quart_trio import QuartTrio

from llmgw.control import agent_stream, gateway_stream
from llmgw.control.context import Context
from llmgw.domain.keys import hash_key
from llmgw.errors import AdminError
from llmgw.wire import protocol


def authenticate(ctx: Context, headers: Any) -> AdminError | None:
    """The one check for a stream to control (agents and gateways): an admin key for now;
    per-role credentials come later. None: admitted."""
    scheme, _, key = headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not key:
        return AdminError(401, "unauthorized", "send the admin key as 'Authorization: Bearer <key>'")
    if ctx.state().key_role(hash_key(key.strip())) != "admin":
        return AdminError(401, "unauthorized", "this key is not an admin key of this cluster")
    return None


async def _send(text: str) -> None:
    await websocket.send(text)


async def _agent(ctx: Context) -> None:
    await agent_stream.session(websocket.receive, _send, ctx.hub, is_leader=ctx.store.is_leader,
                               leader_info=ctx.store_status, self_id=ctx.self_id)


async def _gateway(ctx: Context) -> None:
    remote = websocket.remote_addr
    await gateway_stream.session(ctx, websocket.receive, _send, str(remote) if remote else "")


STREAMS: dict[str, Callable[[Context], Awaitable[None]]] = {
    protocol.STREAM_PATH: _agent,
    protocol.GATEWAY_STREAM_PATH: _gateway,
}


def register(app: QuartTrio, ctx: Context) -> None:
    """Add each stream's route: refused (401, in the admin error shape) before the upgrade, or accepted
    and run until it ends."""
    for path, run in STREAMS.items():
        def route(run: Callable[[Context], Awaitable[None]] = run) -> Callable[[], Awaitable[Any]]:
            async def stream() -> Any:
                refusal = authenticate(ctx, websocket.headers)
                if refusal is not None:
                    return Response(json.dumps(refusal.doc()), status=refusal.status,
                                    content_type="application/json")
                await websocket.accept()
                await run(ctx)
                return None
            stream.__name__ = f"stream_{run.__name__.strip('_')}"
            return stream
        app.websocket(path)(route())
