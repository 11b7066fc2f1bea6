"""What this release writes into the replicated log and snapshots, and what it can read: its store level.

A release that brings a new command type, a new entry format or a new state field that an older
member cannot read raises `LEVEL` by one, names itself in `RELEASES`, and lists what it brought in
`OPS_SINCE` (a new state field goes in `codec.LATER_FIELDS`: written only once a command set it).
Every control plane announces its level (`member.announce`); the leader raises the group's level
(`ClusterState.store_level`, command `cluster.level`) once every member of the Raft group announced
at least that level. A command of a higher level than the group's is refused before it is logged
(`upgrade_pending`), so a half-upgraded group never writes what one of its members cannot apply.

A member that still meets such an entry (or a snapshot with such content: `codec`) stops applying
and refuses to go on, saying which release it needs (`NewerThanThisRelease`): it never skips what it
cannot read, since its state would silently differ from the others'.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

LEVEL = 3

# The first release at each level.
RELEASES: Mapping[int, str] = {1: "0.1.0", 2: "0.2.0", 3: "0.3.0"}

# Operations brought after level 1, with the level that brought them; every other known one is level 1.
OPS_SINCE: Mapping[str, int] = {"mirror.put": 3, "mirror.remove": 3, "mirror.pin": 3,  # the model mirror
                                 "node.approve": 3,  # approved nodes (`nodes.require_approval`)
                                 "node.cordon": 3,  # cordoned and draining nodes (maintenance)
                                 "node.forget": 3,  # a forgotten node's placements go with it
                                 "placement.sleep": 3,  # fast wake: a placement asleep or awake
                                 "condition.update": 3}  # conditions posted as started (llmgw/notify)

# Levels 2 (0.2.0) and 3 (0.3.0) brought no new operation but new fields of stored definitions, and new
# values (`codec.LATER_FIELDS` and `LATER_VALUES`, each with its level: 2 a model's fallbacks, aliases and
# routing, a key's priority; 3 the rerank role, adapters): a command that sets one needs that level
# (`stamp` with `codec.later_level`), one that leaves them at their defaults is the level-1 command it was.


class NewerThanThisRelease(BaseException):
    """An entry or snapshot written by a newer release than this one reads.

    A BaseException: nothing that records a refused command as a no-op (`except Exception`) may catch
    it; the store stops applying at that entry and the member refuses to go on (store/raft.py)."""

    def __init__(self, what: str, level: int, release: str, *, said: str = "") -> None:
        """`what` was written by a newer release, of store level `level` (first `release`); `said`: the
        words for what happened instead ("the log moves the group to ...")."""
        needs = f"llmgw {release} or newer" if release else f"a llmgw of store level {level} or newer"
        super().__init__(f"{said or f'{what} was written by a newer llmgw (store level {level})'}; this one "
                         f"reads up to store level {LEVEL}: run {needs}")
        self.level = level
        self.release = release


def op_level(op: str) -> int:
    return OPS_SINCE.get(op, 1)


def stamped(op: str) -> dict[str, Any]:
    """The fields a command of `op` carries so that an older member knows it cannot read it: its level
    and the release that brought it (none for a level-1 command)."""
    level = op_level(op)
    return {} if level == 1 else {"needs_level": level, "needs_release": RELEASES.get(level, "")}


def stamp(command: dict[str, Any], level: int) -> dict[str, Any]:
    """`command` marked as one of store level `level` (unchanged for level 1), whatever its op."""
    if level <= 1:
        return command
    return {**command, "needs_level": level, "needs_release": RELEASES.get(level, "")}


def command_level(command: Mapping[str, Any]) -> int:
    """The level a command needs: the one it carries (an older member cannot know its op), else its op's."""
    level = command.get("needs_level")
    if type(level) is int and level > 1:
        return level
    op = command.get("op")
    return op_level(op) if isinstance(op, str) else 1


def check_readable(command: Mapping[str, Any], what: str = "") -> None:
    """Raise `NewerThanThisRelease` for a command (or a snapshot, with its level marks: `what`) written by
    a release of a higher level than this one."""
    level = command.get("needs_level")
    if type(level) is int and level > LEVEL:
        since = command.get("needs_release")
        raise NewerThanThisRelease(what or f"the command {command.get('op')!r:.60} in the log", level,
                                   since if isinstance(since, str) else "")


def release_of(level: int) -> str:
    """The first release of `level`; "" when this release does not know it."""
    return RELEASES.get(level, "")


def group_level(announced: Iterable[int]) -> int:
    """The level every member of a group can read: the lowest one announced (a member that announced no
    level counts as level 1)."""
    return min((max(level, 1) for level in announced), default=1)
