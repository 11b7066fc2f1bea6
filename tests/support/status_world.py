"""A leader's context over a simulated fleet, without sockets, for the status document's tests and its bench
(tests/bench/status.py): `llmgw sim-fleet`'s nodes (8 H100s each, two fabrics, a held model) connected to an
`AgentHub`, and sim models each placed on a node; the reconciler has not run (every model unknown: short)."""

from __future__ import annotations

from typing import Any

import trio

from llmgw.control.context import Context
from llmgw.control.hub import AgentHub
from llmgw.control.reconciler import Reconciler
from llmgw.domain import commands
from llmgw.domain.keys import hash_key
from llmgw.simfleet.nodes import HeldModel, NodeShape, node_info, node_names
from llmgw.testing import MemoryStore
from llmgw.testing.builders import model

SHAPE = NodeShape(gpus=8, fabrics=("ib-a", "ib-b"), holds=(HeldModel.parse("model-001"),))
NOW = 1_800_000_000.0


class Clock:
    """The leader's wall clock, moved by hand."""

    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


def world(nodes: int, models: int, admin_key: str) -> tuple[Context, Clock]:
    """`nodes` simulated nodes connected and `models` sim models (model-000, model-001, ...), each placed on a
    node; `admin_key` is the admin key."""
    store, clock = MemoryStore(), Clock()
    store.submit_nowait(commands.add_key(hash_key(admin_key), "admin", "admin", 0.0))
    hub = AgentHub(clock=clock)
    names = node_names(nodes)
    for i, name in enumerate(names):
        send, _ = trio.open_memory_channel[dict[str, Any]](1)
        hub.report_inventory(hub.connect(name, send), node_info(SHAPE, name, SHAPE.fabric_of(i, nodes)))
    for i in range(models):
        m = model(f"model-{i:03d}").sim().gpus(1 + i % 2).build()
        store.submit_nowait(commands.put_model(m, 0.0))
        store.submit_nowait(commands.add_placement(m.name, names[i % nodes], tuple(range(1 + i % 2)),
                                                   m.launch_hash(), 0.0))
    return Context(store=store, hub=hub, reconciler=Reconciler(store, hub, clock=clock), clock=clock), clock
