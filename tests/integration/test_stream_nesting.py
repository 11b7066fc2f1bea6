"""A message nested 100,000 levels deep on a real control plane's streams (agents' and gateways'),
over loopback: answered with `rejected`, and the same stream goes on serving (it once escaped the
session as a RecursionError, "Exception on websocket", and closed the stream)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, AsyncIterator

import pytest
import trio
from trio_websocket import WebSocketConnection, open_websocket_url

from llmgw.control.service import ControlConfig, ControlHandle, Seed, serve
from llmgw.wire import protocol
from tests.support.processes import free_port

pytestmark = pytest.mark.slow

ADMIN = "sk-admin-nesting"
DEEP = "[" * 100_000


@pytest.fixture
async def control(tmp_path: Path) -> AsyncIterator[ControlHandle]:
    cfg = ControlConfig(state_dir=tmp_path, raft_addr=f"127.0.0.1:{free_port()}", admin_host="127.0.0.1",
                        admin_port=0, seed=Seed(admin_key=ADMIN))
    async with trio.open_nursery() as nursery:
        yield await nursery.start(serve, cfg)
        nursery.cancel_scope.cancel()


async def next_of(ws: WebSocketConnection, kind: str) -> dict[str, Any]:
    """The next message of type `kind` (heartbeats and tables may come first)."""
    with trio.fail_after(10):
        while True:
            message = protocol.loads(await ws.get_message())
            if message["type"] == kind:
                return message


def url(control: ControlHandle, path: str) -> str:
    return control.admin_url.replace("http://", "ws://") + path


def machine(control: ControlHandle, role: str, name: str) -> list[tuple[bytes, bytes]]:
    """The stream's header for a `role` machine `name` inside the control plane's process
    (`Context.local_credential`): a stream takes no key."""
    assert control.context is not None
    return [(b"authorization", f"Bearer {control.context.local_credential(role, name)}".encode())]


async def test_the_agent_stream_rejects_a_deep_message_and_goes_on(control: ControlHandle) -> None:
    async with open_websocket_url(url(control, protocol.STREAM_PATH),
                                  extra_headers=machine(control, "agent", "n1")) as ws:
        await ws.send_message(protocol.dumps({"type": "hello", "protocol": protocol.PROTOCOL_VERSION, "node": "n1",
                                              "version": "t"}))
        await ws.send_message(protocol.dumps({"type": "inventory", "inventory": {"cpus": 2}}))
        await next_of(ws, "welcome")
        await ws.send_message(DEEP)
        rejected = await next_of(ws, "rejected")
        assert rejected["reason"] == f"nested deeper than {protocol.MAX_NESTING} levels"
        await ws.send_message(protocol.dumps({"type": "inventory", "inventory": {"cpus": 16}}))
        with trio.fail_after(10):
            while control.hub.nodes["n1"].cpus != 16:  # served on the same stream
                await trio.sleep(0.01)


async def test_the_gateway_stream_rejects_a_deep_message_and_goes_on(control: ControlHandle) -> None:
    async with open_websocket_url(url(control, protocol.GATEWAY_STREAM_PATH),
                                  extra_headers=machine(control, "gateway", "gw1")) as ws:
        await ws.send_message(protocol.dumps({"type": "hello", "protocol": protocol.GATEWAY_PROTOCOL_VERSION,
                                              "gateway": "gw1", "version": "t"}))
        await next_of(ws, "welcome")
        await ws.send_message(DEEP)
        rejected = await next_of(ws, "rejected")
        assert rejected["reason"] == f"nested deeper than {protocol.MAX_NESTING} levels"
        await ws.send_message(protocol.dumps({"type": "usage", "boot": "b1", "seq": 1, "rows": []}))
        assert (await next_of(ws, "usage_ack"))["seq"] == 1, "served on the same stream"


async def test_a_deep_hello_is_refused_with_its_reason(control: ControlHandle) -> None:
    for path, role in ((protocol.STREAM_PATH, "agent"), (protocol.GATEWAY_STREAM_PATH, "gateway")):
        async with open_websocket_url(url(control, path), extra_headers=machine(control, role, "m1")) as ws:
            await ws.send_message(DEEP)
            refused = await next_of(ws, "refused")
            assert refused["reason"] == f"a bad hello: nested deeper than {protocol.MAX_NESTING} levels"
