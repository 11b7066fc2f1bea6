"""The sim engine's part in a multi-node replica: rank 0 waits for every member, members join it.
Owns the join protocol (one text line each way over TCP), the HTTP gate in front of the sim app, `GroupLost`.

It plays what a distributed runtime does, for real processes, so the control plane's ordering,
failure and stop logic is tested without GPUs. Rank 0 listens on the group's leader port; each
member dials it (again every `sim_group_join_retry_s` until it answers), says
`join RANK SIZE MODEL`, gets `ok` (or `refused WHY`) and holds the connection open. Rank 0 serves
HTTP only once every rank has joined; a member answers `/health` once joined and nothing else.
Either end seeing the connection close exits non-zero: a member whose leader is gone, or a
leader whose member left, so one dead process fails the whole group. (A silent host is not
noticed here: real runtimes have their own timeouts; the sim models processes that exit.)
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import trio

from llmgw.domain.timeouts import TIMEOUTS
from llmgw.errors import OpenAIError, first_error
from llmgw.wire.asgi import Receive, Scope, Send, dumps, send_json

__all__ = ["GROUP_LOST_STATUS", "GroupGate", "GroupLost", "GroupRole", "run_group"]

logger = logging.getLogger("llmgw.engine.sim")

GROUP_LOST_STATUS = 4  # the exit status of a sim whose group broke (a member left, the leader is gone)
_LINE_MAX = 512


class GroupLost(Exception):
    """The group cannot go on; the message is the reason the operator sees."""


@dataclass(frozen=True)
class GroupRole:
    rank: int
    size: int
    leader_host: str
    leader_port: int

    @property
    def leader(self) -> str:
        return f"[{self.leader_host}]:{self.leader_port}" if ":" in self.leader_host else \
            f"{self.leader_host}:{self.leader_port}"

    @classmethod
    def parse(cls, rank: int, size: int, leader: str) -> GroupRole:
        """From `--group-rank/--group-size/--group-leader`; ValueError says what is wrong."""
        if not 2 <= size <= 64:
            raise ValueError(f"--group-size must be 2..64, not {size}")
        if not 0 <= rank < size:
            raise ValueError(f"--group-rank must be 0..{size - 1}, not {rank}")
        host, _, port = leader.rpartition(":")
        host = host.removeprefix("[").removesuffix("]")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"--group-leader must be HOST:PORT, not {leader!r}")
        return cls(rank, size, host, int(port))


App = Callable[[Scope, Receive, Send], Awaitable[None]]


class GroupGate:
    """The HTTP face of a group member: 503 until the group is whole; then rank 0 serves the sim
    app, and a member answers `/health` only (members never get traffic)."""

    def __init__(self, app: App, role: GroupRole) -> None:
        self.app = app
        self.role = role
        self.joined: set[int] = set()
        self.whole = trio.Event()

    def join(self, rank: int) -> None:
        self.joined.add(rank)
        if self.role.rank != 0 or self.joined >= set(range(1, self.role.size)):
            self.whole.set()

    def waiting(self) -> str:
        if self.role.rank == 0:
            missing = [str(r) for r in range(1, self.role.size) if r not in self.joined]
            return f"waiting for ranks {', '.join(missing)} to join the group"
        return f"rank {self.role.rank} waiting to join its group leader at {self.role.leader}"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
        elif not self.whole.is_set():
            await _refuse(send, "group_waiting", self.waiting())
        elif self.role.rank != 0 and scope["path"] != "/health":
            words = f"rank {self.role.rank} of a multi-node replica serves no requests: its rank 0 does"
            await _refuse(send, "not_group_leader", words)
        else:
            await self.app(scope, receive, send)


async def _refuse(send: Send, code: str, message: str) -> None:
    await send_json(send, 503, dumps(OpenAIError(503, code, message).doc()))


ServeFn = Callable[..., Awaitable[None]]


async def run_group(role: GroupRole, model: str, app: App, serve: ServeFn, stop: trio.Event) -> int:
    """Play `role` and serve `app` behind its gate until `stop` (0) or the group breaks
    (GROUP_LOST_STATUS, the reason on stderr). `serve(app=..., shutdown_trigger=...)` runs HTTP."""
    gate = GroupGate(app, role)
    lost: BaseException | None = None
    try:
        async with trio.open_nursery() as nursery:
            if role.rank == 0:
                await nursery.start(_lead, role, model, gate)
            else:
                nursery.start_soon(_join, role, model, gate)
            await serve(app=gate, shutdown_trigger=stop.wait)
            nursery.cancel_scope.cancel()
    except* GroupLost as group:
        lost = first_error(group)
    if lost is None:
        return 0
    logger.error("%s", lost)
    print(f"llmgw sim: {lost}", file=sys.stderr, flush=True)
    return GROUP_LOST_STATUS


async def _lead(role: GroupRole, model: str, gate: GroupGate, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    try:
        listeners = await trio.open_tcp_listeners(role.leader_port, host=role.leader_host)
    except OSError as e:
        # Another process holds the port (a collision of two groups' ports): this group fails
        # and is placed again under a new id, most likely with another port.
        raise GroupLost(f"cannot listen for the group's members on {role.leader}: {e.strerror or e}") from None
    logger.info("rank 0 of %s waiting for %d members on %s", model, role.size - 1, role.leader)
    async with trio.open_nursery() as nursery:
        task_status.started()
        await trio.serve_listeners(partial(_member, role, model, gate), listeners, handler_nursery=nursery)


async def _member(role: GroupRole, model: str, gate: GroupGate, stream: trio.SocketStream) -> None:
    """One member's connection to rank 0: its join, then held until it closes."""
    async with stream:
        with trio.move_on_after(TIMEOUTS.sim_group_join_s):
            line = await _read_line(stream)
        if line is None:
            return  # not a member (a port scan, a health check): nothing joined, nothing lost
        parts = line.split()
        refusal = _join_refusal(parts, role, model, gate)
        if refusal:
            logger.warning("refused a join (%r): %s", line[:80], refusal)
            await _send_line(stream, f"refused {refusal}")
            return
        rank = int(parts[1])
        gate.join(rank)
        await _send_line(stream, "ok")
        logger.info("rank %d joined (%d of %d)", rank, len(gate.joined) + 1, role.size)
        await _until_closed(stream)
    raise GroupLost(f"rank {rank} left the group")


