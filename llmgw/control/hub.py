"""The leader's memory of its agents: inventories, replica reports, open streams.

Rebuilt from scratch when agents reconnect; never written to Raft.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import trio

from llmgw.domain.observed import NodeInfo, Observed, ReplicaObs
from llmgw.domain.timeouts import TIMEOUTS, Timeouts

log = logging.getLogger("llmgw.control.hub")


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
        self.since = clock()
        self.nodes: dict[str, NodeInfo] = {}
        self.replicas: dict[str, dict[str, ReplicaObs]] = {}  # node -> replica id -> report
        self.links: dict[str, AgentLink] = {}
        self.lost: dict[str, float] = {}
        self.demand: dict[str, float] = {}
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
        self.changed()
        return link

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
                        lost=dict(self.lost), since=self.since)

    def note_demand(self, model: str) -> None:
        self.demand[model] = self._clock()

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
        try:
            link.send.send_nowait(message)
        except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
            log.warning("stream to node %s is backed up or closed; message dropped", node)
            return False
        return True

    def changed(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def change_event(self) -> trio.Event:
        """The event the next change sets: take it before reading, wait on it after."""
        return self._changed
