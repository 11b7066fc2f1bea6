"""Fakes and builders for tests, shipped with the package (like `trio.testing`).

A user's own tests may import them, so they import only the standard library,
llmgw and its dependencies (tests/unit/test_testing_kit.py); the suite's own
harness (processes, clusters, fault catalog, fuzzers) lives in tests/support.

`MemoryStore` runs the real `domain.apply` over an in-memory log: the same
semantics as the Raft store, without pysyncobj.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import trio

from llmgw.domain import commands, levels
from llmgw.domain.state import ClusterState


class MemoryStore:
    """A single-process store: `submit` applies at once; `wait_changed` wakes waiters."""

    def __init__(self, state: ClusterState | None = None) -> None:
        # Its one member reads this release's store level: so does the group.
        self._state = state or ClusterState(store_level=levels.LEVEL)
        self._changed = trio.Event()
        self.log: list[dict[str, Any]] = []

    def snapshot(self) -> ClusterState:
        return self._state

    async def wait_changed(self, revision: int) -> ClusterState:
        while self._state.revision <= revision:
            await self._changed.wait()
        return self._state

    async def submit(self, command: dict[str, Any], *, through_leader: bool = False) -> Any:
        return self.submit_nowait(command)

    def submit_nowait(self, command: dict[str, Any]) -> Any:
        """Apply now (raises `CommandError` and changes nothing when it does not apply).

        As the Raft store: the wire checks, then a command whose `cid` was applied already
        answers its recorded outcome and is not logged again; one that would be refused now
        is refused before it is logged (here nothing can move the state in between)."""
        wired = commands.decode(commands.encode(command))
        recorded = commands.replay(self._state, wired)
        if recorded is not None:
            return commands.result_of(recorded)
        state, outcome = commands.apply_entry(self._state, wired)
        if outcome.ok:
            self._state = state
            self.log.append(command)
            self._changed.set()
            self._changed = trio.Event()
        return commands.result_of(outcome)

    def is_leader(self) -> bool:
        return True

    async def confirm_leader(self) -> None:
        """A single process has no one to confirm with: its state is the latest."""


class FakeGpuProbe:
    """A `GpuProbe` that reports a fixed inventory (the NVML edge, faked)."""

    def __init__(self, info: Any) -> None:
        self.info = info
        self.calls = 0

    def inventory(self, node: str) -> Any:
        self.calls += 1
        return replace(self.info, node=node)