def _join_refusal(parts: list[str], role: GroupRole, model: str, gate: GroupGate) -> str:
    if len(parts) != 4 or parts[0] != "join" or not parts[1].isdigit() or not parts[2].isdigit():
        return "expected: join RANK SIZE MODEL"
    rank, size = int(parts[1]), int(parts[2])
    if parts[3] != model:
        return f"this group runs {model}, not {parts[3]}"
    if size != role.size:
        return f"this group has {role.size} ranks, not {size}"
    if not 1 <= rank < role.size:
        return f"rank {rank} is not a member rank (1..{role.size - 1})"
    if rank in gate.joined:
        return f"rank {rank} has already joined"
    return ""


async def _join(role: GroupRole, model: str, gate: GroupGate) -> None:
    """Dial rank 0 until it answers, join, and hold the connection."""
    while True:
        try:
            stream = await trio.open_tcp_stream(role.leader_host, role.leader_port)
            break
        except OSError:
            await trio.sleep(TIMEOUTS.sim_group_join_retry_s)
    async with stream:
        await _send_line(stream, f"join {role.rank} {role.size} {model}")
        answer = await _read_line(stream)
        if answer is None:
            raise GroupLost(f"the group leader at {role.leader} closed the connection without an answer")
        if answer != "ok":
            raise GroupLost(f"the group leader at {role.leader} {answer}")
        gate.join(0)
        logger.info("rank %d joined its group leader at %s", role.rank, role.leader)
        await _until_closed(stream)
    raise GroupLost(f"group leader gone ({role.leader} closed the connection)")


async def _send_line(stream: trio.SocketStream, text: str) -> None:
    try:
        await stream.send_all(text.encode() + b"\n")
    except trio.BrokenResourceError:
        pass  # the reader notices the closed connection


async def _read_line(stream: trio.SocketStream) -> str | None:
    """One line (without its newline), or None when the peer closed first or sent too much."""
    data = b""
    while b"\n" not in data:
        try:
            chunk = await stream.receive_some(_LINE_MAX)
        except trio.BrokenResourceError:
            return None
        if not chunk or len(data) + len(chunk) > _LINE_MAX:
            return None
        data += chunk
    return data.split(b"\n", 1)[0].decode(errors="replace").strip()


async def _until_closed(stream: trio.SocketStream) -> None:
    try:
        while await stream.receive_some(_LINE_MAX):
            pass
    except trio.BrokenResourceError:
        pass
