"""The seams between roles, as small Protocols; fakes live in `llmgw.testing`.

In one process they are plain calls; across machines an adapter carries them.
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol

from llmgw.domain.observed import ModelRoute, NodeInfo
from llmgw.domain.state import ClusterState


class EndpointSink(Protocol):
    """Control → router: the whole routing table, pushed whenever it changes."""

    def update_routes(self, routes: Mapping[str, ModelRoute]) -> None: ...


class DemandReport(Protocol):
    """Router → control, the opposite direction: who asked for what, and when."""

    def last_used(self) -> Mapping[str, float]:
        """Replica id -> last Acquire time (trio clock). Absent means unknown, never idle."""
        ...

    def take_activation_asks(self) -> Mapping[str, float]:
        """Model -> time of the newest request that found no ready replica; cleared on read."""
        ...


class StateReader(Protocol):
    """Read side of the replicated store."""

    def snapshot(self) -> ClusterState: ...

    async def wait_changed(self, revision: int) -> ClusterState:
        """Return the first snapshot whose revision is greater than `revision`."""
        ...


class WritableStore(StateReader, Protocol):
    """Control's side of the replicated store: it also commits commands and knows who leads."""

    async def submit(self, command: dict[str, Any]) -> Any:
        """Commit `command`; its result once applied. Raises `CommandError` (nothing changed),
        or the store's own errors when it cannot commit now (not the leader, unavailable)."""
        ...

    def is_leader(self) -> bool: ...


class GpuProbe(Protocol):
    """Discovers this node's accelerators (NVML, nvidia-smi, or a fake)."""

    def inventory(self, node: str) -> NodeInfo: ...
