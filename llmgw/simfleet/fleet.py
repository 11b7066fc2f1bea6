"""`serve(FleetConfig)`: the fleet's engine server, then one real agent per simulated node (the
agent's own `serve`, its stream and protocol, with a `SimProbe` and a `SimRunner`), until cancelled.
"""

from __future__ import annotations

import logging
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
from llmgw.simfleet.nodes import NodeShape, SimProbe, node_info, node_names

log = logging.getLogger("llmgw.simfleet")


@dataclass
class FleetConfig:
    controls: list[str]  # admin base URLs of the control planes; each agent finds the leader among them
    key: str  # an admin key (agents authenticate with one)
    nodes: int
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
    has been welcomed (agents that cannot reach a leader keep trying, as real ones do)."""
    config.shape.check()
    names = node_names(config.nodes, config.prefix, config.first)
    server = EngineServer()
    async with trio.open_nursery() as nursery:
        url: str = await nursery.start(server.serve, config.engine_host, config.engine_port)
        welcomed = trio.Semaphore(0)
        for position, name in enumerate(names):
            info = node_info(config.shape, name, config.shape.fabric_of(position, len(names)))
            nursery.start_soon(_node, nursery, config, server, info, welcomed)
        for _ in names:
            await welcomed.acquire()
        log.info("sim-fleet: %d nodes connected; engines answer at %s", len(names), url)
        task_status.started(FleetHandle(url, names, server))


async def _node(nursery: trio.Nursery, config: FleetConfig, server: EngineServer, info: NodeInfo,
                welcomed: trio.Semaphore) -> None:
    agent = AgentConfig(
        controls=config.controls, key=config.key,
        state_dir=Path("."),  # unused: the runner keeps no files, the node has no --storage directory
        node=info.node, engine_host=config.engine_host, probe=SimProbe(info), timeouts=config.timeouts,
        fabric=info.fabric, runner=partial(SimRunner, node=info.node, server=server))
    await nursery.start(agent_serve, agent)
    welcomed.release()

