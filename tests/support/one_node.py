"""One machine's whole cluster in this process, as the integration tests that need every role start it: a
control plane (its admin API on loopback), an agent with a fake GPU probe for the node `n1`, and a gateway fed
by the control plane's routes. `wait_for` polls a predicate of what they show, under a deadline that is a
safety net, not a timing."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import trio

from llmgw.agent import AgentConfig
from llmgw.agent import serve as agent_serve
from llmgw.control.service import ControlConfig, ControlHandle, Seed
from llmgw.control.service import serve as control_serve
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import NodeInfo
from llmgw.domain.timeouts import TIMEOUTS, Timeouts
from llmgw.gateway.app import GatewayDeps
from llmgw.gateway.app import serve as gateway_serve
from llmgw.gateway.router import Router
from llmgw.testing import FakeGpuProbe
from tests.support.processes import free_port


@dataclass
class OneNode:
    control: ControlHandle
    router: Router  # the gateway's: what it routes to
    gateway_url: str


@asynccontextmanager
async def one_node(tmp_path: Path, models: Sequence[ModelDef], *, admin_key: str, client_key: str,
                   node: NodeInfo, timeouts: Timeouts = TIMEOUTS) -> AsyncIterator[OneNode]:
    """The three roles serving `models` (seeded) until the block ends; engines run as the agent starts them."""
    router = Router()
    config = ControlConfig(state_dir=tmp_path / "control", raft_addr=f"127.0.0.1:{free_port()}",
                           admin_host="127.0.0.1", admin_port=free_port(),
                           seed=Seed(admin_key=admin_key, client_key=client_key, models=list(models)),
                           sinks=[router], demand=[router], timeouts=timeouts)
    async with trio.open_nursery() as nursery:
        control: ControlHandle = await nursery.start(control_serve, config)
        assert control.context is not None
        credential = control.context.local_credential("agent", "n1")
        await nursery.start(agent_serve, AgentConfig(controls=[control.admin_url], tls=None,
                                                     local_credential=credential, state_dir=tmp_path / "agent",
                                                     node="n1", probe=FakeGpuProbe(node), timeouts=timeouts))
        host, port = await nursery.start(partial(gateway_serve, "127.0.0.1", 0,
                                                 GatewayDeps(router=router, state=control.store)))
        yield OneNode(control, router, f"http://{host}:{port}")
        nursery.cancel_scope.cancel()


async def wait_for(predicate: Callable[[], object], timeout: float = 60.0) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.05)
