"""Every limit on what a process holds open, in one typed table: client connections per listener and per
peer address, and the file descriptors a process keeps for its own work (the shape of `timeouts.py`).

Pure data and arithmetic: `connection_caps` turns the table and the process's open-files limit into the
caps a listener enforces (llmgw/wire/gate.py). docs/operations.md ("Limits") lists the same table, and a
test keeps the two equal.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from llmgw.domain.timeouts import overrides

Listener = Literal["admin", "gateway"]

# Of the descriptors left after the reserve, the share of connections each listener may hold, alone in its
# process or beside the other (`llmgw up`). A gateway connection may hold two descriptors (its client's and,
# while a request is in flight, its engine's): alone it takes half as many connections as descriptors;
# beside the admin API, three quarters of the descriptors. Either way the shares add up to the whole.
SHARES: dict[Listener, tuple[float, float]] = {"admin": (1.0, 0.25), "gateway": (0.5, 0.375)}  # (alone, beside)
MIN_CAP = 16  # a listener takes at least this many, however low the open-files limit


def _n(default: int, area: str, help: str) -> Any:
    return field(default=default, metadata={"area": area, "help": help})


@dataclass(frozen=True)
class Limits:
    descriptors_reserved: int = _n(256, "process", "file descriptors each process keeps out of its listeners' reach for its own work (Raft links, the journal, log files, engines' pipes, connections it opens); its listeners share what the open-files limit leaves")
    admin_connections: int = _n(8192, "control", "client connections the admin API holds at most (operators, the console, agents' and gateways' streams), and at most the descriptors left after the reserve (a quarter of them beside a gateway, in `llmgw up`); at the limit the oldest idle one is closed to make room, or with none idle the new one is refused")
    admin_connections_per_address: int = _n(0, "control", "client connections one peer address (an IPv6 /64) holds at most on the admin API (0: half of the admin API's limit, so one address never holds it all); at the limit its own oldest idle one is closed to make room, or with none idle its new one is refused")
    gateway_connections: int = _n(65536, "gateway", "client connections a gateway process holds at most, and at most half the descriptors left after the reserve (two per request in flight; three eighths beside the admin API, in `llmgw up`); at the limit the oldest idle (kept-alive) one is closed to make room, or with none idle the new one is refused")
    gateway_connections_per_address: int = _n(0, "gateway", "client connections one peer address (an IPv6 /64) holds at most on a gateway (0: half of the gateway's limit; behind a load balancer, whose one address carries every client, set it as high as gateway_connections); at the limit its own oldest idle one is closed to make room, or with none idle its new one is refused")

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            least = 1 if f.name in ("admin_connections", "gateway_connections") else 0
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"limit {f.name} must be a whole number of at least {least}, not {value!r}")

    def overridden(self, spec: str) -> Limits:
        """These limits with `name=count,name=count` applied (`LLMGW_LIMITS`, read where a listener starts).
        Raises ValueError naming an unknown field or a bad value."""
        changes = overrides(spec, {f.name for f in dataclasses.fields(self)}, int, "COUNT", "limits",
                            "a whole number")
        return dataclasses.replace(self, **changes)

    @staticmethod
    def table() -> list[tuple[str, str, int, str]]:
        """(name, area, default, help) for each limit, in declaration order."""
        return [(f.name, f.metadata["area"], int(getattr(LIMITS, f.name)), f.metadata["help"])
                for f in dataclasses.fields(Limits)]


LIMITS = Limits()


@dataclass(frozen=True)
class Caps:
    """What one listener enforces: connections open at most, and at most per peer address."""

    connections: int
    per_address: int


def connection_caps(limits: Limits, listener: Listener, open_files: int, beside: bool = False) -> Caps:
    """The caps of `listener` in a process whose open-files limit is `open_files` (its soft RLIMIT_NOFILE),
    `beside` the other listener or alone."""
    if listener == "admin":
        wanted, per_address = limits.admin_connections, limits.admin_connections_per_address
    else:
        wanted, per_address = limits.gateway_connections, limits.gateway_connections_per_address
    share = SHARES[listener][beside]
    budget = max(open_files - limits.descriptors_reserved, 0)
    cap = min(wanted, max(int(budget * share), MIN_CAP))
    return Caps(cap, min(per_address, cap) if per_address else max(cap // 2, 1))
