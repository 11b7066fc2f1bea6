"""The gateway's own time on a streamed request's way to its first chunk, from inside its process.

`tests/bench/gateway.py --path-samples N` runs one more gateway child with `record` on: every read and write of
its trio sockets is timestamped (each socket named by its two ports), kept in memory, and written out as JSON
on SIGUSR2 (SIGUSR1 starts afresh). `own_time` reads those events back: for each request, from its bytes read
on the client's connection to the engine's request written (the request's half), and from the engine's first
bytes read to the client's first write (the answer's half). What the client measures (TTFC) adds to those the
loopback hops and the wake-ups of three processes; these two are what the gateway's code costs, free of them.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import time
from dataclasses import dataclass
from typing import Any


def record(out: str) -> None:
    """Timestamp every trio socket read and write of this process from now on (bench children only: it wraps
    trio's socket class)."""
    import trio._socket as trio_socket  # the wrapped methods are what every trio SocketStream calls

    events: list[tuple[int, str, int, int, int]] = []  # (ns, "recv" | "send", local port, peer port, bytes)
    # id(socket) -> (the socket, its two ports): the socket held, so that its id is never another's
    ports: dict[int, tuple[Any, int, int]] = {}
    clock = time.perf_counter_ns
    recv, send = trio_socket._SocketType.recv, trio_socket._SocketType.send

    def named(sock: Any) -> tuple[int, int]:
        found = ports.get(id(sock))
        if found is None:
            try:
                found = ports[id(sock)] = (sock, sock.getsockname()[1], sock.getpeername()[1])
            except OSError:
                return (0, 0)
        return found[1], found[2]

    async def timed_recv(self: Any, *args: Any, **kwargs: Any) -> Any:
        data = await recv(self, *args, **kwargs)
        events.append((clock(), "recv", *named(self), len(data)))
        return data

    async def timed_send(self: Any, data: Any, *args: Any, **kwargs: Any) -> Any:
        events.append((clock(), "send", *named(self), len(data)))
        return await send(self, data, *args, **kwargs)

    def dump(*_: object) -> None:
        with open(out + ".tmp", "w") as f:
            json.dump(events, f)
        os.replace(out + ".tmp", out)

    trio_socket._SocketType.recv, trio_socket._SocketType.send = timed_recv, timed_send  # type: ignore[method-assign]
    signal.signal(signal.SIGUSR1, lambda *_: events.clear())
    signal.signal(signal.SIGUSR2, dump)


@dataclass(frozen=True)
class OwnTime:
    requests: int  # streamed requests seen whole (their four events in order)
    request_us: float  # p50: the request's bytes read -> the engine's request written
    answer_us: float  # p50: the engine's first bytes read -> the client's first write
    total_us: float  # p50 of the two together, per request


def own_time(events: list[list[Any]], gateway_port: int, upstream_port: int) -> OwnTime:
    """The two halves per request, from `record`'s events (see `request_times`)."""
    times = request_times(events, gateway_port, upstream_port)
    if not times:
        raise ValueError("no whole request in the gateway's socket events")
    requests = [(sent - came) / 1000 for came, sent, _, _ in times]
    answers = [(first - answered) / 1000 for _, _, answered, first in times]
    totals = [r + a for r, a in zip(requests, answers)]
    return OwnTime(len(totals), statistics.median(requests), statistics.median(answers), statistics.median(totals))


def request_times(events: list[list[Any]], gateway_port: int, upstream_port: int) -> list[tuple[int, int, int, int]]:
    """Each streamed request's four moments (ns), in order, from `record`'s events: its bytes read on a connection
    to the gateway's port (`gateway_port` local) while none is under way, the engine's request written (a
    connection to `upstream_port`), the engine's first bytes read, and the client's first write."""
    out: list[tuple[int, int, int, int]] = []
    at: dict[str, int] = {}
    for ns, op, local, peer, size in events:
        client, engine = local == gateway_port, peer == upstream_port
        if not at:
            if client and op == "recv" and size:
                at["request"] = ns
        elif "sent" not in at:
            if engine and op == "send":
                at["sent"] = ns
        elif "answered" not in at:
            if engine and op == "recv" and size:
                at["answered"] = ns
        elif client and op == "send":
            out.append((at["request"], at["sent"], at["answered"], ns))
            at = {}
    return out
