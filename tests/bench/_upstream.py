"""The benchmarks' upstream: a raw asyncio HTTP/1.1 server that answers OpenAI's chat/completions with a
fixed body (with `usage`), or with `"stream": true` a few SSE chunks then `data: [DONE]`, on kept-alive connections.

Why not the sim engine: the upstream must never be what limits a gateway benchmark. This is the
"raw asyncio pass-through" floor of docs/performance.md: one header scan, no framework. Valid HTTP/1.1
all the same (content-length or chunked answers, keep-alive, `connection: close`, pipelining).

Run: `python tests/bench/_upstream.py [--port 0] [--chunks 4] [--gap-ms 1]`: prints `READY http://host:port`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import time
from functools import lru_cache

CHAT = "/v1/chat/completions"
_REPLY = "The gateway is fast today."


@lru_cache(maxsize=64)  # the same bytes for each model: the upstream must cost as little as it can
def completion_body(model: str) -> bytes:
    """The non-streamed answer: fixed text and `usage`, as llama.cpp and OpenAI answer."""
    return json.dumps({
        "id": "chatcmpl-bench", "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": _REPLY}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 6, "total_tokens": 18},
    }, separators=(",", ":")).encode()


def stream_events(model: str, chunks: int, include_usage: bool) -> list[bytes]:
    """The SSE events of a streamed answer, each `data: {...}\\n\\n`, the last `data: [DONE]`."""
    words = _REPLY.split(" ")
    base = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": int(time.time()), "model": model}
    events = []
    for i in range(chunks):
        delta = {"role": "assistant", "content": ""} if i == 0 else {"content": words[(i - 1) % len(words)] + " "}
        done = i == chunks - 1
        choice = {"index": 0, "delta": {} if done else delta, "finish_reason": "stop" if done else None}
        events.append({**base, "choices": [choice]})
    if include_usage:
        events.append({**base, "choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": chunks,
                                                        "total_tokens": 12 + chunks}})
    return [b"data: " + json.dumps(e, separators=(",", ":")).encode() + b"\n\n" for e in events] + [b"data: [DONE]\n\n"]


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class Upstream(asyncio.Protocol):
    """One connection: parses requests out of the bytes as they come and answers each in order."""

    def __init__(self, chunks: int, gap_s: float) -> None:
        self.chunks, self.gap_s = chunks, gap_s
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.busy = False  # a streamed answer is being written: later (pipelined) requests wait for it

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if TRACE is not None and not self.buf:
            TRACE.append((time.perf_counter_ns(), "in"))  # a request's first bytes (`--trace`)
        self.buf += data
        if not self.busy:
            self._serve()

    def _serve(self) -> None:
        while self.transport is not None and not self.busy:
            request = self._take()
            if request is None:
                return
            method, path, headers, body = request
            close = headers.get(b"connection", b"").lower() == b"close"
            if method == b"POST" and path.split(b"?")[0] in (CHAT.encode(), b"/chat/completions"):
                self._chat(body, close)
            elif method == b"GET" and path.split(b"?")[0] in (b"/v1/models", b"/health"):
                self._send(200, json.dumps({"object": "list", "data": [{"id": "bench", "object": "model"}]}).encode(),
                           close)
            else:
                self._send(404, b'{"error":{"message":"not found","type":"invalid_request_error"}}', close)

    def _take(self) -> tuple[bytes, bytes, dict[bytes, bytes], bytes] | None:
        """The next whole request from the buffer, or None until more bytes come."""
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return None
        lines = self.buf[:end].split(b"\r\n")
        try:
            method, path, _version = lines[0].split(b" ", 2)
        except ValueError:
            self._send(400, b'{"error":{"message":"bad request line"}}', True)
            return None
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        start = end + 4
        if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
            body, used = _dechunk(self.buf, start)
            if body is None:
                return None
            self.buf = self.buf[used:]
        else:
            length = int(headers.get(b"content-length", b"0"))
            if len(self.buf) < start + length:
                return None
            body, self.buf = self.buf[start:start + length], self.buf[start + length:]
        return method, path, headers, body

    def _send(self, status: int, body: bytes, close: bool, content_type: bytes = b"application/json") -> None:
        assert self.transport is not None
        reason = {200: b"OK", 400: b"Bad Request", 404: b"Not Found"}.get(status, b"Error")
        head = (b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n%s\r\n"
                % (status, reason, content_type, len(body), b"connection: close\r\n" if close else b""))
        if TRACE is not None:
            TRACE.append((time.perf_counter_ns(), "out"))
        self.transport.write(head + body)
        if close:
            self.transport.close()
            self.transport = None

    def _chat(self, body: bytes, close: bool) -> None:
        try:
            doc = json.loads(body)
            model = str(doc.get("model", "bench"))
        except (ValueError, AttributeError):
            self._send(400, b'{"error":{"message":"body is not a JSON object","type":"invalid_request_error"}}', close)
            return
        if doc.get("stream") is True:
            usage = bool((doc.get("stream_options") or {}).get("include_usage"))
            self.busy = True
            asyncio.get_running_loop().create_task(self._stream(stream_events(model, self.chunks, usage), close))
        else:
            self._send(200, completion_body(model), close)

    async def _stream(self, events: list[bytes], close: bool) -> None:
        transport = self.transport
        assert transport is not None
        if TRACE is not None:
            TRACE.append((time.perf_counter_ns(), "out"))  # the answer's first bytes (`--trace`)
        transport.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
                        b"transfer-encoding: chunked\r\n%s\r\n" % (b"connection: close\r\n" if close else b"")
                        + _chunk(events[0]))
        for event in events[1:]:
            # A gap between chunks: a proxy that buffers shows it in its time to first chunk.
            await asyncio.sleep(self.gap_s)
            if transport.is_closing():
                return
            transport.write(_chunk(event))
        transport.write(b"0\r\n\r\n")
        self.busy = False
        if close:
            transport.close()
            self.transport = None
        else:
            self._serve()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


def _dechunk(buf: bytes, at: int) -> tuple[bytes | None, int]:
    """A chunked body from `buf[at:]` and where it ends, or (None, 0) while it is incomplete."""
    body = bytearray()
    while True:
        eol = buf.find(b"\r\n", at)
        if eol < 0:
            return None, 0
        size = int(buf[at:eol].split(b";")[0], 16)
        if size == 0:
            end = buf.find(b"\r\n\r\n", eol)  # no trailers expected: the empty line after "0"
            return (bytes(body), end + 4) if end >= 0 else (None, 0)
        if len(buf) < eol + 2 + size + 2:
            return None, 0
        body += buf[eol + 2:eol + 2 + size]
        at = eol + 2 + size + 2


async def serve(host: str, port: int, chunks: int = 4, gap_s: float = 0.001) -> asyncio.Server:
    loop = asyncio.get_running_loop()
    return await loop.create_server(lambda: Upstream(chunks, gap_s), host, port, backlog=1024)


# `--trace FILE`: when each request's first bytes came and its answer's first bytes left (perf_counter_ns, the
# clock every process shares), written to FILE as JSON on SIGUSR2; SIGUSR1 starts afresh (gateway_hops.py).
TRACE: list[tuple[int, str]] | None = None


def _trace_to(out: str) -> None:
    global TRACE
    TRACE = []
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, lambda: TRACE.clear() if TRACE is not None else None)

    def dump() -> None:
        with open(out + ".tmp", "w") as f:
            json.dump(TRACE, f)
        os.replace(out + ".tmp", out)

    loop.add_signal_handler(signal.SIGUSR2, dump)


async def _main(opts: argparse.Namespace) -> None:
    if opts.trace:
        _trace_to(opts.trace)
    server = await serve(opts.host, opts.port, opts.chunks, opts.gap_ms / 1000)
    host, port = server.sockets[0].getsockname()[:2]
    print(f"READY http://{host}:{port}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--chunks", type=int, default=4, help="SSE chunks per streamed answer (then [DONE])")
    parser.add_argument("--gap-ms", type=float, default=1.0, help="pause between two streamed chunks")
    parser.add_argument("--trace", help="keep when each request came and its answer left; SIGUSR2 writes them here")
    asyncio.run(_main(parser.parse_args()))
