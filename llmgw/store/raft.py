"""`RaftStore`: commands in, immutable `ClusterState` snapshots out, awaited from trio.

pysyncobj runs its own thread. The replicated object has ONE `@replicated
apply(blob)` and ONE attribute (`_state`), so adding a command never changes
pysyncobj's method table or snapshot layout. Each commit is handed back to trio
through its token, so `await submit(cmd)` never blocks the event loop.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import socket
import threading
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, Callable

import trio
from pysyncobj import FAIL_REASON, SyncObjConf, SyncObjException, replicated

from llmgw.interfaces import RaftPeerTls
from llmgw import startup
from llmgw.domain import commands, levels
from llmgw.domain.state import ClusterState, Outcome
from llmgw.domain.timeouts import TIMEOUTS, Timeouts
from llmgw.store.batching import GroupCommit, apply_blob, failed_appends
from llmgw.store.catchup import CatchesUp
from llmgw.store import failpoints
from llmgw.store.durable import open_durable, take_back
from llmgw.store.handoff import Handoff
from llmgw.store.journal import DEFAULT_FSYNC, FsyncPolicy, JournalWriteError, RaftJournal, Repeats
from llmgw.store.membership import MemberChanges, group_at_start, keep_a_group_of_one
from llmgw.store.handover import HandsOver
from llmgw.store.readindex import Confirmed, ConfirmsReads, Verdict
from llmgw.store.snapshot import SnapshotFiles, check_received
from llmgw.store.secret import load_or_create, raft_password
from llmgw.store import unpickle
from llmgw.store.wire import MAX_COMMAND_BYTES, RefusalLog, SealedTransport, sealed_transport

log = logging.getLogger("llmgw.store")

# Timings come from `Timeouts` (store_*, raft_*). pysyncobj appends a command at the end of a
# tick and commits it at the start of the next: `_tick_forever` runs that next tick at once
# (a commit on one member: ~0.4 ms p50 with fsync), and the tick bounds only timer granularity.

# Runs a blocking function off the event loop: how the journal replay is run.
RunInThread = Callable[[Callable[[], "_Replicated"]], Awaitable["_Replicated"]]
# A stop while the journal replays must not wait for the replay: the worker is abandoned.
_worker_thread: RunInThread = functools.partial(trio.to_thread.run_sync, abandon_on_cancel=True)


class _NoBindTraceback(logging.Filter):
    """pysyncobj logs a traceback when it cannot bind; `start` raises a worded OSError instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != "failed to perform initialization"


logging.getLogger("pysyncobj.syncobj").addFilter(_NoBindTraceback())
# What pysyncobj unpickles (frames, log entries, membership changes: all from the network) is decoded
# to plain values and its own node class only, so a leaked cluster secret is not code execution.
unpickle.install()


class NotLeader(Exception):
    """This member cannot commit; `leader` is where to send the write (None = unknown)."""

    def __init__(self, leader: str | None) -> None:
        super().__init__(f"not the leader (leader: {leader or 'unknown'})")
        self.leader = leader


class StoreUnavailable(Exception):
    """No commit within the deadline: no quorum, or the store is shutting down."""


class LeadershipUnconfirmed(StoreUnavailable):
    """A member that believes it leads could not confirm it with a majority within the read's
    deadline: it may have been replaced, so it does not serve the read."""


class CommitUnknown(StoreUnavailable):
    """The command was handed to Raft but its commit was not confirmed: it may still commit, or
    never. pysyncobj cannot cancel it, so this is never a failure: retry with the same `cid`."""


class StoreNotReady(StoreUnavailable, startup.CannotStart):
    """The member found no leader, or did not apply its log, within the start deadline."""


class NewerRelease(StoreUnavailable, startup.CannotStart):
    """This member met an entry or snapshot written by a newer release (`levels.NewerThanThisRelease`):
    it applies nothing from there on, and the role stops, saying which release to run."""


