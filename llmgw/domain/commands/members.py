"""The member commands: `member.announce` (a control-plane member's Raft address, admin URL,
version and store level), `member.forget` (by Raft address) and `cluster.level` (the group's store
level raised, once every member reads it: `llmgw.domain.levels`); their builders, checks and changes.

A forget of an address no longer announced is no change (`forgotten` false), so a retry is harmless.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from llmgw.domain import levels
from llmgw.domain.commands.core import CommandError, make, readonly, required
from llmgw.domain.state import ClusterState, Member

FIELD_MAX_CHARS = 300  # a member's address, URL or version, as announced
LEVEL_MAX = 1000  # a store level, as announced or raised to


def announce_member(raft_addr: str, admin_url: str, version: str, at: float,
                    level: int = levels.LEVEL) -> dict[str, Any]:
    return make("member.announce", at, raft_addr=raft_addr, admin_url=admin_url, version=version, reads=level)


def raise_level(to: int, at: float) -> dict[str, Any]:
    return make("cluster.level", at, to=to, release=levels.release_of(to))


def forget_member(raft_addr: str, at: float) -> dict[str, Any]:
    return make("member.forget", at, raft_addr=raft_addr)


def check_raft_addr(c: dict[str, Any]) -> None:
    """The member's Raft address, HOST:PORT: all `member.forget` names, and `member.announce` too."""
    addr = required(c, "raft_addr")
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536 or len(addr) > FIELD_MAX_CHARS:
        raise CommandError("invalid_member", f"raft_addr must be HOST:PORT, not {addr!r:.80}")


def check_announce(c: dict[str, Any]) -> None:
    check_raft_addr(c)
    url, version = c.get("admin_url"), c.get("version")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")) or len(url) > FIELD_MAX_CHARS:
        raise CommandError("invalid_member", f"admin_url must be an http(s) URL, not {url!r:.80}")
    if not isinstance(version, str) or len(version) > FIELD_MAX_CHARS:
        raise CommandError("invalid_member", "version must be a string")
    reads = c.get("reads", 0)  # absent in an announcement logged before store levels: 0, none announced
    if type(reads) is not int or not 0 <= reads <= LEVEL_MAX:
        raise CommandError("invalid_member", f"reads (a store level) must be an integer 0..{LEVEL_MAX}")


def apply_announce(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    addr = c["raft_addr"]
    member = Member(addr, c["admin_url"], c["version"], at, c.get("reads", 0))
    return replace(s, members=readonly(s.members | {addr: member})), {"announced": addr}


def apply_forget(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    addr = c["raft_addr"]
    if addr not in s.members:
        return s, {"forgotten": False}
    return replace(s, members=readonly({k: v for k, v in s.members.items() if k != addr})), {"forgotten": True}


def check_level(c: dict[str, Any]) -> None:
    to = c.get("to")
    if type(to) is not int or not 1 <= to <= LEVEL_MAX:
        raise CommandError("bad_command", f"to (a store level) must be an integer 1..{LEVEL_MAX}")


def apply_level(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    """Raise the group's store level to `to`, once every announced member reads it (the leader asks only
    then; a member announced lower since is in the way, and the raise is refused). A member of a lower
    level that applies it stops (`levels.NewerThanThisRelease`): what the group writes next, it cannot read."""
    to = c["to"]
    if to <= s.store_level:
        return s, {"level": s.store_level, "raised": False}
    behind = sorted(m.raft_addr for m in s.members.values() if max(m.level, 1) < to)
    if behind:
        raise CommandError("upgrade_pending", upgrade_pending(s, "cluster.level", to))
    if to > levels.LEVEL:
        raise levels.NewerThanThisRelease("", to, str(c.get("release", "")),
                                          said=f"the log moves the group to store level {to}")
    return replace(s, store_level=to), {"level": to, "raised": True}


def upgrade_pending(s: ClusterState, op: object, needs: int) -> str:
    """Why a command of store level `needs` is refused now: the members whose release reads less."""
    release = levels.release_of(needs)
    behind = sorted((m for m in s.members.values() if max(m.level, 1) < needs), key=lambda m: m.raft_addr)
    who = ", ".join(f"{m.raft_addr} ({m.version or 'version unknown'})" for m in behind) or \
        "none announced lower: the leader raises the group's level at its next check"
    return (f"{op!s:.60} needs every control plane on {f'llmgw {release}' if release else f'store level {needs}'} "
            f"or newer (the group writes at store level {s.store_level}); still older: {who}. "
            f"Nothing was written: upgrade them (`llmgw ctl upgrade`), then retry")
