"""A mirror blob server on loopback for the fetch's tests, with faults on demand: each request takes the next
step of `script` ("ok" once it is empty): "ok", "drop:N" (the headers and N bytes, then the connection closed),
"corrupt" (one byte changed), "404", "503", "ignore-range" (200 with the whole file), "pause:N" (N bytes, then
wait for `resume` before the rest). Ranges are read as the control plane reads them (`parse_range`)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from llmgw.control.api.mirror_blobs import Unsatisfiable, parse_range
from llmgw.control.service import ControlHandle
from llmgw.domain import commands
from llmgw.mirror.blobs import BlobStore


@dataclass
class MirrorServer:
    data: bytes
    script: list[str] = field(default_factory=list)
    ranges: list[str | None] = field(default_factory=list)  # each request's Range header, in order
    paused: trio.Event = field(default_factory=trio.Event)  # set once a "pause" step sent its first bytes
    resume: trio.Event = field(default_factory=trio.Event)
    port: int = 0

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._serve, listeners)

    async def _serve(self, stream: trio.SocketStream) -> None:
        async with stream:
            head = b""
            while b"\r\n\r\n" not in head:
                got = await stream.receive_some(65536)
                if not got:
                    return
                head += got
            lines = head.split(b"\r\n\r\n")[0].decode().split("\r\n")
            headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
            asked = headers.get("range")
            self.ranges.append(asked)
            step = self.script.pop(0) if self.script else "ok"
            if step in ("404", "503"):
                await stream.send_all(f"HTTP/1.1 {step} No\r\nContent-Length: 2\r\nConnection: close\r\n\r\nno".encode())
                return
            data = bytearray(self.data)
            if step == "corrupt":
                data[len(data) // 2] ^= 0xFF
            try:
                span = parse_range(None if step == "ignore-range" else asked, len(data))
            except Unsatisfiable:
                await stream.send_all(f"HTTP/1.1 416 No\r\nContent-Range: bytes */{len(data)}\r\nContent-Length: 0"
                                      f"\r\nConnection: close\r\n\r\n".encode())
                return
            status = "206 Partial Content" if span.partial else "200 OK"
            extra = f"Content-Range: {span.content_range()}\r\n" if span.partial else ""
            body = bytes(data[span.start:span.end])
            await stream.send_all(f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n{extra}Connection: close"
                                  f"\r\n\r\n".encode())
            kind, _, n = step.partition(":")
            if kind == "drop":
                await stream.send_all(body[:int(n)])
                return
            if kind == "pause":
                await stream.send_all(body[:int(n)])
                self.paused.set()
                await self.resume.wait()
                body = body[int(n):]
            await stream.send_all(body)


async def place_in_mirror(control: ControlHandle, state_dir: Path, data: bytes, *names: str) -> str:
    """`data` in a control plane's mirror as a commit leaves it: named in the catalog and in its blob dir, under
    the mirror's lock (a pass that read the catalog before the names would collect a blob it does not know).
    Returns its sha256."""
    assert control.context is not None
    sha = hashlib.sha256(data).hexdigest()
    async with control.context.mirror_lock:
        for name in names:
            await control.store.submit(commands.put_file(name, sha, len(data), "gguf", {}, 0.0))
        blob = BlobStore(state_dir / "mirror").blob_path(sha)
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
    return sha
