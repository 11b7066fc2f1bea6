"""Changes to the Raft group's membership: one at a time, each committed through Raft
(pysyncobj's `addNodeToCluster` / `removeNodeFromCluster`), awaited from trio; and the group a
member starts in (its state dir's, not its flags')."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import Any, Callable

import trio
from pysyncobj import FAIL_REASON
from pysyncobj.syncobj import _COMMAND_TYPE

from llmgw import startup
from llmgw.store import unpickle
from llmgw.store.handoff import Handoff
from llmgw.store.journal import RaftJournal
from llmgw.store.snapshot import Snapshot, SnapshotFiles
from llmgw.diskfiles import fsync_dir

log = logging.getLogger("llmgw.store")


class MembershipBusy(Exception):
    """A membership change refused because another one is still in progress; nothing changed."""


# pysyncobj's callback: (result, FAIL_REASON), called in the Raft thread once the change is
# committed, or refused.
Callback = Callable[[Any, Any], None]


class MemberChanges:
    """The change this leader has in flight, if any. pysyncobj also refuses a change while the
    previous one is uncommitted (`REQUEST_DENIED`); this says which one, in words, and refuses
    before anything is handed to Raft."""

    def __init__(self) -> None:
        self.pending: str | None = None  # "adding 10.0.0.4:7000", while it is in flight

    async def run(self, what: str, start: Callable[[Callback], None], token: trio.lowlevel.TrioToken,
                  timeout: float) -> Any | None:
        """Start one change (`start` hands Raft its callback) and wait for its commit.

        Returns pysyncobj's FAIL_REASON, or None when no answer came within `timeout` (the
        change may still commit). Raises `MembershipBusy` when a change is in flight, or when
        Raft refused it because the previous one is not committed yet."""
        if self.pending is not None:
            raise MembershipBusy(f"another membership change is in progress ({self.pending}); "
                                 f"one change at a time: retry once it is done (`llmgw ctl members` shows the group)")
        answer: Handoff[Any] = Handoff(token)

        def on_result(result: Any, error: Any) -> None:  # runs in the Raft thread
            answer.give(error)

        self.pending = what
        try:
            start(on_result)
            slot = await answer.wait(timeout)
        finally:
            self.pending = None
        if slot and slot[0] == FAIL_REASON.REQUEST_DENIED:
            raise MembershipBusy(f"Raft refused {what}: the previous membership change is not committed yet, or this"
                                 f" leader has not committed an entry of its term yet; retry in a moment")
        return slot[0] if slot else None


def keep_a_group_of_one(snapshots: SnapshotFiles, self_addr: str) -> None:
    """A group of one whose member now listens elsewhere (`llmgw up` takes a free Raft port at each
    start) is still a group of one. Its snapshot names the group as it was, the old address alone,
    and Raft would wait for that address as a peer forever; it names this address instead. A
    larger group keeps its list: there, a member's address is its name."""
    snap = snapshots.loaded
    if snap is not None and len(snap.members) == 1 and snap.members[0] != self_addr:
        log.info("this member was %s when its snapshot was taken; a group of one, now at %s", snap.members[0],
                 self_addr)
        snapshots.loaded = dataclasses.replace(snap, members=(self_addr,))


# --- the group a member starts in -------------------------------------------------------------

GROUP_FILE = "group.json"  # in STATE_DIR/raft: the group the journal starts from, recorded at its first start
_GROUP_FORMAT = "llmgw-raft-group"


def group_at_start(raft_dir: Path, self_addr: str, flags: list[str], snap: Snapshot | None,
                   journal: RaftJournal) -> list[str]:
    """The other members this member's Raft starts from: the group its state dir records, whatever
    its `--peer` flags say, which are read on a state dir's first start only.

    Raft's safety rests on every member counting majorities in the same group: a member that took
    a `--peer` list that disagrees with its log (a typo, a stale config) could elect a leader with
    a majority of a group nobody else has, and two leaders could commit at once. So the group is
    the snapshot's members (or the one recorded in `group.json` at the first start), then the
    membership changes in the journal; flags that disagree with it are refused with one warning,
    naming both, and the member starts in its recorded group. A group of one stays one (`llmgw
    up` moves its Raft port at each start). Raises `CannotStart` when the record cannot be written."""
    path = raft_dir / GROUP_FILE
    given = sorted({self_addr, *flags})
    recorded = _read_group(path)
    if snap is not None:
        base = list(snap.members)
    elif recorded is not None:
        base = recorded
    else:
        base = given
    after = snap.last[1] if snap is not None else 0
    if len(base) == 1 and not flags:
        base = [self_addr]  # a group of one, wherever it listens now
    elif self_addr not in base and self_addr not in _replay_changes(base, journal, after):
        # (a member removed and added again, `--rejoin`: the snapshot it was sent may predate its
        # return, which the journal after it holds)
        raise startup.CannotStart(
            f"this state dir belongs to a member of the group {', '.join(base)}, and {self_addr} is not one: a "
            f"member's Raft address is its name in the group. Start it with its own --raft-addr, or with an "
            f"empty state dir to join as a new member (`llmgw ctl members add`)")
    if recorded != base and snap is None:
        _write_group(path, base)
    current = _replay_changes(base, journal, after)
    if current != given:
        gone = "" if self_addr in current else " (this member was removed from it: start it with an empty state dir)"
        where = "its snapshot and journal" if snap is not None else f"{path} and the journal"
        log.warning("refused --peer %s: this member's group, as its state dir records it (%s), is %s%s; this member "
                    "(%s) starts in that group, since --peer is read on a state dir's first start only. Give --peer "
                    "as the group is, and change the group with `llmgw ctl members add|remove`",
                    " --peer ".join(flags) or "(none)", where, ", ".join(current), gone, self_addr)
    return [m for m in base if m != self_addr]


def _replay_changes(base: list[str], journal: RaftJournal, after: int) -> list[str]:
    """The group after the journal's membership changes (pysyncobj's entries) past index `after`."""
    group = set(base)
    for command, idx, _term in (journal[i] for i in range(len(journal))):
        if idx <= after or not command or command[0] != _COMMAND_TYPE.MEMBERSHIP:
            continue
        try:
            change = unpickle.loads(command[1:])  # our own checksummed journal, as pysyncobj reads it
            kind, node = change[0], str(change[1])
        except Exception as e:  # pysyncobj decides what such an entry means; this is only the warning's view
            log.debug("membership entry %d not read for the --peer check: %r", idx, e)
            continue
        if kind == "add":
            group.add(node)
        elif kind == "rem":
            group.discard(node)
    return sorted(group)


def _read_group(path: Path) -> list[str] | None:
    try:
        doc = json.loads(path.read_text())
        members = doc["members"]
        if doc.get("format") != _GROUP_FORMAT or not all(isinstance(m, str) for m in members):
            raise ValueError("not a group record")
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise startup.CannotStart(f"cannot read this member's group record {path} ({e}): move it away to take "
                                  f"the group from --peer (every member's address, as the group is)") from None
    return sorted(members)


def _write_group(path: Path, members: list[str]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        with tmp.open("w") as f:
            json.dump({"format": _GROUP_FORMAT, "version": 1, "members": members}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except OSError as e:
        raise startup.CannotStart(f"cannot record this member's group in {path}: {e.strerror or e}") from None
