"""`serve(config)`: the control role as one root nursery.

Starts the store (and waits for it to replay its journal), seeds a fresh
cluster (first keys, catalog), then runs the reconciler and the admin listener.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import trio
from hypercorn.trio import serve as hyper_serve

from llmgw.asgi import hypercorn_config
from llmgw.control.admin import ControlDeps, make_app
from llmgw.control.hub import AgentHub
from llmgw.control.reconciler import Reconciler
from llmgw.domain import commands
from llmgw.domain.keys import hash_key
from llmgw.domain.model import ModelDef
from llmgw.domain.timeouts import TIMEOUTS, Timeouts
from llmgw.interfaces import DemandReport, EndpointSink, WritableStore
from llmgw.logs import role_var
from llmgw.store import RaftStore

log = logging.getLogger("llmgw.control")


@dataclass
class Seed:
    """What a fresh cluster starts with. Applied once: a restart keeps what the operator changed."""

    admin_key: str
    client_key: str | None = None
    models: list[ModelDef] = field(default_factory=list)


@dataclass
class ControlConfig:
    state_dir: Path
    raft_addr: str
    admin_host: str
    admin_port: int
    peers: list[str] = field(default_factory=list)
    seed: Seed | None = None
    sinks: list[EndpointSink] = field(default_factory=list)
    demand: list[DemandReport] = field(default_factory=list)
    clock: Callable[[], float] = time.time
    timeouts: Timeouts = TIMEOUTS


@dataclass
class ControlHandle:
    """What `serve` hands back once it serves: where, and its live parts (for `up` and tests)."""

    admin_url: str
    store: RaftStore
    hub: AgentHub
    reconciler: Reconciler


async def seed_cluster(store: WritableStore, seed: Seed, at: float) -> None:
    """Give a fresh cluster its first keys and catalog; keys are re-added if missing."""
    fresh = store.snapshot().revision == 0
    await store.submit(commands.add_key(hash_key(seed.admin_key), "admin", "admin", at))
    if seed.client_key:
        await store.submit(commands.add_key(hash_key(seed.client_key), "client", "client", at))
    if fresh:
        for model in seed.models:
            await store.submit(commands.put_model(model, at))
        log.info("fresh cluster seeded with %d model(s)", len(seed.models))


async def serve(config: ControlConfig, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    role_var.set("control")
    timeouts = config.timeouts
    store = RaftStore(self_addr=config.raft_addr, peers=config.peers, state_dir=config.state_dir, timeouts=timeouts)
    await store.start()
    try:
        await store.wait_ready()
        log.info("state loaded at revision %d", store.snapshot().revision)
        if config.seed is not None:
            await seed_cluster(store, config.seed, config.clock())
        hub = AgentHub(config.clock, timeouts)
        reconciler = Reconciler(store, hub, sinks=config.sinks, demand=config.demand, clock=config.clock,
                                timeouts=timeouts)
        deps = ControlDeps(store=store, hub=hub, reconciler=reconciler, clock=config.clock,
                           self_id=config.raft_addr, store_status=store.status)
        app = make_app(deps)
        # graceful_s: agents' streams close at once, not drained.
        hc = hypercorn_config(config.admin_host, config.admin_port, logger="llmgw.control.server",
                              graceful_s=timeouts.admin_shutdown_grace_s, keep_alive_s=timeouts.admin_keep_alive_s)
        async with trio.open_nursery() as nursery:
            await nursery.start(reconciler.run)
            binds = await nursery.start(lambda task_status: hyper_serve(app, hc, task_status=task_status))
            url = binds[0]
            log.info("admin API on %s", url)
            task_status.started(ControlHandle(url, store, hub, reconciler))
    finally:
        store.close()
