"""A follower keeps the entries it already holds from the current leader: pysyncobj 0.3.17 truncates
its log after `prevLogIdx` on every append, even when the entries there match (Raft truncates on a
conflict only), so a repeated or overlapping append drops entries the follower acknowledged.

Why it matters: the leader sends optimistically (its `nextIndex` runs ahead of the answers) and
moves `nextIndex` back to each answer it gets, so under load it sends the same entries again, in
shorter batches. A follower that holds entries up to 200 (acknowledged: the leader counts them
toward a majority, and may have committed them) and then gets the entries 99..150 again cut its
log back to 150 ("truncating already-applied log entries ... state machine may have diverged"),
flushed, and wrote them again. Until the rest came again, a write acknowledged to a client lived
on fewer members than the leader counted: a failover then could lose it, and a member that had
applied the dropped entries and later took other ones at those indexes would diverge.

The fix, on the follower, before pysyncobj reads the message: when its last entry is of the
message's term, that entry came from this leader, so (Log Matching) its whole log matches the
leader's up to there; so it does when this follower already told this leader, in this term, that
it holds everything up to its last entry (a success answer: the leader's check of the previous
entry passed there). The second case is a follower catching up on entries of older terms (a
member rejoined empty, one back after a cut): the fault campaign caught pysyncobj cutting such a
follower's applied entries under dropped and delayed messages. The entries it already holds are dropped from the message and the message
is re-based on its last entry: nothing is truncated, the new entries are appended after it, and
its answer (next index: its last entry + 1) is true. Any other message (a conflict, a log of an
older term, a snapshot, a chunked transmission) goes to pysyncobj as it came.

A second fix, for a message that carries a snapshot instead of entries (a chunk of one, or none
yet while the leader is still writing it): pysyncobj's follower takes the leader's commit index for
its own over whatever its log holds, unchecked against the leader's log. A former leader cut off
with entries no one else has then applied them and answered their writers "committed": writes
acknowledged that the group never had (the fault campaign lost them in its partition-leader rounds,
where the new leader had compacted past the old one's log and so sent it a snapshot). Such a
message says nothing about this member's log: its commit index is capped at this member's own
(`cap_commit`), and the member commits on the next append that matched its log, or on the snapshot
once it is loaded.
"""

from __future__ import annotations

from typing import Any

from pysyncobj import SyncObj


def keep_matching(log: Any, message: dict[str, Any], verified: int = 0) -> dict[str, Any]:
    """`message` (an `append_entries`) as this follower should read it, given its `log`
    (pysyncobj's journal: a sequence of (command, index, term)) and `verified`: the index up to
    which this follower told the message's leader, in the message's term, that its log matches
    (0: none). Pure: returns a new message or `message` itself."""
    if message.get("type") != "append_entries" or "prevLogIdx" not in message or "transmission" in message:
        return message
    if not len(log):
        return message
    first, (_, end, end_term) = log[0][1], log[-1]
    term, prev = message["term"], message["prevLogIdx"]
    if (end_term != term and verified < end) or not first <= prev < end:
        return message  # nothing held beyond prev, or not known to be this leader's: pysyncobj's own rules
    if log[prev - first][2] != message["prevLogTerm"]:
        return message  # cannot be, given Log Matching; pysyncobj answers it (reset)
    entries = message.get("entries") or []
    for entry in entries:
        idx = entry[1]
        if idx > end:
            break
        if log[idx - first][2] != entry[2]:
            return message  # a conflict: pysyncobj truncates from there, as Raft says
    return {**message, "prevLogIdx": end, "prevLogTerm": end_term,
            "entries": [entry for entry in entries if entry[1] > end]}


def cap_commit(message: dict[str, Any], commit_index: int) -> dict[str, Any]:
    """`message` (an `append_entries`) with its commit index no higher than this follower's own
    `commit_index` when it carries no entries to check against this follower's log (a snapshot, a
    chunk of one, or the leader's "not ready yet"). Pure: returns a new message or `message` itself."""
    if message.get("type") != "append_entries" or "prevLogIdx" in message:
        return message
    leader_commit = message.get("commit_index")
    if not isinstance(leader_commit, int) or leader_commit <= commit_index:
        return message
    return {**message, "commit_index": commit_index}


class KeepsMatchingEntries(SyncObj):  # type: ignore[misc]
    """pysyncobj's SyncObj, whose followers read each append through `keep_matching` and `cap_commit`.

    pysyncobj registers `self.__onMessageReceived` with its transport; the name is mangled to
    `_SyncObj__onMessageReceived`, which this class defines, so the transport calls this one."""

    # (term, index): in that term this follower answered the leader "I hold everything up to index"
    _matched_up_to: tuple[int, int] = (-1, 0)
    _cap_commit = True  # False only in the test that shows the loss without it

    def _SyncObj__onMessageReceived(self, node: Any, message: Any) -> None:
        if isinstance(message, dict) and message.get("type") == "append_entries":
            term, upto = self._matched_up_to
            message = keep_matching(self._SyncObj__raftLog, message, upto if message.get("term") == term else 0)
            if self._cap_commit:
                message = cap_commit(message, self._SyncObj__raftCommitIndex)
        SyncObj._SyncObj__onMessageReceived(self, node, message)

    def _SyncObj__sendNextNodeIdx(self, node: Any, reset: bool = False, nextNodeIdx: int | None = None,
                                  success: bool = False) -> None:
        if success:  # an append (or a snapshot) taken: the log matches this leader's up to the answer
            log = self._SyncObj__raftLog
            upto = (nextNodeIdx if nextNodeIdx is not None else log[-1][1] + 1) - 1
            term = self._SyncObj__raftCurrentTerm
            before_term, before = self._matched_up_to
            self._matched_up_to = (term, max(upto, before) if term == before_term else upto)
        SyncObj._SyncObj__sendNextNodeIdx(self, node, reset=reset, nextNodeIdx=nextNodeIdx, success=success)
