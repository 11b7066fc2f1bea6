"""The gateway's work per request does not grow with the number of models, keys and replicas (issue 9, point 10):
counted, not timed. One request through the whole gateway (lean front end, key check, checks, router, upstream
pool) against a table of 10 models, keys and replicas, then of 10,000 of each: the Python lines the gateway
runs for it (sys.settrace, llmgw's own modules but the engine's) and every walk over the table's models, keys
and settings (their mappings count iteration, which catches a scan done in C: `sorted`, `dict(...)`, `any`)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from types import FrameType, MappingProxyType
from typing import Any

import httpx
import pytest
import trio

import llmgw
from llmgw.domain.keys import hash_key
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import Endpoint, ModelRoute
from llmgw.domain.state import ApiKey, ClusterState
from llmgw.engines import sim
from llmgw.gateway.app import GatewayDeps, serve
from llmgw.gateway.router import Router

KEY = "sk-hot-path-client"
PACKAGE = Path(llmgw.__file__).parent
NOT_THE_GATEWAYS = (str(PACKAGE / "engines"), str(PACKAGE / "testing"))  # the sim engine serves in this process
TRIES = 5  # per size; the fewest lines of them (a background writer's wake-up may fall into one)


class Walked(dict[str, Any]):
    """A dict that counts the walks over it (lookups by key are free); under the state's MappingProxyType."""

    walks = 0

    def __iter__(self) -> Iterator[str]:
        Walked.walks += 1
        return super().__iter__()

    def keys(self) -> Any:
        Walked.walks += 1
        return super().keys()

    def values(self) -> Any:
        Walked.walks += 1
        return super().values()

    def items(self) -> Any:
        Walked.walks += 1
        return super().items()

    def copy(self) -> dict[str, Any]:
        Walked.walks += 1
        return dict(super().items())


class FixedState:
    """The StateReader seam: one table that never changes."""

    def __init__(self, state: ClusterState) -> None:
        self._state = state

    def snapshot(self) -> ClusterState:
        return self._state

    async def wait_changed(self, revision: int) -> ClusterState:
        await trio.sleep_forever()
        raise AssertionError("unreachable")


def table(n: int, demo_url: str) -> tuple[ClusterState, dict[str, ModelRoute]]:
    """`n` models (the requested one among them), `n` client keys (ours the last), `n` ready replicas."""
    models = {f"m{i:05d}": ModelDef.from_doc({"name": f"m{i:05d}", "engine": "sim", "source": f"sim://m{i}"})
              for i in range(n - 1)}
    models["demo"] = ModelDef.from_doc({"name": "demo", "engine": "sim", "source": "sim://demo"})
    keys = {hash_key(f"sk-other-{i}"): ApiKey(hash_key(f"sk-other-{i}"), f"k{i}", "client", 0.0, f"key_{i:05d}")
            for i in range(n - 1)}
    keys[hash_key(KEY)] = ApiKey(hash_key(KEY), "ours", "client", 0.0, "key_ours")
    routes = {name: ModelRoute(name, "chat", "ready", (Endpoint(f"{name}-r1", f"http://127.0.0.1:9/{name}"),))
              for name in models if name != "demo"}
    routes["demo"] = ModelRoute("demo", "chat", "ready", (Endpoint("demo-r1", demo_url),))
    state = ClusterState(revision=1, models=MappingProxyType(Walked(models)), keys=MappingProxyType(Walked(keys)),
                         settings=MappingProxyType(Walked()))
    return state, routes


