"""`ClusterState`: the durable facts replicated by Raft, as one immutable value.

Nothing here is mutated after construction; `apply` builds the next state.
What agents observe second by second is not here (see `domain.observed`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llmgw.domain.model import ModelDef


@dataclass(frozen=True)
class ApiKey:
    key_hash: str
    name: str
    role: str  # "admin" | "client"
    created_at: float


@dataclass(frozen=True)
class Placement:
    """A replica the cluster has decided to run: which node, which devices."""

    replica_id: str
    model: str
    node: str
    gpus: tuple[int, ...]  # device indexes on the node; () = CPU
    launch_hash: str
    placed_at: float


@dataclass(frozen=True)
class ModelHealth:
    failures_in_row: int = 0
    parked: bool = False
    last_error: str = ""
    last_failure_at: float = 0.0


@dataclass(frozen=True)
class ClusterState:
    revision: int = 0  # count of applied commands; a read after a write sees >= its revision
    models: dict[str, ModelDef] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    keys: dict[str, ApiKey] = field(default_factory=dict)
    placements: dict[str, Placement] = field(default_factory=dict)
    health: dict[str, ModelHealth] = field(default_factory=dict)
    next_replica: int = 1

    def model_health(self, name: str) -> ModelHealth:
        return self.health.get(name, ModelHealth())

    def placements_of(self, model: str) -> list[Placement]:
        return sorted(
            (p for p in self.placements.values() if p.model == model),
            key=lambda p: (p.placed_at, p.replica_id),
        )

    def key_role(self, key_hash: str) -> str | None:
        k = self.keys.get(key_hash)
        return k.role if k else None
