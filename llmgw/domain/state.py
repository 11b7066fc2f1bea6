"""`ClusterState`: the durable facts replicated by Raft, as one immutable value.

Nothing here is mutated after construction; `apply` builds the next state.
Its mappings are read-only all the way down, so no reader of a snapshot can
make this member's state diverge from the others'. What agents observe second
by second is not here (see `domain.observed`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

from llmgw.domain.frozen import freeze, thaw
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


# The mappings whose values are frozen dataclasses; `settings` holds JSON values, frozen deeply.
_MAPPINGS = ("models", "keys", "placements", "health")


def _empty() -> MappingProxyType[str, Any]:
    return MappingProxyType({})


@dataclass(frozen=True)
class ClusterState:
    """Every mapping is read-only, so is every value in it. Build the next state with
    `dataclasses.replace(state, models=MappingProxyType(new_dict))` over a dict no one
    else holds; a plain dict given instead (pickle does) is copied, then wrapped."""

    revision: int = 0  # count of applied commands; a read after a write sees >= its revision
    models: MappingProxyType[str, ModelDef] = field(default_factory=_empty)
    settings: MappingProxyType[str, Any] = field(default_factory=_empty)  # lists are tuples, objects read-only
    keys: MappingProxyType[str, ApiKey] = field(default_factory=_empty)
    placements: MappingProxyType[str, Placement] = field(default_factory=_empty)
    health: MappingProxyType[str, ModelHealth] = field(default_factory=_empty)
    next_replica: int = 1

    def __post_init__(self) -> None:
        # A read-only mapping is kept as is: `replace` passes the unchanged fields on, and
        # copying them for every command would make `apply` O(state) in each of them.
        for name in _MAPPINGS:
            value = getattr(self, name)
            if type(value) is not MappingProxyType:
                object.__setattr__(self, name, MappingProxyType(dict(value)))
        if type(self.settings) is not MappingProxyType:
            object.__setattr__(self, "settings", freeze(self.settings))

    # pysyncobj pickles this value into its snapshot file, and pickle cannot write a
    # MappingProxyType. The pickled form is the plain dicts it was before the state was
    # read-only: older snapshot files still load (frozen on the way in), and vice versa.
    def __getstate__(self) -> dict[str, Any]:
        state = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in _MAPPINGS:
            state[name] = state[name].copy()  # a plain dict (`dict(proxy)` is the slow way)
        state["settings"] = thaw(self.settings)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        empty = ClusterState()  # a field the file lacks takes its default
        for f in fields(self):
            object.__setattr__(self, f.name, state.get(f.name, getattr(empty, f.name)))
        self.__post_init__()

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
