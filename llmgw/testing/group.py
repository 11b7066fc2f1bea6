"""`FakeGroup`: a `MemoryStore` that is also a `RaftGroup` — one member of a group whose
leadership, peers and connections a test sets, and whose membership changes are recorded."""

from __future__ import annotations

from typing import Any

import trio

from llmgw.store import NotLeader
from llmgw.testing import MemoryStore


class FakeGroup(MemoryStore):
    """This member is `self_addr`; `leader` is whom it believes leads (itself: it leads; None: none).

    `partners` maps each other member to 2 (connected) or 0, as pysyncobj's status does.
    `changes` records ("add"|"remove", addr); `hold` makes a change wait until it is set."""

    def __init__(self, self_addr: str, *, leader: str | None, partners: dict[str, int] | None = None) -> None:
        super().__init__()
        self.self_addr = self_addr
        self.leader = leader
        self.partners = dict(partners or {})
        self.changes: list[tuple[str, str]] = []
        self.through_leader: list[dict[str, Any]] = []
        self.hold: trio.Event | None = None
        self.member_change: str | None = None

    def is_leader(self) -> bool:
        return self.leader == self.self_addr

    def status(self) -> dict[str, Any]:
        index = 40 + self.snapshot().revision  # Raft's index runs ahead of the revision (no-ops)
        return {"self": self.self_addr, "leader": self.leader, "is_leader": self.is_leader(), "ready": True,
                "term": 3, "member_change": self.member_change, "commit_index": index, "last_applied": index,
                "partners": dict(self.partners)}

    async def submit(self, command: dict[str, Any], *, through_leader: bool = False) -> Any:
        if through_leader:
            self.through_leader.append(command)
        elif not self.is_leader():
            raise NotLeader(self.leader)
        return self.submit_nowait(command)

    async def add_member(self, raft_addr: str) -> None:
        await self._change("add", raft_addr)
        self.partners[raft_addr] = 0

    async def remove_member(self, raft_addr: str) -> None:
        await self._change("remove", raft_addr)
        self.partners.pop(raft_addr, None)

    async def _change(self, op: str, addr: str) -> None:
        self.changes.append((op, addr))
        if self.hold is not None:
            self.member_change = f"{op} {addr}"
            try:
                await self.hold.wait()
            finally:
                self.member_change = None
