"""`RaftStore`: commands in, immutable `ClusterState` snapshots out, awaited from trio.

pysyncobj runs its own thread. The replicated object has ONE `@replicated
apply(blob)` and ONE attribute (`_state`), so adding a command never changes
pysyncobj's method table or snapshot layout. Each commit is handed back to trio
through its token, so `await submit(cmd)` never blocks the event loop.
"""

from __future__ import annotations

import functools
import logging
import socket
import threading
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, Callable

import trio
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, SyncObjException, replicated

from llmgw import startup
from llmgw.domain import commands
from llmgw.domain.state import ClusterState
from llmgw.domain.timeouts import TIMEOUTS, Timeouts

log = logging.getLogger("llmgw.store")

# Timings come from `Timeouts` (store_*, raft_*). pysyncobj commits on its next tick:
# a short tick keeps a commit near 10 ms at a small, steady CPU cost in its thread.

# Runs a blocking function off the event loop: how the journal replay is run.
RunInThread = Callable[[Callable[[], "_Replicated"]], Awaitable["_Replicated"]]
# A stop while the journal replays must not wait for the replay: the worker is abandoned.
_worker_thread: RunInThread = functools.partial(trio.to_thread.run_sync, abandon_on_cancel=True)


class _NoBindTraceback(logging.Filter):
    """pysyncobj logs a traceback when it cannot bind; `start` raises a worded OSError instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != "failed to perform initialization"


logging.getLogger("pysyncobj.syncobj").addFilter(_NoBindTraceback())


class NotLeader(Exception):
    """This member cannot commit; `leader` is where to send the write (None = unknown)."""

    def __init__(self, leader: str | None) -> None:
        super().__init__(f"not the leader (leader: {leader or 'unknown'})")
        self.leader = leader


class StoreUnavailable(Exception):
    """No commit within the deadline: no quorum, or the store is shutting down."""


class StoreNotReady(StoreUnavailable, startup.CannotStart):
    """The member found no leader, or did not apply its log, within the start deadline."""


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

    def __init__(self, *, self_addr: str, peers: list[str], state_dir: Path, timeouts: Timeouts = TIMEOUTS,
                 run_in_thread: RunInThread = _worker_thread) -> None:
        """`run_in_thread` builds the member (replaying the journal) off the event loop;
        the default is a trio worker thread, abandoned if the start is cancelled."""
        self.self_addr = self_addr
        self.peers = [p for p in peers if p != self_addr]
        self.state_dir = state_dir
        self.timeouts = timeouts
        self._run_in_thread = run_in_thread
        self._obj: _Replicated | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._changed = trio.Event()
        self._closed = threading.Event()
        self._ticker: threading.Thread | None = None

    # -- lifecycle -----------------------------------------------------------

    async def start(self) -> None:
        """Open (or replay) the journal and join the group. Returns once loaded.

        Raises `CannotStart` when this member's Raft address cannot be bound."""
        self._token = trio.lowlevel.current_trio_token()
        busy = _bind_error(self.self_addr)  # before the journal is opened: a busy port changes nothing
        if busy is not None:
            raise busy
        raft_dir = self.state_dir / "raft"
        raft_dir.mkdir(parents=True, exist_ok=True)
        journal = raft_dir / "journal.bin"
        conf = SyncObjConf(
            journalFile=str(journal),
            fullDumpFile=str(raft_dir / "snapshot.bin"),
            dynamicMembershipChange=False,
            logCompactionMinEntries=5000,
            logCompactionMinTime=300,
            commandsWaitLeader=True,
            # Our own tick thread: pysyncobj's autoTick thread stops as soon as the
            # thread that built the object exits, and we build it in a worker thread
            # (journal replay must not block the event loop), which trio retires
            # after ~10 s idle. Raft would then silently stop committing.
            autoTick=False,
            appendEntriesPeriod=self.timeouts.raft_heartbeat_s,
            raftMinTimeout=self.timeouts.raft_election_min_s,
            raftMaxTimeout=self.timeouts.raft_election_max_s,
            # One bind attempt: pysyncobj would otherwise retry a busy port forever, spinning.
            maxBindRetries=1,
        )
        with startup.waiting_for(lambda: f"the Raft store was still opening its journal ({journal})"):
            try:
                self._obj = await self._run_in_thread(
                    lambda: _Replicated(self.self_addr, self.peers, conf, self._applied_in_raft_thread)
                )
            except SyncObjException as e:
                if getattr(e, "errorCode", None) != "BindError":
                    raise
                raise (_bind_error(self.self_addr)
                       or startup.CannotStart(f"Raft cannot listen on {self.self_addr}")) from None
        self._ticker = threading.Thread(target=self._tick_forever, args=(self._obj,), name="llmgw-raft", daemon=True)
        self._ticker.start()
        log.info("raft member %s started (peers: %s)", self.self_addr, ", ".join(self.peers) or "none")

    def close(self) -> None:
        """Stop the member and its thread; the journal is closed on return.

        Bounded: a tick stuck inside pysyncobj (e.g. on a damaged journal) is abandoned
        after `store_close_s`, with a warning, so a stop never hangs on it.
        """
        self._closed.set()
        ticker, self._ticker = self._ticker, None
        obj, self._obj = self._obj, None
        if ticker is not None:
            ticker.join(self.timeouts.store_close_s)
            if ticker.is_alive():
                # Destroying the object under a running tick is unsafe: leave both to the process's end
                # (the thread is a daemon).
                log.warning("raft thread did not stop within %g s; abandoned (it ends with the process)",
                            self.timeouts.store_close_s)
                return
        if obj is not None:
            obj.destroy()  # without autoTick this closes sockets and the journal at once

    def _tick_forever(self, obj: _Replicated) -> None:
        tick = self.timeouts.raft_tick_s
        while not self._closed.is_set():
            try:
                obj.doTick(tick)
            except Exception:
                log.exception("raft tick failed; retrying")
                time.sleep(tick)

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until this member has a leader and has applied the log it had at start.

        Raises `StoreNotReady`, saying what is missing, after `timeout` (default `store_ready_s`).
        """
        timeout = self.timeouts.store_ready_s if timeout is None else timeout
        with startup.waiting_for(lambda: f"the Raft store did not become ready ({self.not_ready_reason()})"):
            with trio.move_on_after(timeout):
                while self.not_ready_reason():
                    await trio.sleep(self.timeouts.store_ready_poll_s)
                return
        raise StoreNotReady(f"the Raft store did not become ready within {timeout:g} s "
                            f"({self.not_ready_reason() or 'ready just now'})")

    def not_ready_reason(self) -> str:
        """Why this member cannot serve yet, in words; "" once it has a leader and its log applied."""
        obj = self._obj
        if obj is None:
            return "the store is not running"
        if obj._getLeader() is None:
            if self.peers:
                return (f"no leader among {1 + len(self.peers)} members: this one ({self.self_addr}) needs a "
                        f"majority of them; are its peers running and reachable? ({', '.join(self.peers)})")
            return f"no leader elected yet (member {self.self_addr})"
        if not obj.isReady():
            return f"the log is not applied yet (leader: {self.leader()})"
        return ""

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

    async def submit(self, command: dict[str, Any], *, timeout: float | None = None) -> Any:
        """Commit one command; returns apply's result once committed and applied here.

        Raises `CommandError` (nothing changed), `NotLeader`, or `StoreUnavailable`
        (no commit within `timeout`, default `store_commit_s`).
        """
        timeout = self.timeouts.store_commit_s if timeout is None else timeout
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


def _bind_error(addr: str) -> startup.CannotStart | None:
    """Why Raft cannot listen on `addr` (None if it can): pysyncobj would only say "BindError".

    A CannotStart, not an OSError: callers that name their own busy ports (the admin API's)
    must not take this one for theirs."""
    host, _, port = addr.rpartition(":")
    host = host.strip("[]")
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as pysyncobj does
            probe.bind((host, int(port)))
    except OSError as e:
        return startup.CannotStart(f"Raft cannot listen on {addr}: {e.strerror}")
    return None


def _fail_name(code: Any) -> str:
    for name in dir(FAIL_REASON):
        if not name.startswith("_") and getattr(FAIL_REASON, name) == code:
            return name.lower()
    return str(code)
