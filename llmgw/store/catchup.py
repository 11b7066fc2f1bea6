"""A follower that diverged or fell behind catches up within three rounds of appends, whatever the
order of its answers: two fixes to pysyncobj 0.3.17's back-off of the leader's next index.

The stall (issue 19): the leader pipelines its log tail, one message per batch, each moving the
follower's next index on as it is sent. A former leader, healed after a cut, holds entries of its
own old term that nobody else has. It answers the first message (whose previous entry it holds,
of another term) with a conflict, "send from that index", and every later one (whose previous
entry lies past its end) with "send from my end + 1". pysyncobj sets the next index to each answer
as it comes: the last one wins, so the next round starts at the follower's end again, conflicts
again, and the next index never backs up past the conflicting suffix. The follower stays behind,
links up, until a compaction happens to send it a snapshot (60-287 s measured), while the leader
re-sends its tail every round.

Fix 1, on the leader (`Floors`): a failed answer never moves a next index up past a lower one a
failed answer of this term asked for, until a success moves past it. What the follower asked for
first still holds when its answers to the later messages of the same round arrive.

Fix 2, on the follower (`conflict_hint`): a conflict answer asks for the entries after its commit
index, not just one step back. Everything up to a member's commit index is committed, so it is in
every later leader's log, the same (Raft's Leader Completeness): the leader's next append, from
there, matches, and the follower drops its whole conflicting suffix at once. pysyncobj would back
up one entry per round, thousands of rounds for a leader cut off under write load.

Snapshots: the leader sends its snapshot when the follower needs an entry it compacted away
(pysyncobj's own rule: next index at or below its log's first index), which fix 2 reaches at once
when the follower's commit index is older than the leader's snapshot. It never sends one when
the entries are still in its log: pysyncobj's snapshot is as old as that log's first entry, so the
follower would need every entry after it anyway, more than the entries it asked for.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from pysyncobj.syncobj import _RAFT_STATE

from llmgw.store.appends import KeepsMatchingEntries

log = logging.getLogger("llmgw.store")


def conflict_hint(asked: int, commit_index: int) -> int:
    """The next index a follower answers to an append whose previous entry conflicts with its own:
    pysyncobj `asked` for that entry's index; the first entry after its commit index is as safe
    (those up to it match every later leader's) and skips the whole conflicting suffix."""
    return min(asked, commit_index + 1)


@dataclass
class Floors:
    """On the leader: for each follower, the lowest next index its failed answers asked for in
    this term since the last success that moved past it. Pure bookkeeping: `answer` returns the
    answer as the leader should read it."""

    term: int = -1
    lowest: dict[Any, int] = field(default_factory=dict)

    def answer(self, term: int, node: Any, message: dict[str, Any]) -> dict[str, Any]:
        """`message` (a `next_node_idx` answer of `node` to this leader of `term`) as the leader
        should read it: a failed answer ("reset") asks for no more than the floor. Returns a new
        message or `message` itself."""
        if term != self.term:  # a new leadership: what followers answered an older one says nothing
            self.term, self.lowest = term, {}
        asked = message.get("next_node_idx")
        if not isinstance(asked, int):
            return message
        floor = self.lowest.get(node)
        if message.get("success"):
            if floor is not None and asked > floor:  # the follower now holds the entry at the floor
                del self.lowest[node]
            return message
        if not message.get("reset"):
            return message  # a chunk of a snapshot acknowledged: pysyncobj moves nothing
        if floor is None or asked < floor:
            self.lowest[node] = asked
            return message
        return message if asked == floor else {**message, "next_node_idx": floor}


class CatchesUp(KeepsMatchingEntries):
    """pysyncobj's SyncObj (with `KeepsMatchingEntries`) whose leader reads each follower's
    failed answers through `Floors` and whose followers answer a conflict with `conflict_hint`.

    Both override name-mangled methods pysyncobj calls on `self`: `_SyncObj__onMessageReceived`
    (the transport's callback) and `_SyncObj__sendNextNodeIdx` (a follower's every answer)."""

    _catch_up_floors: Floors | None = None

    def _SyncObj__onMessageReceived(self, node: Any, message: Any) -> None:
        if (isinstance(message, dict) and message.get("type") == "next_node_idx"
                and self._SyncObj__raftState == _RAFT_STATE.LEADER):
            message = self._held_back(node, message)
        super()._SyncObj__onMessageReceived(node, message)

    def _held_back(self, node: Any, message: dict[str, Any]) -> dict[str, Any]:
        floors = self._catch_up_floors
        if floors is None:
            floors = self._catch_up_floors = Floors()
        before = floors.lowest.get(node)
        read = floors.answer(self._SyncObj__raftCurrentTerm, node, message)
        after = floors.lowest.get(node)
        if after is not None and before is None:
            log.info("raft: member %s is behind or its log conflicts with this leader's; sending it the log "
                     "from index %d (snapshot if compacted) until it holds that entry",
                     getattr(node, "address", node), after)
        return read

    def _SyncObj__sendNextNodeIdx(self, node: Any, reset: bool = False, nextNodeIdx: int | None = None,
                                  success: bool = False) -> None:
        if reset and not success and nextNodeIdx is not None:  # pysyncobj's conflict answer, only
            nextNodeIdx = conflict_hint(nextNodeIdx, self._SyncObj__raftCommitIndex)
        super()._SyncObj__sendNextNodeIdx(node, reset=reset, nextNodeIdx=nextNodeIdx, success=success)
