"""Streaming relays with no buffer of its own (issue 9, point 2): a client that stops reading stops the gateway
reading its engine, so what the engine gets to write is bounded by the sockets' buffers, not by the answer's
length. Before the lean relay, chunks went through an unbounded channel: a slow client let the gateway read (and
hold) the whole answer. Real sockets on loopback; an engine that streams 192 MiB as fast as it may."""

from __future__ import annotations

import json
import socket
from functools import partial

import trio
import trio.testing

from llmgw.domain import commands
from llmgw.domain.keys import hash_key
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import Endpoint, ModelRoute
from llmgw.gateway.app import GatewayDeps, serve
from llmgw.gateway.router import Router
from llmgw.testing import MemoryStore
from llmgw.testing.scripted_engine import Reply, Request, ScriptedEngine
from llmgw.testing.scripted_engine import serving as scripted

KEY = "sk-backpressure-client"
FRAME = b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": "x" * 65000}}]}).encode() + b"\n\n"
ANSWER_BYTES = 192 * 1024 * 1024
# Four socket buffers lie between the engine and a client that reads nothing (the engine's send buffer, the
# gateway's receive and send buffers, the client's receive buffer): on Linux at most 32 + 4 + 4 MiB plus the
# client's, set small below. Half the answer is far above that, and far below what a buffering relay reads.
BOUND = ANSWER_BYTES // 2


async def test_a_client_that_stops_reading_stops_the_gateway_reading_its_engine(nursery: trio.Nursery) -> None:
    written = 0

    async def endless(request: Request, reply: Reply) -> None:
        nonlocal written
        await reply.start()
        while written < ANSWER_BYTES:
            await reply.chunk(FRAME)
            written += len(FRAME)
        await reply.end()

    engine = ScriptedEngine(endless)
    store = MemoryStore()
    store.submit_nowait(commands.put_model(ModelDef.from_doc({"name": "demo", "engine": "sim",
                                                               "source": "sim://demo"}), at=0.0))
    store.submit_nowait(commands.add_key(hash_key(KEY), "test", "client", 0.0))
    router = Router()
    router.update_routes({"demo": ModelRoute("demo", "chat", "ready",
                                             (Endpoint("demo-r1", await scripted(nursery, engine)),))})
    host, port = await nursery.start(partial(serve, "127.0.0.1", 0, GatewayDeps(router=router, state=store)))

    client = trio.socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)  # before connecting: no autotuning
    await client.connect((host, port))
    stream = trio.SocketStream(client)
    body = json.dumps({"model": "demo", "messages": [{"role": "user", "content": "hi"}], "stream": True}).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\nauthorization: Bearer {KEY}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n").encode()
    async with stream:
        await stream.send_all(head + body)
        received = b""
        with trio.fail_after(10):  # a bound on a hang, not a measurement
            while b"HTTP/1.1 200 " not in received or b"data: " not in received:
                received += await stream.receive_some(65536)
        # Then the client reads nothing more. Once every socket buffer on the way is full, every task here
        # waits: the engine on its write, the gateway on its write to the client.
        with trio.fail_after(30):
            await trio.testing.wait_all_tasks_blocked(cushion=0.2)
        assert 0 < written < BOUND, f"the engine wrote {written / 2**20:.0f} MiB to a client that reads nothing"
        stalled_at = written
    # The client goes away: the gateway hangs up on the engine, which writes no more.
    with trio.fail_after(10):
        await engine.hung_up.wait()
    assert written <= stalled_at + len(FRAME)
