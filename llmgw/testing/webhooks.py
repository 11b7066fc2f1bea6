"""A webhook endpoint on loopback for tests: real HTTP/1.1 over TCP, each POST's JSON recorded, and per path
an answer (a status) or none at all (`HANG`: the endpoint that never answers). Runs in the test's own trio
loop (`serve`), so MockClock jumps only when it truly waits; or in a thread of its own (`in_thread`) for tests
of processes.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import trio

HANG = -1  # a path answered with this never answers (the connection stays open)
HEAD_MAX = 64 * 1024


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class WebhookReceiver:
    """`answers[path]`: the status that path answers (default `status`), or HANG."""

    status: int = 200
    answers: dict[str, int] = field(default_factory=dict)
    received: list[Received] = field(default_factory=list)
    attempts: list[tuple[str, float]] = field(default_factory=list)  # (path, trio time) of every request seen
    url: str = ""
    _changed: trio.Event = field(default_factory=trio.Event)

    async def serve(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen on 127.0.0.1 (a free port) until cancelled; started with the base URL."""
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        task_status.started(self.url)
        await trio.serve_listeners(self._handle, listeners)

    async def wait_for(self, count: int, path: str | None = None) -> list[Received]:
        """Until `count` POSTs (to `path`, or any) were received; those."""
        while True:
            got = [r for r in self.received if path is None or r.path == path]
            if len(got) >= count:
                return got
            self._changed = trio.Event() if self._changed.is_set() else self._changed
            await self._changed.wait()

    def events(self, path: str | None = None) -> list[Any]:
        return [r.json() for r in self.received if path is None or r.path == path]

    async def _handle(self, stream: trio.SocketStream) -> None:
        buffer = b""
        try:
            while True:
                while b"\r\n\r\n" not in buffer:
                    chunk = await stream.receive_some(65536)
                    if not chunk or len(buffer) > HEAD_MAX:
                        return
                    buffer += chunk
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                path = lines[0].split(" ")[1] if len(lines[0].split(" ")) > 1 else "/"
                headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
                length = int(headers.get("content-length", "0"))
                while len(buffer) < length:
                    chunk = await stream.receive_some(65536)
                    if not chunk:
                        return
                    buffer += chunk
                body, buffer = buffer[:length], buffer[length:]
                self.attempts.append((path, trio.current_time()))
                answer = self.answers.get(path, self.status)
                if answer == HANG:
                    await trio.sleep_forever()
                if 200 <= answer < 300:
                    self.received.append(Received(path, headers, body))
                self._changed.set()
                await stream.send_all(f"HTTP/1.1 {answer} X\r\ncontent-length: 0\r\n\r\n".encode())
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return


@contextmanager
def in_thread(receiver: WebhookReceiver | None = None) -> Iterator[WebhookReceiver]:
    """The receiver served from a thread of its own (its own trio loop) while the block runs; read
    `received` from the test's thread (appends are atomic)."""
    receiver = receiver or WebhookReceiver()
    ready = threading.Event()
    stop = threading.Event()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(receiver.serve)
            ready.set()
            await trio.to_thread.run_sync(stop.wait, abandon_on_cancel=True)
            nursery.cancel_scope.cancel()

    thread = threading.Thread(target=trio.run, args=(main,), daemon=True, name="webhook-receiver")
    thread.start()
    ready.wait()
    try:
        yield receiver
    finally:
        stop.set()
        thread.join()
