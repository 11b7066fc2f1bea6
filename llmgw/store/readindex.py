"""ReadIndex: a read on the leader is answered only once a majority has confirmed, after the read
arrived, that this member still leads (Raft thesis §6.4; etcd's `ReadOnlySafe`).

Why: a leader cut off from its peers believes it leads until `raft_leader_fallback_s`, while the
others elect a new leader that commits writes. Answered from its own state, its reads would miss
writes acknowledged meanwhile. A follower's answer to a probe sent after the read arrived proves
that the follower had not moved to a newer term when it answered; a majority of such answers
(this member counts as one) leaves no majority that could have elected a newer leader before the
read arrived. The read is then served once this member has applied up to the commit index it had
when the round began, and only once that commit index covers an entry of its own term (its
election no-op): before that, a new leader's commit index may lag what its predecessor acknowledged.

Why not a lease: pysyncobj 0.3.17's followers grant a vote to any candidate of a newer term,
however recently they heard from the leader (no leader stickiness, no pre-vote), so a follower's
acknowledgement bounds nothing in time: a new leader can be elected the moment after it.

On the wire: the leader sends `llmgw_read_probe` {term, seq} to each voting member; a member whose
term is not newer answers `llmgw_read_ack` {term, seq}. pysyncobj ignores message types it does
not know, so a member running an older llmgw never answers: upgrade every member (reads on a
leader whose majority cannot answer are refused with 503, never served stale).

`ReadIndex` is pure (times and the Raft view in, verdicts out: the unit tests drive it);
`ConfirmsReads` is the glue to pysyncobj, run in the Raft thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from pysyncobj import SyncObj

PROBE = "llmgw_read_probe"
ACK = "llmgw_read_ack"


@dataclass(frozen=True)
class RaftView:
    """What the Raft thread sees of this member when it looks (pysyncobj's private fields, read in its thread).

    `voters`: the other voting members' ids; `settled`: the commit index covers an entry of `term`."""

    leading: bool
    term: int
    commit_index: int
    settled: bool
    last_applied: int
    voters: frozenset[str]
    leader: str | None = None


@dataclass(frozen=True)
class Confirmed:
    """The read may be served: this member led, after it arrived, and has applied what was committed."""


@dataclass(frozen=True)
class Refused:
    """This member no longer leads (`leader`: whom it follows now, None when unknown)."""

    reason: str
    leader: str | None


Verdict = Confirmed | Refused
Done = Callable[[Verdict], None]


class Probe(NamedTuple):
    """What to send to every voting member: a probe of `term`, numbered `seq`."""

    term: int
    seq: int


@dataclass(eq=False)
class Read:
    """One read waiting: `seq` and `read_index` once its round began (None before)."""

    done: Done
    seq: int | None = None
    term: int = 0
    read_index: int = 0


def majority_seq(acks: Mapping[str, int], voters: Collection[str], sent: int) -> int:
    """The newest probe number a majority of the group answered (this member, which sent up to
    `sent`, counts as one); 0 when none. A member's answer to probe n covers every probe before it,
    so each voter stands for the newest number it answered."""
    seen = sorted((min(acks.get(v, 0), sent) for v in voters), reverse=True)
    needed = (len(voters) + 1) // 2  # a majority of the group (voters and this member), less this member
    if needed == 0:
        return sent
    return seen[needed - 1] if len(seen) >= needed else 0


@dataclass
class ReadIndex:
    """The reads waiting for this member to confirm it leads. `ask` and `withdraw` from any thread;
    `look` and `acked` from the Raft thread only. `resend_s`: a round unanswered this long is probed
    again (a probe lost with a dropped connection must not hold a read until its deadline)."""

    resend_s: float
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _new: list[Read] = field(default_factory=list)
    _rounds: list[Read] = field(default_factory=list)
    _acks: dict[str, int] = field(default_factory=dict)
    _term: int = -1
    _seq: int = 0
    _probed_at: float | None = None

    def ask(self, done: Done) -> Read:
        """A read arrived: `done` is called, in the Raft thread, with its verdict."""
        read = Read(done)
        with self._lock:
            self._new.append(read)
        return read

    def withdraw(self, read: Read) -> None:
        """The reader gave up (its deadline): forget it."""
        with self._lock:
            if read in self._new:
                self._new.remove(read)
            if read in self._rounds:
                self._rounds.remove(read)

    def waiting(self) -> int:
        with self._lock:
            return len(self._new) + len(self._rounds)

    def acked(self, node: str, term: int, seq: int) -> None:
        """A member answered probe `seq` of `term` (an answer to another term's probe counts for nothing)."""
        with self._lock:
            if term == self._term and seq > self._acks.get(node, 0):
                self._acks[node] = seq

    def look(self, view: RaftView, now: float) -> tuple[list[tuple[Done, Verdict]], Probe | None]:
        """Decide what can be decided at monotonic time `now`: the verdicts to deliver, and the probe
        to send (None: none needed). Reads that arrived since the last probe start a round once this
        member's commit index is settled in its term; a round is confirmed once a majority answered
        a probe of its number or newer and this member has applied its read index."""
        with self._lock:
            if not view.leading:
                refused = Refused("this member no longer leads", view.leader)
                out: list[tuple[Done, Verdict]] = [(r.done, refused) for r in (*self._rounds, *self._new)]
                self._rounds.clear()
                self._new.clear()
                self._acks.clear()
                self._term, self._probed_at = -1, None
                return out, None
            if view.term != self._term:  # a new term: the last term's answers prove nothing now
                self._term, self._probed_at = view.term, None
                self._acks.clear()
                self._new[:0] = self._rounds
                self._rounds.clear()
            probe = None
            if self._new and view.settled:
                self._seq += 1
                for read in self._new:
                    read.seq, read.term, read.read_index = self._seq, view.term, view.commit_index
                self._rounds.extend(self._new)
                self._new.clear()
                probe = Probe(view.term, self._seq)
            elif self._rounds and self._probed_at is not None and now - self._probed_at >= self.resend_s:
                self._seq += 1  # newer than every waiting round: its answer confirms them all
                probe = Probe(view.term, self._seq)
            if probe is not None:
                self._probed_at = now
            quorum = majority_seq(self._acks, view.voters, self._seq)
            out = []
            for read in list(self._rounds):
                assert read.seq is not None
                if read.seq <= quorum and view.last_applied >= read.read_index:
                    out.append((read.done, Confirmed()))
                    self._rounds.remove(read)
            if not self._rounds and not self._new:
                self._probed_at = None
            return out, probe


class ConfirmsReads(SyncObj):  # type: ignore[misc]
    """pysyncobj's SyncObj that runs a `ReadIndex` (a mixin: first among the bases): the leader probes
    its voters on a tick after a read arrives; every member answers a probe of a term not older
    than its own. Reads are asked with `ask_read`."""

    def __init__(self, *args: Any, read_resend_s: float, clock: Callable[[], float], **kwargs: Any) -> None:
        # Set before SyncObj.__init__, so that they stay out of snapshots (pysyncobj saves only the
        # attributes added after it).
        self._read_index = ReadIndex(read_resend_s)
        self._read_clock = clock
        super().__init__(*args, **kwargs)
        self.addOnTickCallback(self._reads_tick)

    def ask_read(self, done: Done) -> Read:
        """Any thread: ask for a confirmed read; wakes the Raft thread so the round starts at once."""
        read = self._read_index.ask(done)
        notifier = getattr(self, "_SyncObj__pipeNotifier", None)
        if notifier is not None:
            notifier.notify()
        return read

    def withdraw_read(self, read: Read) -> None:
        self._read_index.withdraw(read)

    def _raft_view(self) -> RaftView:
        noop = self._SyncObj__noopIDx
        commit = self._SyncObj__raftCommitIndex
        leader = self._getLeader()
        return RaftView(
            leading=bool(self._isLeader()),
            term=self._getTerm(),
            commit_index=commit,
            settled=noop is not None and commit >= noop,
            last_applied=self._SyncObj__raftLastApplied,
            voters=frozenset(str(n.id) for n in self._SyncObj__otherNodes),
            leader=None if leader is None else str(getattr(leader, "address", leader)),
        )

    def _reads_tick(self) -> None:
        if not self._read_index.waiting():
            return
        verdicts, probe = self._read_index.look(self._raft_view(), self._read_clock())
        if probe is not None:
            message = {"type": PROBE, "term": probe.term, "seq": probe.seq}
            for node in list(self._SyncObj__otherNodes):
                self._SyncObj__transport.send(node, message)
        for done, verdict in verdicts:
            done(verdict)

    def _SyncObj__onMessageReceived(self, node: Any, message: Any) -> None:
        kind = message.get("type") if isinstance(message, dict) else None
        if kind == PROBE:
            # Not newer than the prober's term: this member has voted in no newer term, so it is
            # part of no majority that elected a newer leader (what the prober needs to know).
            if message["term"] >= self._getTerm():
                self._SyncObj__transport.send(node, {"type": ACK, "term": message["term"], "seq": message["seq"]})
            return
        if kind == ACK:
            self._read_index.acked(str(node.id), message["term"], message["seq"])
            return
        super()._SyncObj__onMessageReceived(node, message)