class _Replicated(HandsOver, ConfirmsReads, CatchesUp):  # CatchesUp: KeepsMatchingEntries, and a catch-up that converges
    def __init__(self, self_addr: str, peers: list[str], conf: SyncObjConf, on_applied: Callable[[], None],
                 transport: Callable[..., Any], read_resend_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        # Attributes set before SyncObj.__init__ are kept out of snapshots.
        self._on_applied = on_applied
        # ConfirmsReads: reads on the leader wait for a majority's confirmation (ReadIndex).
        # HandsOver: a stopping leader hands leadership over first (`RaftStore.hand_over`).
        super().__init__(self_addr, peers, conf, transportClass=transport, read_resend_s=read_resend_s,
                         clock=clock, handover_every_s=read_resend_s)
        self._state = ClusterState()  # the ONE replicated attribute

    @replicated  # type: ignore[untyped-decorator]
    def apply(self, blob: bytes) -> Outcome | tuple[Outcome, ...]:
        # Total (a command that does not apply becomes a recorded no-op); a batch: one outcome each.
        self._state, outcome = apply_blob(self._state, blob)
        self._on_applied()
        return outcome


class RaftStore:
    """A member of the control planes' Raft group (a group of one in `llmgw up`)."""

    def __init__(self, *, self_addr: str, peers: list[str], state_dir: Path, timeouts: Timeouts = TIMEOUTS,
                 run_in_thread: RunInThread = _worker_thread, cluster_secret: str | None = None,
                 fsync: FsyncPolicy = DEFAULT_FSYNC, compaction_min_entries: int = 5000,
                 abstain_until_synced: bool = False, peer_tls: RaftPeerTls | None = None) -> None:
        """`run_in_thread` builds the member (replaying the journal) off the event loop;
        the default is a trio worker thread, abandoned if the start is cancelled.
        `cluster_secret`: the group's secret, given by the operator; None: the one in the state dir
        (a new one on a fresh state dir). Raft traffic is sealed with it.
        `fsync`: when the journal is flushed to the disk (docs/operations.md, "Durability");
        `compaction_min_entries`: a snapshot is taken past this many journal entries (or 300 s).
        `abstain_until_synced`: this member grants no vote, and stands for none, until it has caught up
        with a leader once (`--join`, `--rejoin`). A member that lost its log (a damaged journal moved aside) may have
        acknowledged entries it no longer holds; voting before it has them again, it could elect a
        candidate that lacks them too, and a committed write would be lost (the fault campaign, seed
        6101 round 103: a standby rejoined empty while the leader was cut off gave the deciding vote
        to the one other member, which never had the write that it had acknowledged).
        `peer_tls`: members speak TLS to each other with their control certificates, under the seal
        (`llmgw.store.wire`); None: sealed only (`llmgw up` on loopback, the store's own tests)."""
        self.self_addr = self_addr
        self._peer_tls = peer_tls
        self._given_secret = cluster_secret
        self.peers = [p for p in peers if p != self_addr]
        self.state_dir = state_dir
        self.timeouts = timeouts
        self._run_in_thread = run_in_thread
        self._obj: _Replicated | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._changed = trio.Event()
        self._closed = threading.Event()
        self._ticker: threading.Thread | None = None
        self.fsync = fsync
        self.compaction_min_entries = compaction_min_entries
        # True when this start found no snapshot and no journal, or a journal of Raft's own no-ops
        # only, whole, beside its meta file (a first start stopped before it seeded): a cluster
        # that never logged a command. A journal cut short, torn or missing is never fresh.
        # What `seed_cluster` decides on, never "revision 0": a damaged journal is an error, not a
        # new cluster.
        self.fresh = False
        self._journal: RaftJournal | None = None
        # Submits waiting on Raft: (command blob, what to call if the journal could not append it).
        self._appending: list[tuple[bytes, Callable[[JournalWriteError], None]]] = []
        self._member_changes = MemberChanges()
        self.group = GroupCommit()  # submits in one scheduler pass go as one Raft entry (group commit)
        self._abstaining = abstain_until_synced
        self.halted: str | None = None  # why this member stopped applying (a newer release's entry), if it did
        self._halted = trio.Event()

    # -- lifecycle -----------------------------------------------------------

    async def start(self) -> None:
        """Open (or replay) the journal and join the group. Returns once loaded.

        Raises `CannotStart` when this member's Raft address cannot be bound, or when its journal
        or snapshot is damaged (JournalDamaged, SnapshotDamaged: the file, the offset, what to do)."""
        self._token = trio.lowlevel.current_trio_token()
        busy = _wildcard_error(self.self_addr) or _bind_error(self.self_addr)  # before anything is written
        if busy is not None:
            raise busy
        secret = load_or_create(self.state_dir, self._given_secret)  # another cluster's state dir stops here
        raft_dir = self.state_dir / "raft"
        raft_dir.mkdir(parents=True, exist_ok=True)
        journal = raft_dir / "journal.bin"
        snapshots = SnapshotFiles(raft_dir / "snapshot.json")
        conf = SyncObjConf(
            journalFile=str(journal),
            fullDumpFile=str(snapshots.path),
            # Snapshots are versioned JSON written by us (never pickles, never a fork).
            serializer=snapshots.save,
            deserializer=snapshots.load,
            # Members added and removed at run time, each change committed through Raft.
            dynamicMembershipChange=True,
            # Listen on this member's own address only: by default pysyncobj binds 0.0.0.0.
            bindAddress=self.self_addr,
            # Every frame sealed (Fernet: AES + HMAC) with a key from the cluster secret, checked
            # before pysyncobj unpickles it: without it, anyone reaching the port runs code here.
            password=raft_password(secret),
            # Compaction must never fork: a forked copy of a threaded process may hold any lock.
            useFork=False,
            # Send each new entry at once: batched, a lone write waits for the next heartbeat.
            appendEntriesUseBatch=False,
            connectionRetryTime=self.timeouts.raft_connect_retry_s,
            # pysyncobj's 3.5 s: a connect whose SYN a partition dropped waited that long after the heal
            connectionTimeout=self.timeouts.raft_connection_timeout_s,
            leaderFallbackTimeout=self.timeouts.raft_leader_fallback_s,
            logCompactionMinEntries=self.compaction_min_entries,
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
        transport = sealed_transport(RefusalLog(self.timeouts.raft_refusal_log_s), abstain=self._abstains,
                                     tls=self._peer_tls)
        clock: Callable[[], float] = time.monotonic
        fp = failpoints.active()  # (tests only: LLMGW_FAILPOINTS)
        if fp is not None:
            transport, clock = failpoints.install(transport, fp)
        with startup.waiting_for(lambda: f"the Raft store was still opening its journal ({journal})"):
            try:
                self._obj = await self._run_in_thread(
                    lambda: self._build(journal, snapshots, lambda: _Replicated(
                        self.self_addr, self.peers, conf, self._applied_in_raft_thread, transport,
                        self.timeouts.raft_heartbeat_s, clock)))
            except SyncObjException as e:
                if getattr(e, "errorCode", None) != "BindError":
                    raise
                raise (_bind_error(self.self_addr)
                       or startup.CannotStart(f"Raft cannot listen on {self.self_addr}")) from None
            except levels.NewerThanThisRelease as e:  # its own snapshot, written by a newer release
                raise NewerRelease(str(e)) from None
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

    def _build(self, journal: Path, snapshots: SnapshotFiles, build: Callable[[], _Replicated]) -> _Replicated:
        """In the worker thread: open and check the journal and snapshot, then build the member."""
        self._journal = opened = open_durable(journal, snapshots, self.fsync)
        keep_a_group_of_one(snapshots, self.self_addr)
        # Fresh: nothing was ever logged, and nothing was lost (no torn tail cut, no meta file
        # missing beside the journal); a journal shorter than its commit index never gets here.
        self.fresh = snapshots.loaded is None and not opened.holds_commands() and opened.found_whole
        opened.on_append_failed = self._append_failed_in_raft_thread
        try:
            self.peers = group_at_start(journal.parent, self.self_addr, self.peers, snapshots.loaded, opened)
            obj = build()
        except BaseException:
            take_back(opened)
            opened.close()
            raise
        snapshots.state_of = lambda: obj._state
        check_received(obj._SyncObj__serializer)  # a received snapshot read whole before it replaces ours

        def restore(state: ClusterState) -> None:  # a snapshot loaded: at start, or sent by the leader
            obj._state = state
            self._applied_in_raft_thread()

        snapshots.restore = restore
        return obj

    def _tick_forever(self, obj: _Replicated) -> None:
        tick = self.timeouts.raft_tick_s
        repeats = Repeats()  # a failure that recurs every tick is logged at its 1st, 2nd, 4th, ... time
        while not self._closed.is_set():
            try:
                started = time.monotonic()
                obj.doTick(tick)
                if time.monotonic() - started < tick:
                    # An event (a submit, a peer's message) ended the wait early. pysyncobj appends a new
                    # command at the end of a tick and commits it at the start of the next one: run that
                    # next tick now, without waiting, instead of up to `tick` later.
                    obj.doTick(0.0)
            except levels.NewerThanThisRelease as e:
                self._halt(str(e))
                return
            except JournalWriteError as e:  # already answered to the writer; Raft goes on, reads are served
                if n := repeats.count(str(e)):
                    log.error("raft: %s (occurrence %d; retrying)", e.strerror, n)
                time.sleep(tick)
            except Exception as e:
                if n := repeats.count(repr(e)):
                    log.exception("raft tick failed (occurrence %d; retrying)", n)
                time.sleep(tick)

    def _halt(self, why: str) -> None:
        """In the Raft thread: stop applying (and ticking) at an entry this release cannot read. The entry
        stays in the journal, unapplied: the release it names applies it at its start."""
        self.halted = why
        log.info("stopped applying the log: %s", why)  # the role ends with it, in one line (`raise_when_halted`)
        token = self._token
        if token is not None:
            try:
                token.run_sync_soon(self._halted.set)
            except trio.RunFinishedError:
                pass

    async def raise_when_halted(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Raise `NewerRelease` once this member stopped applying: the role ends, with that one line."""
        task_status.started()
        await self._halted.wait()
        raise NewerRelease(self.halted or "stopped applying")

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until this member has a leader and has applied the log it had at start.

        Raises `StoreNotReady`, saying what is missing, after `timeout` (default `store_ready_s`).
        """
        timeout = self.timeouts.store_ready_s if timeout is None else timeout
        with startup.waiting_for(lambda: f"the Raft store did not become ready ({self.not_ready_reason()})"):
            with trio.move_on_after(timeout):
                while self.not_ready_reason():
                    if self.halted is not None:
                        raise NewerRelease(self.halted)
                    await trio.sleep(self.timeouts.store_ready_poll_s)
                return
        raise StoreNotReady(f"the Raft store did not become ready within {timeout:g} s "
                            f"({self.not_ready_reason() or 'ready just now'})")

    def _abstains(self) -> bool:
        """In the Raft thread, at a vote request: whether this member still abstains (see __init__)."""
        if not self._abstaining:
            return False
        obj = self._obj
        if obj is None or not obj.isReady():
            return True
        self._abstaining = False
        log.info("caught up with the leader since its start: this member votes again")
        return False

    def not_ready_reason(self) -> str:
        """Why this member cannot serve yet, in words; "" once it has a leader and its log applied."""
        obj = self._obj
        if self.halted is not None:
            return self.halted
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

    async def confirm_leader(self, timeout: float | None = None) -> None:
        """Return once this member has confirmed it still leads, after this call began: a majority
        answered a probe sent after it (ReadIndex, `llmgw/store/readindex.py`), and this member has
        applied what was committed then. What `snapshot()` returns next is then no older than any
        write acknowledged before the call. A group of one confirms at its next tick.

        Raises `NotLeader` (it does not lead, or stopped leading meanwhile) or `LeadershipUnconfirmed`
        (no majority answered within `timeout`, default `store_read_s`: cut off from its peers?)."""
        timeout = self.timeouts.store_read_s if timeout is None else timeout
        obj, token = self._obj, self._token
        if obj is None or token is None:
            raise StoreUnavailable("the store is not running")
        if not obj._isLeader():
            raise NotLeader(self.leader())
        answer: Handoff[Verdict] = Handoff(token)
        read = obj.ask_read(answer.give)
        try:
            verdicts = await answer.wait(timeout)
        finally:
            obj.withdraw_read(read)
        if not verdicts:
            raise LeadershipUnconfirmed(
                f"this member leads by its own count, but no majority of the group confirmed it within "
                f"{timeout:g} s (is it cut off from its peers {', '.join(self.peers) or '-'}?); a read is "
                f"not answered from a state that may be stale")
        verdict = verdicts[0]
        if not isinstance(verdict, Confirmed):
            raise NotLeader(verdict.leader)

    async def hand_over(self, timeout: float) -> str | None:
        """While this member leads a group of more than one: ask its most caught-up follower to take over
        (Raft's TimeoutNow, `store/handover.py`) and wait, up to `timeout`, until another member leads.
        Returns that member, or None (not leading, alone, or no member took over in time)."""
        obj = self._obj
        if obj is None or not obj._isLeader() or not obj.otherNodes:
            return None
        obj.ask_handover()
        try:
            with trio.move_on_after(timeout):
                while True:
                    leader = self.leader()
                    if leader is not None and leader != self.self_addr:
                        return leader
                    await trio.sleep(self.timeouts.raft_tick_s)
        finally:
            obj.cancel_handover()
        return None

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
            "ready": bool(obj.isReady()),
            "term": raw.get("raft_term"),
            "member_change": self._member_changes.pending,  # a membership change in flight, in words
            "commit_index": raw.get("commit_idx"),
            "last_applied": raw.get("last_applied"),
            "log_size": raw.get("log_len"),
            "partners": {
                str(k).replace("partner_node_status_server_", ""): v
                for k, v in raw.items()
                if str(k).startswith("partner_node_status_server_")
            },
            # Each other member's link as this one holds it: "tls", "sealed" (no TLS) or "down".
            "links": self._links(obj),
            # On the leader: how far each follower's log is known to match its own (metrics' member lag).
            "match_index": {
                str(k).replace("match_idx_server_", ""): v
                for k, v in raw.items()
                if str(k).startswith("match_idx_server_")
            },
        }

    @staticmethod
    def _links(obj: _Replicated) -> dict[str, str]:
        transport = getattr(obj, "_SyncObj__transport", None)
        return transport.links() if isinstance(transport, SealedTransport) else {}

    # -- writes --------------------------------------------------------------

    async def submit(self, command: dict[str, Any], *, timeout: float | None = None,
                     through_leader: bool = False) -> Any:
        """Commit one command; returns apply's result once committed and applied here.

        A command with a `cid` applies at most once: if that id was applied already, its
        recorded outcome is returned (or raised) and nothing is logged.
        Raises `CommandError` (refused; nothing changed, or a no-op recorded with its reason; a
        command over `MAX_COMMAND_BYTES` is refused so),
        `NotLeader` (not logged), `CommitUnknown` (handed to Raft, commit not confirmed
        within `timeout`, default `store_commit_s`: it may still apply) or `StoreUnavailable`
        (not logged). `through_leader`: on a standby, Raft hands the command to the leader over
        its sealed wire (a member's own announcement) instead of raising `NotLeader`.
        """
        timeout = self.timeouts.store_commit_s if timeout is None else timeout
        obj = self._obj
        if obj is None:
            raise StoreUnavailable("the store is not running")
        if not obj._isLeader() and not through_leader:
            raise NotLeader(self.leader())
        journal = self._journal
        if journal is not None and journal.write_error:
            raise StoreUnavailable(f"this member cannot write its journal: {journal.write_error}")
        blob = commands.encode(command)
        if len(blob) > MAX_COMMAND_BYTES:  # every member's Raft port would refuse the frame that carries it
            raise commands.CommandError("command_too_large", f"a command is at most {MAX_COMMAND_BYTES} bytes "
                                                             f"(this one has {len(blob)}); nothing was written")
        wired = commands.decode(blob)  # refuse what the members would refuse, before it is logged
        state = self.snapshot()
        recorded = commands.replay(state, wired)
        if recorded is not None:
            return commands.result_of(recorded)
        # A dry run on this member's state: what would be refused now is not logged. The state
        # may still move before the entry applies; then apply records the refusal instead.
        await self._dry_run(state, wired, timeout)
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

        appending = (blob, lambda error: on_result(None, error))
        self._appending.append(appending)
        try:
            self.group.add(obj.apply, blob, on_result)
            with trio.move_on_after(timeout) as scope:
                await done.wait()
        finally:
            self._appending.remove(appending)
        if scope.cancelled_caught:
            raise CommitUnknown(f"no commit confirmed within {timeout:g} s (no quorum?); the command may still apply")
        result, error = slot[0]
        if isinstance(error, JournalWriteError):  # not in the log: a definite refusal
            raise StoreUnavailable(f"the write was not committed: {error.strerror} "
                                   f"(this member still serves reads)")
        if error in (FAIL_REASON.LEADER_CHANGED, FAIL_REASON.UNKNOWN_OUTCOME):
            # Forwarded, or acknowledged by a leader that is gone: it may be in the log.
            raise CommitUnknown(f"commit not confirmed: {_fail_name(error)} (leader now: {self.leader() or 'unknown'})")
        if error == FAIL_REASON.NOT_LEADER:
            raise NotLeader(self.leader())
        if error != FAIL_REASON.SUCCESS:  # queue full, no leader, discarded, denied: not in the log
            raise StoreUnavailable(f"commit failed: {_fail_name(error)}")
        assert isinstance(result, Outcome)
        return commands.result_of(result)

    async def _dry_run(self, state: ClusterState, wired: dict[str, Any], timeout: float) -> None:
        """`commands.apply` on `state`, for its refusal. A command of a store level above the group's whose
        every announced member reads it (a new group, or the last member just upgraded: the leader raises
        the level within a moment, `Members.raise_level_forever`) waits up to `timeout` for that raise
        instead of being refused with `upgrade_pending` at once."""
        try:
            commands.apply(state, wired)
            return
        except commands.CommandError as e:
            needs = levels.command_level(wired)
            if e.code != "upgrade_pending" or not state.members or any(
                    m.level < needs for m in state.members.values()):
                raise
        with trio.move_on_after(timeout):
            while state.store_level < needs:
                state = await self.wait_changed(state.revision)
        commands.apply(state, wired)

    # -- membership ----------------------------------------------------------

    async def add_member(self, raft_addr: str) -> None:
        """Returns once committed (this member must lead); raises `MembershipBusy`, `NotLeader`, `CommitUnknown`."""
        await self._change_members("adding", raft_addr)

    async def remove_member(self, raft_addr: str) -> None:
        await self._change_members("removing", raft_addr)

    async def _change_members(self, doing: str, addr: str) -> None:
        obj, token = self._obj, self._token
        if obj is None or token is None or not obj._isLeader():
            raise NotLeader(self.leader())
        call = obj.addNodeToCluster if doing == "adding" else obj.removeNodeFromCluster
        error = await self._member_changes.run(f"{doing} {addr}", lambda cb: call(addr, callback=cb), token,
                                               self.timeouts.store_commit_s)
        if error in (FAIL_REASON.NOT_LEADER, FAIL_REASON.MISSING_LEADER):
            raise NotLeader(self.leader())
        if error != FAIL_REASON.SUCCESS:  # not confirmed in time, or the leader changed: it may still apply
            raise CommitUnknown(f"{doing} {addr} was not confirmed ({_fail_name(error) if error else 'timed out'})")

    # -- internals -----------------------------------------------------------

    def _applied_in_raft_thread(self) -> None:
        token = self._token
        if token is None or self._closed.is_set():
            return
        try:
            token.run_sync_soon(self._wake)
        except trio.RunFinishedError:
            pass

    def _append_failed_in_raft_thread(self, command: bytes, error: JournalWriteError) -> None:
        token = self._token
        if token is None or self._closed.is_set():
            return
        try:
            token.run_sync_soon(self._append_failed, command, error)
        except trio.RunFinishedError:
            pass

    def _append_failed(self, command: bytes, error: JournalWriteError) -> None:
        for fail in failed_appends(command, self._appending):  # each waiting submit in that entry
            fail(error)

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()


def _wildcard_error(addr: str) -> startup.CannotStart | None:
    """A Raft address is the member's name in the group, which its peers dial: 0.0.0.0 or ::
    names no machine, and would listen on every interface."""
    host = addr.rpartition(":")[0].strip("[]")
    try:
        wildcard = ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return None  # a host name: pysyncobj resolves it, and listens on that address only
    if not wildcard:
        return None
    return startup.CannotStart(f"the Raft address {addr} names no machine: give this member's address on the "
                               f"cluster's network (its peers dial it, and Raft listens there only)")


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
