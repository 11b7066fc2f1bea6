"""The member commands: `member.announce` (a control-plane member's Raft address, admin URL and
version) and `member.forget` (by Raft address); their builders, stateless checks and changes.

A forget of an address no longer announced is no change (`forgotten` false), so a retry is harmless.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from llmgw.domain.commands.core import CommandError, make, readonly, required
from llmgw.domain.state import ClusterState, Member

FIELD_MAX_CHARS = 300  # a member's address, URL or version, as announced


def announce_member(raft_addr: str, admin_url: str, version: str, at: float) -> dict[str, Any]:
    return make("member.announce", at, raft_addr=raft_addr, admin_url=admin_url, version=version)


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


def apply_announce(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    addr = c["raft_addr"]
    member = Member(addr, c["admin_url"], c["version"], at)
    return replace(s, members=readonly(s.members | {addr: member})), {"announced": addr}


def apply_forget(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    addr = c["raft_addr"]
    if addr not in s.members:
        return s, {"forgotten": False}
    return replace(s, members=readonly({k: v for k, v in s.members.items() if k != addr})), {"forgotten": True}
