"""The leader's memory of its agents: inventories, replica reports, open streams, last contact,
and the nodes it lost (kept, as lost, until an operator forgets them).

Rebuilt from scratch when agents reconnect; never written to Raft. A member that starts
leading begins a new term here (`take_office`); one that stops lets its agents go (`release`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Literal, Mapping

import trio

from llmgw.domain.observed import NodeInfo, Observed, ReplicaObs
from llmgw.domain.timeouts import TIMEOUTS, Timeouts

log = logging.getLogger("llmgw.control.hub")
MAX_JUDGES_REMEMBERED = 256  # judge models with a remembered failure (a gateway names whatever a policy says)
JUDGE_WORDS_MAX_CHARS = 500


@dataclass
class AgentLink:
    node: str
    send: trio.MemorySendChannel[dict[str, Any]]
    sent_starts: dict[str, float] = field(default_factory=dict)  # replica id -> when sent


class AgentHub:
    """What every connected agent said last, plus a way to talk to each."""

    def __init__(self, clock: Callable[[], float] = time.time, timeouts: Timeouts = TIMEOUTS) -> None:
        self._clock = clock
        self._resend_s = timeouts.start_resend_s  # a start not acted on is sent again after this long
        self.heartbeat_s = timeouts.stream_heartbeat_s  # each stream sends a heartbeat when quiet this long
        self.silence_s = timeouts.stream_silence_s  # a stream that says nothing this long is dropped
        self.grace_s = timeouts.lost_node_grace_s  # a node gone this long is lost: its placements go
        self.since = clock()
        self.nodes: dict[str, NodeInfo] = {}
        self.replicas: dict[str, dict[str, ReplicaObs]] = {}  # node -> replica id -> report
        self.links: dict[str, AgentLink] = {}
        self.sources: dict[str, dict[str, Any]] = {}  # see `Observed.sources`
        self.lost: dict[str, float] = {}
        self.demand: dict[str, float] = {}
        # Load: model -> requests in flight or waiting now (every router's, summed), and the
        # window's peaks as (time, count), the counts falling: the first is the peak of the last
        # `scale_down_delay_s`. Evictions: model -> (when, why), this term's.
        self.outstanding: dict[str, int] = {}
        self._peaks: dict[str, list[tuple[float, int]]] = {}
        self._peak_window_s = timeouts.scale_down_delay_s
        self.evicted: dict[str, tuple[float, str]] = {}
        self.connected_at: dict[str, float] = {}  # node -> when its current (or last) stream opened
        self.last_contact: dict[str, float] = {}  # node -> when it last said anything (clock time)
        # node -> the sha256 of the release file its agent runs (said in its hello), or None with why: `ctl upgrade`.
        self.releases: dict[str, tuple[str | None, str]] = {}
        # node -> why its agent refused the last upgrade asked of it (`rejected` upgrade_agent); cleared by the next ask.
        self.upgrade_refused: dict[str, str] = {}
        self.judge_failures: dict[str, tuple[float, str]] = {}  # judge model -> (when, words): its last failure
        # Restarts (failed starts, crashes) per model: their times within `restart_window_s`, and a count
        # since this member started (metrics' counter); this leader's memory, like the rest.
        self._restart_window_s = timeouts.restart_window_s
        self.restarts: dict[str, list[float]] = {}
        self.restarts_total: dict[str, int] = {}
        self._changed = trio.Event()

    # -- what the agent server calls ------------------------------------------

    def connect(self, node: str, send: trio.MemorySendChannel[dict[str, Any]]) -> AgentLink:
        old = self.links.get(node)
        if old is not None:
            log.warning("node %s connected again: closing its previous stream", node)
            old.send.close()
        link = AgentLink(node, send)
        self.links[node] = link
        self.lost.pop(node, None)
        self.connected_at[node] = self.last_contact[node] = self._clock()
        self.changed()
        return link

    def heard(self, link: AgentLink) -> None:
        """The agent said something (a report or a heartbeat): its last contact is now."""
        if self.links.get(link.node) is link:
            self.last_contact[link.node] = self._clock()

    def disconnect(self, link: AgentLink) -> None:
        if self.links.get(link.node) is not link:
            return  # a newer stream of the same node replaced this one
        del self.links[link.node]
        self.nodes.pop(link.node, None)
        self.replicas.pop(link.node, None)
        self.lost[link.node] = self._clock()
        log.warning("node %s disconnected", link.node)
        self.changed()

    def report_inventory(self, link: AgentLink, inventory: NodeInfo) -> None:
        """The node's inventory, first or again (its storage or GPUs changed): the latest wins."""
        if self.links.get(link.node) is not link:
            return  # a newer stream of the same node replaced this one
        if self.nodes.get(link.node) != inventory:
            self.nodes[link.node] = inventory
            self.changed()

    def report_replicas(self, link: AgentLink, replicas: list[ReplicaObs]) -> None:
        self.replicas[link.node] = {r.replica_id: r for r in replicas}
        for rid in list(link.sent_starts):
            if rid in self.replicas[link.node]:
                del link.sent_starts[rid]
        self.changed()

    # -- what the reconciler calls -------------------------------------------

    def observed(self) -> Observed:
        replicas = {rid: r for per_node in self.replicas.values() for rid, r in per_node.items()}
        return Observed(nodes=dict(self.nodes), replicas=replicas, demand=dict(self.demand),
                        lost=dict(self.lost), since=self.since, outstanding=dict(self.outstanding),
                        peak=self.peaks(), evicted=dict(self.evicted), judge_failures=dict(self.judge_failures),
                        restarts=self.recent_restarts(), sources=self.sources)

    def set_sources(self, facts: dict[str, dict[str, Any]]) -> None:
        """The facts of the models' sources as read where this control plane runs (`SourceFacts`)."""
        if facts != self.sources:
            self.sources = facts
            self.changed()

    def note_demand(self, model: str) -> None:
        self.demand[model] = self._clock()
        self.evicted.pop(model, None)  # asked for again: an eviction no longer speaks for it

    def note_load(self, load: Mapping[str, int]) -> None:
        """The requests in flight or waiting per model now, summed over every router: replaces
        the last word, and feeds each model's peak over the last `scale_down_delay_s`."""
        now = self._clock()
        self.outstanding = {m: n for m, n in load.items() if n > 0}
        for model, n in self.outstanding.items():
            peaks = self._peaks.setdefault(model, [])
            while peaks and peaks[-1][1] <= n:
                peaks.pop()  # a later, higher count outlives it in the window
            peaks.append((now, n))
        for model in list(self._peaks):
            peaks = self._peaks[model]
            while peaks and now - peaks[0][0] > self._peak_window_s:
                peaks.pop(0)
            if not peaks:
                del self._peaks[model]

    def peaks(self) -> dict[str, int]:
        """Model -> the most requests in flight at once over the last `scale_down_delay_s`."""
        return {m: peaks[0][1] for m, peaks in self._peaks.items()}

    def record_judge_failure(self, model: str, words: str, at: float | None = None) -> None:
        """A judge model failed to answer a gateway's check (down, past its budget, an answer that does
        not parse): `ctl guard judge status` and `ctl status` say so. The latest per model is kept
        (`at`: unix time, None = now); this leader's memory only, like the rest of what it observes."""
        if model not in self.judge_failures and len(self.judge_failures) >= MAX_JUDGES_REMEMBERED:
            oldest = min(self.judge_failures, key=lambda m: self.judge_failures[m][0])
            del self.judge_failures[oldest]
        self.judge_failures[model] = (self._clock() if at is None else at, words[:JUDGE_WORDS_MAX_CHARS])

    def note_restart(self, model: str) -> None:
        """A replica of `model` failed to start or crashed, and the reconciler committed it (the
        replica goes and another starts): counted for the restart storm and the metrics."""
        self.restarts.setdefault(model, []).append(self._clock())
        self.restarts_total[model] = self.restarts_total.get(model, 0) + 1

    def recent_restarts(self) -> dict[str, tuple[float, ...]]:
        """Model -> the times of its restarts within `restart_window_s` (older ones forgotten)."""
        since = self._clock() - self._restart_window_s
        for model in list(self.restarts):
            times = self.restarts[model]
            while times and times[0] < since:
                times.pop(0)
            if not times:
                del self.restarts[model]
        return {m: tuple(t) for m, t in self.restarts.items()}

    def note_eviction(self, model: str, why: str) -> None:
        """The leader stopped an idle replica of `model` to make room: the model wants nothing
        until a request newer than this asks for it (`Observed.evicted`)."""
        self.evicted[model] = (self._clock(), why)

    def send(self, node: str, message: dict[str, Any]) -> bool:
        """Queue a message for a node; False when it is not connected or its queue is full."""
        link = self.links.get(node)
        if link is None:
            return False
        if message.get("type") == "start_replica":
            rid = str(message["replica_id"])
            sent = link.sent_starts.get(rid)
            if sent is not None and self._clock() - sent < self._resend_s:
                return True  # already asked; the agent's report will say
            link.sent_starts[rid] = self._clock()
        return self._queue(link, message)

    def changed(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    # -- terms: what the reconciler calls when this member starts or stops leading -------------

    def take_office(self, known: Iterable[str] = ()) -> None:
        """This member leads from now on. Nodes it never heard from count as gone since now, not
        since it started (a standby that takes over after an hour must not find every node "lost"
        at once: their agents are on their way), and demand heard in an earlier term is dropped.
        `known`: the nodes the state places replicas on; one that never connects shows as lost
        once its grace period ends, never silently dropped with its placements. What an earlier term of
        this member remembered of other nodes is dropped with the rest: another leader may have forgotten
        one since (`node.forget`), and every member that takes office knows the same nodes."""
        self.since = self._clock()
        known = set(known)
        self.lost = {node: self.since for node in known if node not in self.links}
        for memory in (self.connected_at, self.last_contact, self.nodes, self.replicas):
            for node in [n for n in memory if n not in self.links and n not in known]:
                del memory[node]
        self.demand.clear()
        self.outstanding.clear()
        self._peaks.clear()
        self.evicted.clear()
        self.changed()

    def release(self, reason: str) -> None:
        """This member no longer leads: tell each agent why and close its stream; the agents look
        for the new leader (engines keep running)."""
        for link in list(self.links.values()):
            try:
                link.send.send_nowait({"type": "refused", "reason": reason})
            except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
                pass  # closing is what matters: the agent reconnects either way
            link.send.close()
        if self.links:
            log.info("letting %d agent(s) go: %s", len(self.links), reason)

    def lose_now(self, node: str, why: str) -> None:
        """Take a node for lost at once, with no grace period (its agent's certificate was revoked:
        it is not coming back as itself): its placements go as a lost node's do."""
        link = self.links.get(node)
        if link is not None:
            self.disconnect(link)
        if node in self.lost:
            self.lost[node] = self._clock() - self.grace_s
            log.warning("node %s is lost: %s", node, why)
            self.changed()

    def node_state(self, node: str) -> Literal["connected", "disconnected", "lost", "unknown"]:
        """connected; disconnected (gone, within its grace period: its placements are kept); lost
        (gone past it: its placements went, it is listed until forgotten); unknown (never heard of)."""
        if node in self.links:
            return "connected"
        if node not in self.lost:
            return "unknown"
        return "lost" if self._clock() - self.lost[node] >= self.grace_s else "disconnected"

    def forget(self, node: str) -> str | None:
        """Forget a lost node (its record in this leader's memory); None when done, else why not.
        A node that connects again later simply reappears. (Its placements in the state go first, with
        `node.forget`: `control.ops.nodes.forget`.)"""
        refusal = self.why_not_forget(node)
        if refusal is not None:
            return refusal
        for memory in (self.lost, self.connected_at, self.last_contact, self.nodes, self.replicas):
            memory.pop(node, None)
        log.info("node %s forgotten", node)
        self.changed()
        return None

    def why_not_forget(self, node: str) -> str | None:
        """Why `forget(node)` would refuse now (None: it would forget it)."""
        state = self.node_state(node)
        if state == "connected":
            return f"node {node} is connected: stop its agent first (a node is forgotten once lost)"
        if state == "disconnected":
            left = self.grace_s - (self._clock() - self.lost[node])
            return (f"node {node} disconnected and is within its grace period (lost_node_grace_s = {self.grace_s:g} s,"
                    f" {left:.0f} s left): its placements are kept in case it comes back; forget it once it is lost")
        if state == "unknown":
            return f"no node named {node!r} is known to this leader"
        return None

    def agents(self) -> list[dict[str, Any]]:
        """Every agent this member has heard from while leading: connected or not, with its last
        contact (unix time) and the replicas it reported (None: not reported on this stream yet)."""
        docs = []
        for node in sorted(set(self.connected_at) | set(self.lost)):
            reported = self.replicas.get(node)
            docs.append({"node": node, "connected": node in self.links, "state": self.node_state(node),
                         "connected_at": self.connected_at.get(node), "last_contact": self.last_contact.get(node),
                         "lost_at": self.lost.get(node), "replicas": None if reported is None else len(reported)})
        return docs

    def _queue(self, link: AgentLink, message: dict[str, Any]) -> bool:
        try:
            link.send.send_nowait(message)
        except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
            log.warning("stream to node %s is backed up or closed; message dropped", link.node)
            return False
        return True

    def change_event(self) -> trio.Event:
        """The event the next change sets: take it before reading, wait on it after."""
        return self._changed
