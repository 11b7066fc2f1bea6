"""The benchmarks' measuring helpers outside wrk: streaming time to first chunk (a small h11 client on one
kept-alive connection), one checked request, and a process tree's CPU seconds from /proc.

The TTFC client is Python, so it adds its own cost to every sample; it adds the same to the direct and
the proxied run, and only their difference is reported.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

import h11


class Client:
    """One kept-alive HTTP/1.1 connection (h11: a strict parser, so a malformed answer fails loudly)."""

    def __init__(self, url: str, key: str, timeout_s: float = 30.0) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.key, self.timeout_s = key, timeout_s
        self.sock: socket.socket | None = None
        self.conn = h11.Connection(h11.CLIENT)

    def _connect(self) -> socket.socket:
        if self.sock is None or self.conn.our_state is h11.MUST_CLOSE:
            self.close()
            self.sock = socket.create_connection((self.host, self.port), timeout=self.timeout_s)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.conn = h11.Connection(h11.CLIENT)
        return self.sock

    def post(self, path: str, body: dict[str, object]) -> tuple[int, float, float, bytes]:
        """POST `body`: (status, ms to the first body bytes, ms to the end, the body)."""
        sock = self._connect()
        data = json.dumps(body).encode()
        headers = [("host", f"{self.host}:{self.port}"), ("content-type", "application/json"),
                   ("content-length", str(len(data))), ("authorization", f"Bearer {self.key}")]
        t0 = time.perf_counter()
        sock.sendall(self.conn.send(h11.Request(method="POST", target=path, headers=headers))
                     + self.conn.send(h11.Data(data=data)) + self.conn.send(h11.EndOfMessage()))
        status, first, chunks = 0, 0.0, list[bytes]()
        while True:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                self.conn.receive_data(sock.recv(65536))
                continue
            if isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                if not chunks:
                    first = time.perf_counter()
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                end = time.perf_counter()
                break
            elif isinstance(event, h11.ConnectionClosed):
                raise ConnectionError(f"{self.host}:{self.port} closed the connection mid-answer")
        if self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE:
            self.conn.start_next_cycle()
        return status, (first - t0) * 1000 if chunks else float("nan"), (end - t0) * 1000, b"".join(chunks)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def ttfc_samples(url: str, key: str, body: dict[str, object], n: int) -> list[float]:
    """`n` sequential streamed requests on one connection: ms from sending each to its first body bytes."""
    client = Client(url, key)
    try:
        out = []
        for _ in range(n):
            status, first, _end, answer = client.post(urlsplit(url).path, body)
            if status != 200 or not answer.rstrip().endswith(b"data: [DONE]"):
                raise RuntimeError(f"{url} answered {status} to a stream: {answer[:200]!r}")
            out.append(first)
        return out
    finally:
        client.close()


def check(url: str, key: str, body: dict[str, object]) -> dict[str, object]:
    """One request that must be answered 200 with a JSON object: the answer."""
    client = Client(url, key)
    try:
        status, _first, _end, answer = client.post(urlsplit(url).path, body)
    finally:
        client.close()
    if status != 200:
        raise RuntimeError(f"{url} answered {status}: {answer[:300]!r}")
    doc = json.loads(answer)
    if not isinstance(doc, dict):
        raise RuntimeError(f"{url} answered a non-object: {answer[:300]!r}")
    return doc


def _stat(pid: int | str) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def tree_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a process and all its descendants so far (Linux /proc; None elsewhere)."""
    fields = _stat(pid)
    if fields is None:
        return None
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (f := _stat(entry)) is not None:
            children.setdefault(int(f[1]), []).append(int(entry))
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        f = _stat(p)
        if f is not None:
            total += int(f[11]) + int(f[12])
        todo.extend(children.get(p, ()))
    return total / os.sysconf("SC_CLK_TCK")


def threads_cpu_s(pid: int) -> tuple[float, float] | None:
    """(main thread, whole process) CPU seconds: the rest is the worker threads (the request log's writer)."""
    main, whole = _stat(f"{pid}/task/{pid}"), _stat(pid)
    if main is None or whole is None:
        return None
    tick = os.sysconf("SC_CLK_TCK")
    return (int(main[11]) + int(main[12])) / tick, (int(whole[11]) + int(whole[12])) / tick