def lines_run(counts: dict[str, int]) -> Any:
    """A sys.settrace function counting the lines run in the gateway's modules into `counts["lines"]`."""
    def local(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            counts["lines"] += 1
        return local

    def call(frame: FrameType, event: str, arg: Any) -> Any:
        name = frame.f_code.co_filename
        if name.startswith(str(PACKAGE)) and not name.startswith(NOT_THE_GATEWAYS):
            return local
        return None

    return call


async def work_per_request(n: int, nursery: trio.Nursery) -> tuple[int, int]:
    """(fewest lines run, walks over the table) for one chat request at table size `n`."""
    url = await nursery.start(partial(sim.serve, sim.SimOptions("127.0.0.1", 0, "demo", "chat", 0)))
    state, routes = table(n, url)
    router = Router()
    router.update_routes(routes)
    host, port = await nursery.start(partial(serve, "127.0.0.1", 0, GatewayDeps(router=router,
                                                                                state=FixedState(state))))
    body = {"model": "demo", "messages": [{"role": "user", "content": "hello there"}]}
    fewest, walks = sys.maxsize, 0
    async with httpx.AsyncClient(base_url=f"http://{host}:{port}", headers={"authorization": f"Bearer {KEY}"}) as http:
        for attempt in range(TRIES + 1):
            counts = {"lines": 0}
            Walked.walks = 0
            sys.settrace(lines_run(counts))
            try:
                response = await http.post("/v1/chat/completions", json=body)
            finally:
                sys.settrace(None)
            assert response.status_code == 200, response.text
            if attempt:  # the first: a new connection both ways, and first-time caches
                fewest = min(fewest, counts["lines"])
                walks += Walked.walks
    return fewest, walks


async def test_the_work_of_a_request_is_the_same_with_10_or_10000_models_keys_and_replicas() -> None:
    figures = {}
    for n in (10, 10_000):
        async with trio.open_nursery() as nursery:
            figures[n] = await work_per_request(n, nursery)
            nursery.cancel_scope.cancel()
    (small_lines, small_walks), (large_lines, large_walks) = figures[10], figures[10_000]
    assert small_walks == large_walks == 0, f"a walk over the table's models, keys or settings per request: {figures}"
    assert small_lines > 100, figures  # the trace saw the gateway at work
    # A scan of the larger table would run at least 10,000 more lines; a few dozen is noise (a read split in two).
    assert large_lines <= small_lines + 50, f"lines run per request, 10 vs 10,000 of each: {figures}"


class Spawned(trio.abc.Instrument):
    """Counts the tasks trio starts (a per-request task costs more than the rest of a request's own work)."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        self.names.append(task.name)


async def streaming_upstream(nursery: trio.Nursery, words: int = 1) -> str:
    """A raw engine that answers every request on a connection with a short SSE stream (`words` events of content,
    then `[DONE]`), each event an HTTP chunk of its own and the whole answer one write; no task per request."""
    events = [b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"demo","choices":[{"index":0,'
              b'"delta":{"content":"hi"},"finish_reason":null}]}\n\n'] * words + [b"data: [DONE]\n\n"]

    async def answer(stream: trio.SocketStream) -> None:
        buffer = b""
        while True:
            while b"\r\n\r\n" not in buffer:
                if not (data := await stream.receive_some(65536)):
                    return
                buffer += data
            head, _, buffer = buffer.partition(b"\r\n\r\n")
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:")))
            while len(buffer) < length:
                buffer += await stream.receive_some(65536)
            buffer = buffer[length:]
            await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked"
                                  b"\r\n\r\n" + b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n")

    listeners = await nursery.start(partial(trio.serve_tcp, answer, 0, host="127.0.0.1"))
    host, port = listeners[0].socket.getsockname()[:2]
    return f"http://{host}:{port}"


async def test_a_streamed_request_on_a_kept_alive_connection_starts_no_task(nursery: trio.Nursery) -> None:
    # The client going away is watched by a task of the connection's (llmgw/wire/front.py), not one started and
    # cancelled per request: that cost the first chunk of a stream more than the rest of the gateway's own work
    # on it (docs/performance.md, "The stream's first chunk").
    state, routes = table(10, await streaming_upstream(nursery))
    router = Router()
    router.update_routes(routes)
    host, port = await nursery.start(partial(serve, "127.0.0.1", 0, GatewayDeps(router=router,
                                                                                state=FixedState(state))))
    body = {"model": "demo", "messages": [{"role": "user", "content": "hello there"}], "stream": True}
    spawned = Spawned()
    async with httpx.AsyncClient(base_url=f"http://{host}:{port}", headers={"authorization": f"Bearer {KEY}"}) as http:
        for attempt in range(4):
            if attempt == 2:  # the first two: new connections both ways, and the connection's own watcher
                trio.lowlevel.add_instrument(spawned)
            response = await http.post("/v1/chat/completions", json=body)
            assert response.status_code == 200, response.text
            assert response.text.endswith("data: [DONE]\n\n")
        trio.lowlevel.remove_instrument(spawned)
    assert spawned.names == [], f"tasks started for two streamed requests on kept-alive connections: {spawned.names}"


async def streamed_raw(host: str, port: int, path: str, body: dict[str, Any]) -> tuple[bytes, list[bytes]]:
    """One streamed request over a raw connection: the answer's head and its chunked body's frames, as the gateway
    wrote them."""
    data = json.dumps(body).encode()
    client = await trio.open_tcp_stream(host, port)
    async with client:
        await client.send_all(f"POST {path} HTTP/1.1\r\nhost: {host}\r\nauthorization: Bearer {KEY}"
                              f"\r\ncontent-length: {len(data)}\r\n\r\n".encode() + data)
        received = b""
        with trio.fail_after(10):  # a bound on a hang, not a measurement
            while not received.endswith(b"\r\n0\r\n\r\n"):
                received += await client.receive_some(65536)
    head, _, rest = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and b"transfer-encoding: chunked" in head.lower(), head
    frames: list[bytes] = []
    while True:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if not size:
            return head, frames
        frames.append(rest[:size])
        rest = rest[size + 2:]


async def test_events_that_arrive_together_leave_in_one_write(nursery: trio.Nursery) -> None:
    # An engine's events that one read brings in (the gateway was behind: it is busy) go on to the client in one
    # write, not one write, one cancel scope and one HTTP chunk each: a busy gateway catches up instead of falling
    # further behind (docs/performance.md, "Streams under load").
    words = 20
    state, routes = table(10, await streaming_upstream(nursery, words))
    router = Router()
    router.update_routes(routes)
    host, port = await nursery.start(partial(serve, "127.0.0.1", 0, GatewayDeps(router=router,
                                                                                state=FixedState(state))))
    _, frames = await streamed_raw(host, port, "/v1/chat/completions",
                                   {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "stream": True})
    assert b"".join(frames).count(b'"content":"hi"') == words and b"".join(frames).endswith(b"data: [DONE]\n\n")
    # One write for the one read; two if the gateway's read split the engine's write (a single write of a few KiB
    # on loopback arrives whole). One per event, 21, before.
    assert len(frames) <= 2, f"{len(frames)} chunks for {words + 1} events that came in one write"
    # Another API's stream made from them (gateway/dialect.py) has every word, whatever reads they came in.
    _, frames = await streamed_raw(host, port, "/v1/messages", {"model": "demo", "max_tokens": 64, "stream": True,
                                                                "messages": [{"role": "user", "content": "hi"}]})
    said = b"".join(frames)
    assert said.count(b'"text_delta"') == words and said.count(b"event: message_stop") == 1, said[:600]


@pytest.mark.parametrize(("path", "said"), [("/v1/chat/completions", b'"content":"hi"'),
                                            ("/v1/messages", b'"text":"hi"')])  # (translated: gateway/dialect.py)
async def test_a_streams_last_bytes_and_its_end_leave_in_one_write(nursery: trio.Nursery,
                                                                   monkeypatch: pytest.MonkeyPatch, path: str,
                                                                   said: bytes) -> None:
    # The engine's last events and the end of its answer come in one read: the gateway writes them with the end of
    # its own answer, in one write, not the events and then the end on their own (on the project's VM a write that
    # wakes the client costs the writer 0.2-0.3 ms, and a client that sends its next request once the answer ends
    # waited for the second; docs/performance.md, "The stream's first chunk").
    event = (b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"demo","choices":[{"index":0,'
             b'"delta":{"content":"hi"},"finish_reason":null}]}\n\n')
    rest_asked = trio.Event()  # set by the client once it has the first event: the engine sends the rest

    async def engine(stream: trio.SocketStream) -> None:
        data = b""
        while b"\r\n\r\n" not in data or not data.endswith(b"}"):  # (the request's JSON body ends with a brace)
            data += await stream.receive_some(65536)
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked"
                              b"\r\n\r\n%x\r\n%s\r\n" % (len(event), event))
        await rest_asked.wait()
        rest = [event, event, b"data: [DONE]\n\n"]
        await stream.send_all(b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in rest) + b"0\r\n\r\n")
        await trio.sleep_forever()

    listeners = await nursery.start(partial(trio.serve_tcp, engine, 0, host="127.0.0.1"))
    state, routes = table(10, "http://127.0.0.1:%d" % listeners[0].socket.getsockname()[1])
    router = Router()
    router.update_routes(routes)
    host, port = await nursery.start(partial(serve, "127.0.0.1", 0, GatewayDeps(router=router,
                                                                                state=FixedState(state))))
    writes: list[bytes] = []  # what the gateway wrote to its client, write by write
    send_all = trio.SocketStream.send_all

    async def counted(self: trio.SocketStream, data: bytes | bytearray | memoryview) -> None:
        if self.socket.getsockname()[1] == port:
            writes.append(bytes(data))
        await send_all(self, data)

    monkeypatch.setattr(trio.SocketStream, "send_all", counted)
    body = json.dumps({"model": "demo", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}],
                       "stream": True}).encode()
    client = await trio.open_tcp_stream(host, port)
    async with client:
        await client.send_all(b"POST %s HTTP/1.1\r\nhost: x\r\nauthorization: Bearer %s\r\n"
                              b"content-length: %d\r\n\r\n%s" % (path.encode(), KEY.encode(), len(body), body))
        received = b""
        with trio.fail_after(10):  # a bound on a hang, not a measurement
            while said not in received:
                received += await client.receive_some(65536)
            rest_asked.set()
            while not received.endswith(b"\r\n0\r\n\r\n"):
                received += await client.receive_some(65536)
    assert received.count(said) == 3
    # The head with the first event, then the rest with the end: two writes (three before, four translated: the
    # end, and a translated stream's closing events, went alone).
    assert len(writes) == 2, writes
    assert writes[1].endswith(b"\r\n0\r\n\r\n") and writes[1].count(said) == 2
    assert (b"data: [DONE]\n\n" if path == "/v1/chat/completions" else b"event: message_stop") in writes[1]
