"""Several control planes as one group: each member's announcement (its admin URL, into the
replicated state), requests a standby forwards to the leader, the member table, membership changes.

A standby answers nothing from its own copy of the state: every admin request but the
member-local ones (`/api/v1/cluster/self`, `/api/v1/cluster/members`) is forwarded to the leader,
so a read that follows a write sees it wherever it is sent, and what only the leader holds
(agents, gateways, the reconciler's views) is shown as the leader sees it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import httpx
import trio

from llmgw import __version__, release
from llmgw.domain import commands, levels, summary
from llmgw.domain.codec import state_hash
from llmgw.domain.commands import CommandError
from llmgw.domain.state import ClusterState
from llmgw.domain.timeouts import TIMEOUTS, Timeouts
from llmgw.errors import AdminError
from llmgw.interfaces import RaftGroup, WritableStore
from llmgw.store import CommitUnknown, NotLeader, StoreUnavailable
from llmgw.store.membership import MembershipBusy

if TYPE_CHECKING:
    from llmgw.control.floating import FloatingDuty
    from llmgw.control.gateway_stream import GatewayHub
    from llmgw.control.hub import AgentHub

log = logging.getLogger("llmgw.control.members")

SELF_PATH = "/api/v1/cluster/self"
_STARTED_AT = time.time()  # when this process started (a restart in place keeps its pid, not this)
# Set by a standby on what it forwards: the leader that gets it never forwards it again.
FORWARDED_BY = "x-llmgw-forwarded-by"
# Set on the answer a standby relays: which member answered it.
ANSWERED_BY = "x-llmgw-answered-by"
_FORWARDED_HEADERS = ("authorization", "idempotency-key", "content-type", "accept", "content-range")
_READS = frozenset({"GET", "HEAD"})


def advertised_url(bound: str, raft_addr: str) -> str:
    """The admin URL others dial: as bound, but a wildcard host (0.0.0.0, ::) is replaced by the
    host of the Raft address, which names this member on the cluster's network."""
    parts = urllib.parse.urlsplit(bound)
    try:
        wildcard = ipaddress.ip_address(parts.hostname or "").is_unspecified
    except ValueError:
        wildcard = False
    if not wildcard:
        return bound.rstrip("/")
    return f"{parts.scheme}://{raft_addr.rpartition(':')[0]}:{parts.port}"


def member_addr(text: Any) -> str:
    """A Raft address as a member is named: HOST:PORT, not a wildcard; else 400 with words."""
    if not isinstance(text, str):
        raise AdminError(400, "invalid_member", 'send {"raft_addr": "HOST:PORT"}: the new member\'s --raft-addr')
    host, _, port = text.rpartition(":")
    # A host name (ASCII letters, digits, '.', '-') or an IP address: anything else is no address the
    # resolver could take (it raised from deep in getaddrinfo: a 500 before this check).
    if (not host or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536 or len(host) > 255
            or not all(c.isascii() and (c.isalnum() or c in ".-:[]") for c in host)):
        raise AdminError(400, "invalid_member", f"{text!r:.80} is not HOST:PORT (the new member's --raft-addr)")
    try:
        wildcard = ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        wildcard = False
    if wildcard:
        raise AdminError(400, "invalid_member", f"{text} names no machine: give the member's --raft-addr as its "
                                                f"peers dial it")
    return text


@dataclass(frozen=True)
class Forwarded:
    """The leader's answer to a request a standby forwarded, relayed as it came (`answered_by`: the leader)."""

    status: int
    body: bytes
    content_type: str
    answered_by: str


