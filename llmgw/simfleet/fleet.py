"""`serve(FleetConfig)`: the fleet's engine server, then one real agent per simulated node (the
agent's own `serve`, its stream and protocol, with a `SimProbe` and a `SimRunner`), until cancelled.
Each node joins first, as a machine does, and its agent authenticates with its own certificate
(join.py).
"""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import trio

from llmgw.agent.service import AgentConfig
from llmgw.agent.service import serve as agent_serve
from llmgw.domain.observed import NodeInfo
from llmgw.domain.timeouts import TIMEOUTS, Timeouts
from llmgw.simfleet.engines import EngineServer, SimRunner
from llmgw.simfleet.join import FleetTrust
from llmgw.simfleet.nodes import NodeShape, SimProbe, node_info, node_names

log = logging.getLogger("llmgw.simfleet")


@dataclass
class FleetConfig:
    controls: list[str]  # https admin URLs of the control planes; each agent finds the leader among them
    nodes: int
    state_dir: Path  # each node's credential: STATE_DIR/nodes/NAME/tls (join.py)
    # The operator's admin key: the fleet makes a join token with it for each node that holds no
    # certificate yet. Never a node's credential.
    admin_key: str | None = None
    ca_file: Path | None = None  # what the nodes trust before they hold the bundle (else ca_hash, else the system's)
    ca_hash: str | None = None
    join_concurrency: int = 32  # tokens and joins in flight at once
    shape: NodeShape = field(default_factory=NodeShape)
    prefix: str = "sim"  # nodes are named PREFIX-0001, …
    first: int = 1  # the number of the first node (two fleets side by side: 1 and 1001)
    engine_host: str = "127.0.0.1"  # where the engine server listens; gateways must reach it
    engine_port: int = 0  # 0: any free port
    timeouts: Timeouts = TIMEOUTS


@dataclass
class FleetHandle:
    """What `serve` hands back once every node was welcomed by a leader."""

    engines_url: str  # the engine server's base URL; a replica answers at <url>/r/<replica id>
    nodes: list[str]
    server: EngineServer


async def serve(config: FleetConfig, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Run the fleet until cancelled; `task_status.started(FleetHandle)` once every node's agent
    has been welcomed (agents that cannot reach a leader keep trying, as real ones do). A node that
    cannot join (no token, a refused join) stops the start (`JoinError`, with why)."""
    config.shape.check()
    names = node_names(config.nodes, config.prefix, config.first)
    server = EngineServer()
    trust = FleetTrust(config.controls, config.state_dir, config.admin_key, ca_file=config.ca_file,
                       ca_hash=config.ca_hash, concurrency=config.join_concurrency,
                       timeout_s=config.timeouts.join_request_s)
    started = trio.current_time()
    try:
        # Every node joins first, then every agent connects: the joins (commits of the leader's) do
        # not queue behind the streams and heartbeats of the nodes already in.
        await trust.open(names)
        contexts = await trust.contexts(names, lambda node: (config.engine_host, node))
        await trust.aclose()
        joined_in = trio.current_time() - started
        async with trio.open_nursery() as nursery:
            url: str = await nursery.start(server.serve, config.engine_host, config.engine_port)
            welcomed = trio.Semaphore(0)
            for position, name in enumerate(names):
                info = node_info(config.shape, name, config.shape.fabric_of(position, len(names)))
                nursery.start_soon(_node, nursery, config, contexts[name], server, info, welcomed)
            for _ in names:
                await welcomed.acquire()
            log.info("sim-fleet: %d nodes connected in %.1f s (%d joined now, in %.1f s; %d held a certificate in "
                     "%s); engines answer at %s", len(names), trio.current_time() - started, trust.joined, joined_in,
                     len(names) - trust.joined, config.state_dir, url)
            task_status.started(FleetHandle(url, names, server))
    finally:
        with trio.CancelScope(shield=True):
            await trust.aclose()


async def _node(nursery: trio.Nursery, config: FleetConfig, tls: ssl.SSLContext, server: EngineServer,
                info: NodeInfo, welcomed: trio.Semaphore) -> None:
    agent = AgentConfig(
        controls=config.controls, tls=tls,
        state_dir=Path("."),  # unused: the runner keeps no files, the node has no --storage directory
        node=info.node, engine_host=config.engine_host, probe=SimProbe(info), timeouts=config.timeouts,
        fabric=info.fabric, runner=partial(SimRunner, node=info.node, server=server))
    await nursery.start(agent_serve, agent)  # returns once the leader welcomed it
    welcomed.release()

