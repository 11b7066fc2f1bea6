"""`RaftStore`: commands in, immutable `ClusterState` snapshots out, awaited from trio.

pysyncobj runs its own thread. The replicated object has ONE `@replicated
apply(blob)` and ONE attribute (`_state`), so adding a command never changes
pysyncobj's method table or snapshot layout. Each commit is handed back to trio
through its token, so `await submit(cmd)` never blocks the event loop.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable

import trio
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated

from llmgw.domain import commands
from llmgw.domain.state import ClusterState

log = logging.getLogger("llmgw.store")

SUBMIT_TIMEOUT_S = 10.0
# pysyncobj commits on its next tick; a short tick keeps a commit near 10 ms
# at a small, steady CPU cost in its thread.
AUTO_TICK_S = 0.005


class NotLeader(Exception):
    """This member cannot commit; `leader` is where to send the write (None = unknown)."""

    def __init__(self, leader: str | None) -> None:
        super().__init__(f"not the leader (leader: {leader or 'unknown'})")
        self.leader = leader


class StoreUnavailable(Exception):
    """No commit within the deadline: no quorum, or the store is shutting down."""


class _Replicated(SyncObj):  # type: ignore[misc]
    def __init__(self, self_addr: str, peers: list[str], conf: SyncObjConf, on_applied: Callable[[], None]) -> None:
        # Attributes set before SyncObj.__init__ are kept out of snapshots.
        self._on_applied = on_applied
        super().__init__(self_addr, peers, conf)
        self._state = ClusterState()  # the ONE replicated attribute

    @replicated  # type: ignore[untyped-decorator]
    def apply(self, blob: bytes) -> tuple[str, Any]:
        try:
            command = commands.decode(blob)
            self._state, result = commands.apply(self._state, command)
            outcome: tuple[str, Any] = ("ok", result)
        except commands.CommandError as e:
            outcome = ("error", (e.code, e.message))
        except Exception as e:  # a bug must not kill the Raft thread or diverge members
            log.exception("command failed to apply")
            outcome = ("error", ("apply_failed", f"{type(e).__name__}: {e}"))
        self._on_applied()
        return outcome


class RaftStore:
    """A member of the control planes' Raft group (a group of one in `llmgw up`)."""

    def __init__(self, *, self_addr: str, peers: list[str], state_dir: Path) -> None:
        self.self_addr = self_addr
        self.peers = [p for p in peers if p != self_addr]
        self.state_dir = state_dir
        self._obj: _Replicated | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._changed = trio.Event()
        self._closed = threading.Event()
        self._ticker: threading.Thread | None = None

    # -- lifecycle -----------------------------------------------------------

    async def start(self) -> None:
        """Open (or replay) the journal and join the group. Returns once loaded."""
        self._token = trio.lowlevel.current_trio_token()
        raft_dir = self.state_dir / "raft"
        raft_dir.mkdir(parents=True, exist_ok=True)
        conf = SyncObjConf(
            journalFile=str(raft_dir / "journal.bin"),
            fullDumpFile=str(raft_dir / "snapshot.bin"),
            dynamicMembershipChange=False,
            logCompactionMinEntries=5000,
            logCompactionMinTime=300,
            commandsWaitLeader=True,
            # Our own tick thread: pysyncobj's autoTick thread stops as soon as the
            # thread that built the object exits, and we build it in a trio worker
            # thread (journal replay must not block the event loop), which trio
            # retires after ~10 s idle. Raft would then silently stop committing.
            autoTick=False,
            appendEntriesPeriod=0.05,
            raftMinTimeout=0.4,
            raftMaxTimeout=1.4,
        )
        self._obj = await trio.to_thread.run_sync(
            lambda: _Replicated(self.self_addr, self.peers, conf, self._applied_in_raft_thread)
        )
        self._ticker = threading.Thread(target=self._tick_forever, args=(self._obj,), name="llmgw-raft", daemon=True)
        self._ticker.start()
        log.info("raft member %s started (peers: %s)", self.self_addr, ", ".join(self.peers) or "none")

    def close(self) -> None:
        """Stop the member and its thread; the journal is closed on return."""
        self._closed.set()
        if self._ticker is not None:
            self._ticker.join()
            self._ticker = None
        if self._obj is not None:
            obj, self._obj = self._obj, None
            obj.destroy()  # without autoTick this closes sockets and the journal at once

    def _tick_forever(self, obj: _Replicated) -> None:
        while not self._closed.is_set():
            try:
                obj.doTick(AUTO_TICK_S)
            except Exception:
                log.exception("raft tick failed; retrying")
                time.sleep(AUTO_TICK_S)

    async def wait_ready(self, timeout: float = 30.0) -> None:
        """Wait until this member has a leader and has applied the log it had at start."""
        with trio.fail_after(timeout):
            while True:
                obj = self._obj
                if obj is not None and obj._getLeader() is not None and obj.isReady():
                    return
                await trio.sleep(0.02)

    # -- reads ---------------------------------------------------------------

    def snapshot(self) -> ClusterState:
        obj = self._obj
        if obj is None:
            return ClusterState()
        return obj._state  # an immutable value: reading the reference is safe across threads

    async def wait_changed(self, revision: int) -> ClusterState:
        while True:
            state = self.snapshot()
            if state.revision > revision:
                return state
            await self._changed.wait()

    def is_leader(self) -> bool:
        return self._obj is not None and bool(self._obj._isLeader())

    def leader(self) -> str | None:
        if self._obj is None:
            return None
        node = self._obj._getLeader()
        return None if node is None else str(getattr(node, "address", node))

    def status(self) -> dict[str, Any]:
        obj = self._obj
        if obj is None:
            return {"self": self.self_addr, "state": "stopped"}
        raw = obj.getStatus()
        return {
            "self": self.self_addr,
            "leader": self.leader(),
            "is_leader": self.is_leader(),
            "commit_index": raw.get("commit_idx"),
            "last_applied": raw.get("last_applied"),
            "log_size": raw.get("log_len"),
            "partners": {
                str(k).replace("partner_node_status_server_", ""): v
                for k, v in raw.items()
                if str(k).startswith("partner_node_status_server_")
            },
        }

    # -- writes --------------------------------------------------------------

    async def submit(self, command: dict[str, Any], *, timeout: float = SUBMIT_TIMEOUT_S) -> Any:
        """Commit one command; returns apply's result once committed and applied here.

        Raises `CommandError` (nothing changed), `NotLeader`, or `StoreUnavailable`.
        """
        obj = self._obj
        if obj is None:
            raise StoreUnavailable("the store is not running")
        if not obj._isLeader():
            raise NotLeader(self.leader())
        blob = commands.encode(command)
        commands.decode(blob)  # refuse what the members would refuse, before it is logged
        done = trio.Event()
        slot: list[Any] = []
        token = self._token
        assert token is not None

        def on_result(result: Any, error: Any) -> None:  # runs in the Raft thread
            def deliver() -> None:
                slot.append((result, error))
                done.set()

            try:
                token.run_sync_soon(deliver)
            except trio.RunFinishedError:
                pass

        obj.apply(blob, callback=on_result)
        with trio.move_on_after(timeout) as scope:
            await done.wait()
        if scope.cancelled_caught:
            raise StoreUnavailable(f"no commit within {timeout:g} s (no quorum?)")
        result, error = slot[0]
        if error == FAIL_REASON.NOT_LEADER or error == FAIL_REASON.LEADER_CHANGED:
            raise NotLeader(self.leader())
        if error != FAIL_REASON.SUCCESS:
            raise StoreUnavailable(f"commit failed: {_fail_name(error)}")
        status, payload = result
        if status == "error":
            code, message = payload
            raise commands.CommandError(code, message)
        return payload

    # -- internals -----------------------------------------------------------

    def _applied_in_raft_thread(self) -> None:
        token = self._token
        if token is None or self._closed.is_set():
            return
        try:
            token.run_sync_soon(self._wake)
        except trio.RunFinishedError:
            pass

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()


def _fail_name(code: Any) -> str:
    for name in dir(FAIL_REASON):
        if not name.startswith("_") and getattr(FAIL_REASON, name) == code:
            return name.lower()
    return str(code)
