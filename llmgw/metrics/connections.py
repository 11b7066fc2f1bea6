"""A listener's client connections as families (both roles: the admin API's on the admin port, the gateway's
on its port, each under its own prefix so `llmgw up`'s two scrapes never share a family), read from its
gate's statistics (llmgw/wire/gate.py) when scraped.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from llmgw.metrics.expose import counter, gauge
from llmgw.wire.gate import GateStats

PREFIX = {"admin": "llmgw_admin", "gateway": "llmgw_gateway"}


def connection_families(stats: GateStats) -> Iterator[Metric]:
    p, what = PREFIX[stats.listener], "the admin API" if stats.listener == "admin" else "this gateway process"
    yield gauge(f"{p}_connections", f"Client connections {what} holds open now.", (), [((), float(stats.open))])
    yield gauge(f"{p}_connections_limit", f"Client connections {what} holds at most: in all (scope listener) and "
                "from one peer address (scope address); docs/operations.md, Limits.", ("scope",),
                [(("listener",), float(stats.limit)), (("address",), float(stats.per_address))])
    yield counter(f"{p}_connections_refused", f"New connections {what} closed at once, at its limit with no idle "
                  "connection to close instead: listener_full (at its own limit) or address_full (at the peer "
                  "address's).", ("reason",),
                  [(("listener_full",), float(stats.refused_listener_full)),
                   (("address_full",), float(stats.refused_address_full))])
    yield counter(f"{p}_connections_evicted", f"Idle connections {what} closed to make room for a new one, at "
                  "its limit or the peer address's.", (), [((), float(stats.evicted))])
