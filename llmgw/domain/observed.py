"""What the leader has observed (agents' inventories, replica states, demand).

Lives in the leader's memory only and is rebuilt when agents reconnect.
Unknown is a value: a node that never reported is absent, not empty.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

REPLICA_STATES = ("starting", "ready", "failed", "stopped")


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str
    gpu_class: str
    memory_total: int  # bytes
    memory_used: int | None  # None = unknown
    healthy: bool = True

    @classmethod
    def from_doc(cls, d: Mapping[str, Any]) -> Gpu:
        used = d.get("memory_used")
        return cls(
            index=int(d["index"]),
            uuid=str(d.get("uuid", "")),
            name=str(d.get("name", "")),
            gpu_class=str(d.get("gpu_class", "")),
            memory_total=int(d.get("memory_total", 0)),
            memory_used=None if used is None else int(used),
            healthy=bool(d.get("healthy", True)),
        )

    def to_doc(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class NodeInfo:
    """An agent's inventory, as reported over its stream."""

    node: str
    hostname: str = ""
    cpus: int = 0
    memory_total: int = 0
    gpus: tuple[Gpu, ...] = ()
    engines: tuple[str, ...] = ()
    fabric: str = ""
    version: str = ""

    @classmethod
    def from_doc(cls, d: Mapping[str, Any]) -> NodeInfo:
        return cls(
            node=str(d["node"]),
            hostname=str(d.get("hostname", "")),
            cpus=int(d.get("cpus", 0)),
            memory_total=int(d.get("memory_total", 0)),
            gpus=tuple(Gpu.from_doc(g) for g in d.get("gpus", ())),
            engines=tuple(str(e) for e in d.get("engines", ())),
            fabric=str(d.get("fabric", "")),
            version=str(d.get("version", "")),
        )

    def to_doc(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "hostname": self.hostname,
            "cpus": self.cpus,
            "memory_total": self.memory_total,
            "gpus": [g.to_doc() for g in self.gpus],
            "engines": list(self.engines),
            "fabric": self.fabric,
            "version": self.version,
        }


@dataclass(frozen=True)
class ReplicaObs:
    """An agent's word on one replica it runs (or ran)."""

    replica_id: str
    model: str
    node: str
    state: str  # one of REPLICA_STATES
    url: str = ""  # base URL of the engine, e.g. http://127.0.0.1:40123
    error: str = ""
    since: float = 0.0

    @classmethod
    def from_doc(cls, d: Mapping[str, Any], node: str) -> ReplicaObs:
        state = str(d.get("state", ""))
        if state not in REPLICA_STATES:
            raise ValueError(f"unknown replica state {state!r}")
        return cls(
            replica_id=str(d["replica_id"]),
            model=str(d.get("model", "")),
            node=node,
            state=state,
            url=str(d.get("url", "")),
            error=str(d.get("error", ""))[:2000],
            since=float(d.get("since", 0.0)),
        )

    def to_doc(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Observed:
    nodes: dict[str, NodeInfo] = field(default_factory=dict)  # connected agents only
    replicas: dict[str, ReplicaObs] = field(default_factory=dict)
    demand: dict[str, float] = field(default_factory=dict)  # model -> last time a request asked for it
    lost: dict[str, float] = field(default_factory=dict)  # node -> when its stream closed
    since: float = 0.0  # when this observer started: nodes never seen count as gone since then

    def gone_since(self, node: str) -> float:
        return self.lost.get(node, self.since)


# --- what the control plane tells routers -----------------------------------

ROUTE_STATES = ("ready", "starting", "unplaceable", "parked", "stopped", "absent")


@dataclass(frozen=True)
class Endpoint:
    replica_id: str
    url: str  # engine base URL, no trailing slash


@dataclass(frozen=True)
class ModelRoute:
    """One model as a router sees it: ready endpoints, or why there are none."""

    model: str
    role: str
    state: str  # one of ROUTE_STATES
    endpoints: tuple[Endpoint, ...] = ()
    reason: str = ""  # words for the client when state is unplaceable/parked/stopped