@dataclass(eq=False)
class Members:
    """This member's side of the group: what it says of itself, what it forwards, what it lists.

    `admin_url` is set once the admin API listens; `transport` is httpx's (tests pass a fake);
    `http`: the client forwards and probes go through (kept open: a new client costs ~60 ms of
    TLS setup); None: one per call.
    `agents`, `gateways` and `floating` are what this member lists while it leads (its agents'
    and gateways' streams) and says of its floating address (None: not configured)."""

    store: WritableStore
    group: RaftGroup
    _: KW_ONLY
    self_addr: str
    clock: Callable[[], float]
    timeouts: Timeouts = TIMEOUTS
    transport: httpx.AsyncBaseTransport | None = None
    http: httpx.AsyncClient | None = None
    agents: AgentHub | None = None
    gateways: GatewayHub | None = None
    floating: FloatingDuty | None = None
    admin_url: str | None = field(default=None, init=False)
    # member -> when it last answered this one (clock time)
    _contact: dict[str, float] = field(default_factory=dict, init=False, repr=False)
    _hashed: tuple[ClusterState, str] | None = field(default=None, init=False, repr=False)

    # -- what this member says of itself --------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The group's status (`RaftGroup.status`) and `leader_url`: the leader's admin URL as it
        announced it (None until it has), where a standby forwards, and gateways and agents go."""
        st = self.group.status()
        announced = self.store.snapshot().members.get(st.get("leader") or "")
        return {**st, "leader_url": announced.admin_url if announced is not None else None}

    def addresses(self, status: Mapping[str, Any]) -> list[str]:
        """The group as this member's Raft sees it (itself included), sorted."""
        partners = status.get("partners")
        return sorted({self.self_addr, *(partners if isinstance(partners, Mapping) else {})})

    def self_doc(self) -> dict[str, Any]:
        """`GET /api/v1/cluster/self`: this member's role, indexes and state hash, as it sees them."""
        st = self.group.status()
        state = self.store.snapshot()
        if self._hashed is None or self._hashed[0] is not state:  # states are values: one hash each
            self._hashed = (state, state_hash(state))
        return {
            "id": self.self_addr,
            "raft_addr": self.self_addr,
            "admin_url": self.admin_url,
            "version": __version__,
            # The release file this member runs, by sha256 (None, with why: not a zipapp): `ctl upgrade` judges by it.
            "release_sha256": release.running().sha256,
            "release_reason": release.running().reason or None,
            "pid": os.getpid(),
            "started_at": _STARTED_AT,
            "role": "leader" if st.get("is_leader") else "standby",
            "leader": st.get("leader"),
            "ready": bool(st.get("ready")),
            "term": st.get("term"),
            "commit_index": st.get("commit_index"),
            "applied_index": st.get("last_applied"),
            "revision": state.revision,
            "state_hash": self._hashed[1],
            "group": self.addresses(st),
            # Each other member's Raft link as this one holds it ("tls", "sealed", "down"), and since when
            # the group requires TLS between its members (None: not yet; docs/security.md).
            "raft_links": dict(st.get("links") or {}),
            "raft_tls_since": state.raft_tls_since or None,
            # The store level this member's release reads, and the one the group writes at (docs/operations.md,
            # "Upgrade"): a command of a higher level than the group's is refused with `upgrade_pending`.
            "store_level": levels.LEVEL,
            "group_store_level": state.store_level,
            "floating": {"configured": False} if self.floating is None else {"configured": True,
                                                                               **self.floating.status()},
            **self._followers(bool(st.get("is_leader"))),
        }

    def _followers(self, leading: bool) -> dict[str, Any]:
        """The agents and gateways attached to this member, with their last contact's age by this
        member's clock; None on a standby (they attach to the leader alone: it does not know them)."""
        if not leading:
            return {"agents": None, "gateways": None}
        now = self.clock()

        def aged(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return [{**d, "last_contact_age_s": round(max(now - d["last_contact"], 0.0), 3)
                     if isinstance(d.get("last_contact"), (int, float)) else None} for d in docs]

        return {"agents": None if self.agents is None else aged(self.agents.agents()),
                "gateways": None if self.gateways is None else aged(self.gateways.gateways())}

    async def announce_forever(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep this member's announcement (admin URL, version) in the replicated state: sent
        through the leader once the admin API listens, and again whenever the state says otherwise.

        Started once a leader's first attempt is over (applied, so a role that has started changes
        its state no more by itself, or refused: it still serves); a standby's goes on in the background."""
        unstarted = [task_status]

        def started() -> None:
            if unstarted:
                unstarted.pop().started()

        if not self.store.is_leader():
            started()
        failures = 0
        while True:
            state = self.store.snapshot()
            mine = state.members.get(self.self_addr)
            url = self.admin_url
            if url is not None and (mine is None or (mine.admin_url, mine.version, mine.level)
                                    != (url, __version__, levels.LEVEL)):
                try:
                    await self.group.submit(commands.announce_member(self.self_addr, url, __version__, self.clock()),
                                            through_leader=True)
                except (CommandError, StoreUnavailable, NotLeader) as e:
                    failures += 1
                    started()
                    if failures & (failures - 1) == 0:  # the 1st, 2nd, 4th, ... failure
                        log.warning("could not announce this member (%s at %s) to the group: %s (attempt %d; "
                                    "retrying every %g s)", self.self_addr, url, e, failures,
                                    self.timeouts.member_announce_retry_s)
                    await trio.sleep(self.timeouts.member_announce_retry_s)
                else:
                    log.info("announced to the group: member %s, admin API %s", self.self_addr, url)
                    failures = 0
                continue
            started()
            await self.store.wait_changed(state.revision)

    async def raise_level_forever(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """On the leader: raise the group's store level (`cluster.level`) to the lowest level the members of
        the Raft group announced, once that is above the group's; a member that has not announced one yet
        counts as level 1 (llmgw.domain.levels). Looked at on every change, and every
        `member_announce_retry_s` (a membership change is no change of the state).

        Started once a leader's first pass is over, as `announce_forever`: a new group (its one member
        announced) is at this release's level before the role reports started, so it changes its state
        no more by itself."""
        unstarted = [task_status]
        while True:
            state = self.store.snapshot()
            if self.store.is_leader():
                announced = state.members
                group = self.addresses(self.group.status())
                target = levels.group_level(announced[m].level if m in announced else 1 for m in group)
                if target > state.store_level:
                    try:
                        await self.group.submit(commands.raise_level(target, self.clock()))
                    except (CommandError, StoreUnavailable, NotLeader, CommitUnknown) as e:
                        log.warning("could not raise the group's store level to %d: %s (retrying)", target, e)
                    else:
                        log.info("every control plane reads store level %d (%s): the group writes at it from now on",
                                 target, ", ".join(f"{m} {announced[m].version}" for m in group if m in announced))
            if unstarted:
                unstarted.pop().started()
            with trio.move_on_after(self.timeouts.member_announce_retry_s):
                await self.store.wait_changed(state.revision)

    # -- forwarding -------------------------------------------------------------------------

    async def forward(self, method: str, path: str, body: bytes, headers: Any) -> Forwarded:
        """Send a request this standby got to the leader's admin API and relay its answer as is.

        With no leader, or none reachable, an `AdminError` (503) says so; a write whose answer
        did not come back is `CommitUnknown` (it may have been applied)."""
        st = self.status()
        leader, url = st.get("leader"), st.get("leader_url")
        by = headers.get(FORWARDED_BY)
        if by:
            now = f"; the leader is now {leader}" if leader and leader != self.self_addr else ""
            raise AdminError(503, "not_leader", f"{by} forwarded this request to {self.self_addr} as the leader, but "
                                                f"it does not lead (leadership moved{now}); nothing was done: retry")
        if leader is None or leader == self.self_addr:
            raise AdminError(503, "no_leader", f"no leader is elected now, and this member ({self.self_addr}) is a "
                                               f"standby: it forwards requests to the leader. An election takes about"
                                               f" a second; if this lasts, a majority of the group is down or cut off"
                                               f" (`llmgw ctl members` on this member shows who answers)")
        if url is None:
            raise AdminError(503, "leader_unreachable", f"the leader ({leader}) has not announced its admin URL yet "
                                                        f"(it does once it is ready); retry shortly")
        sent = {k: v for k in _FORWARDED_HEADERS if (v := headers.get(k)) is not None}
        sent[FORWARDED_BY] = self.self_addr
        done = "read" if method in _READS else "written"
        try:
            async with self._client() as client:
                r = await client.request(method, url + path, content=body, headers=sent,
                                         timeout=self.timeouts.admin_forward_s)
        except (httpx.ConnectError, httpx.ConnectTimeout) as e:  # nothing reached the leader
            raise AdminError(503, "leader_unreachable", f"this member ({self.self_addr}) is a standby and forwards to "
                                                        f"the leader {leader} at {url}, which it cannot reach "
                                                        f"({_why(e)}); nothing was {done}: retry shortly") from None
        except httpx.HTTPError as e:
            what = f"forwarded to the leader {leader} at {url}, whose answer did not come back ({_why(e)})"
            if method in _READS:
                raise AdminError(503, "leader_unreachable", f"this member is a standby; the request was {what}")
            raise CommitUnknown(what) from None
        return Forwarded(r.status_code, r.content, r.headers.get("content-type", "application/json"), leader)

    def client(self) -> contextlib.AbstractAsyncContextManager[httpx.AsyncClient]:
        """The client members talk to each other with (their control certificate when the group speaks TLS)."""
        return self._client()

    def _client(self) -> contextlib.AbstractAsyncContextManager[httpx.AsyncClient]:
        """The kept client (left open), or a client of its own for one call."""
        if self.http is not None:
            return contextlib.nullcontext(self.http)
        return httpx.AsyncClient(transport=self.transport)

    # -- the member table -------------------------------------------------------------------

    async def table(self, authorization: str | None) -> dict[str, Any]:
        """`GET /api/v1/cluster/members`: every member of the group as this one sees it, each asked
        for its own view (`/api/v1/cluster/self`, with the caller's key) within `member_probe_s`."""
        st = self.status()
        state = self.store.snapshot()
        group = self.addresses(st)
        views: dict[str, dict[str, Any]] = {}
        for addr in group:
            announced = state.members.get(addr)
            views[addr] = {"id": addr, "admin_url": announced.admin_url if announced is not None else None}
        views[self.self_addr]["answer"] = self.self_doc()
        self._contact[self.self_addr] = self.clock()
        async with self._client() as client:
            async with trio.open_nursery() as nursery:
                for addr in group:
                    if addr != self.self_addr:
                        nursery.start_soon(self._probe, client, views[addr], authorization)
        for addr, view in views.items():
            view["last_contact"] = self._contact.get(addr)
        listed = [views[a] for a in group]
        rows = summary.member_rows(listed, self.clock())
        leader = st.get("leader")
        floating = summary.floating_address(listed, leader)
        return {
            "self": self.self_addr,
            "leader": leader,
            "leader_url": st.get("leader_url"),
            "version": __version__,
            "member_change": st.get("member_change"),
            "members": rows,
            "floating_address": floating,
            **summary.followers(listed, leader),
            "warnings": summary.member_warnings(rows) + summary.floating_warnings(floating, leader),
        }

    async def _probe(self, client: httpx.AsyncClient, view: dict[str, Any], authorization: str | None) -> None:
        url = view["admin_url"]
        if url is None:
            view["error"] = "it has not announced its admin URL (not started yet, or never became ready)"
            return
        try:
            r = await client.get(url + SELF_PATH, headers={"authorization": authorization} if authorization else {},
                                 timeout=self.timeouts.member_probe_s)
            doc = r.json() if r.status_code == 200 else None
        except httpx.TimeoutException:
            view["error"] = f"no answer from {url} within {self.timeouts.member_probe_s:g} s"
            return
        except httpx.HTTPError as e:
            view["error"] = f"{url} is not reachable ({_why(e)})"
            return
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            view["error"] = f"{url} answered status {r.status_code}: {_excerpt(r.text)}"
        elif doc.get("raft_addr") != view["id"]:
            view["error"] = f"{url} is member {doc.get('raft_addr')!r}, not {view['id']} (an old announcement?)"
        else:
            view["answer"] = doc
            self._contact[view["id"]] = self.clock()

    # -- membership changes (on the leader) -------------------------------------------------

    def _no_change_in_flight(self, st: Mapping[str, Any]) -> None:
        if st.get("member_change"):
            raise AdminError(409, "membership_change_in_progress",
                             f"another membership change is in progress ({st['member_change']}): one at a time; "
                             f"retry once it is done")

    def _up(self, st: Mapping[str, Any]) -> set[str]:
        """This member and those its Raft is connected to."""
        partners = st.get("partners")
        connected = {a for a, v in partners.items() if v == 2} if isinstance(partners, Mapping) else set()
        return {self.self_addr, *connected}

    async def add(self, raft_addr: Any) -> dict[str, Any]:
        """Add a member that already runs (`llmgw control --join ...`); returns once committed."""
        addr = member_addr(raft_addr)
        st = self.group.status()
        group = self.addresses(st)
        if addr in group:
            raise AdminError(409, "member_exists", f"{addr} is already a member ({', '.join(group)})")
        self._no_change_in_flight(st)
        if not await self._listens(addr):
            raise AdminError(409, "member_unreachable",
                             f"nothing answers at {addr}: start the new member first (llmgw control --join "
                             f"--raft-addr {addr} {' '.join('--peer ' + a for a in group)} --cluster-secret-file "
                             f"COPY_OF_cluster.secret ...), then add it")
        up, size = self._up(st), len(group) + 1
        if len(up) + 1 < size // 2 + 1:
            raise AdminError(409, "would_lose_quorum",
                             f"with {addr} the group has {size} members and needs {size // 2 + 1} up to commit; only "
                             f"{len(up)} are ({', '.join(sorted(up))}) besides it: bring the missing members back, "
                             f"or remove them, first")
        await self._change(self.group.add_member, addr)
        return {"added": addr, "members": sorted([*group, addr])}

    async def remove(self, member_id: str) -> dict[str, Any]:
        """Remove a member (not the leader itself); returns once committed, then forgets its
        announcement."""
        st = self.group.status()
        group = self.addresses(st)
        if member_id not in group:
            raise AdminError(404, "member_not_found", f"no member {member_id!r} in the group ({', '.join(group)}); "
                                                      f"members are named by their Raft address")
        if member_id == self.self_addr:
            raise AdminError(409, "member_leads",
                             f"{member_id} leads the group and a leader cannot remove itself: stop it (another member "
                             f"takes over within seconds), then remove it through any other member")
        self._no_change_in_flight(st)
        rest = [a for a in group if a != member_id]
        up = self._up(st) - {member_id}
        if len(up) < len(rest) // 2 + 1:
            raise AdminError(409, "would_lose_quorum",
                             f"without {member_id} the group has {len(rest)} members and needs {len(rest) // 2 + 1} up "
                             f"to commit; only {len(up)} are ({', '.join(sorted(up))}): bring the missing members "
                             f"back, or remove a missing one first")
        await self._change(self.group.remove_member, member_id)
        try:  # the table follows Raft's group anyway; this only tidies the state
            await self.store.submit(commands.forget_member(member_id, self.clock()))
        except (CommandError, StoreUnavailable, NotLeader) as e:
            log.warning("removed %s from the group, but its announcement stays in the state: %s", member_id, e)
        return {"removed": member_id, "members": rest}

    async def _change(self, change: Callable[[str], Any], addr: str) -> None:
        try:
            await change(addr)
        except MembershipBusy as e:
            raise AdminError(409, "membership_change_in_progress", str(e)) from None

    async def _listens(self, addr: str) -> bool:
        host, _, port = addr.rpartition(":")
        with trio.move_on_after(self.timeouts.member_probe_s):
            try:
                stream = await trio.open_tcp_stream(host.strip("[]"), int(port))
            except OSError:
                return False
            await stream.aclose()
            return True
        return False


def _why(e: Exception) -> str:
    text = str(e) or type(e).__name__
    return "connection refused" if "refused" in text.lower() else text


def _excerpt(text: str, limit: int = 200) -> str:
    try:
        doc = json.loads(text)
        error = doc.get("error") if isinstance(doc, dict) else None
        if isinstance(error, dict):
            return f"{error.get('code')}: {error.get('message')}"[:limit]
    except ValueError:
        pass
    return " ".join(text.split())[:limit] or "(empty)"
