"""A request for a model with no ready replica asks control for a placement and waits for it; when that
placement cannot fit, the request is answered at once (`model_unplaceable`, with the reason) rather than
after the model's activation window. Real reconciler, hub, router and store; a scripted agent; MockClock."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from llmgw.control.hub import AgentHub
from llmgw.domain import commands
from llmgw.domain.model import ModelDef
from llmgw.gateway.router import NoEndpoint, Router
from llmgw.testing import MemoryStore
from test_control_loop import ScriptedAgent, start_loop

WINDOW_S = 120.0


async def test_an_on_demand_model_that_cannot_fit_is_refused_at_once_with_the_reason(
        autojump_clock: trio.testing.MockClock) -> None:
    store, hub, router = MemoryStore(), AgentHub(trio.current_time), Router()
    big = ModelDef.from_doc({"name": "big", "engine": "vllm", "source": "hf://org/big", "mode": "on-demand",
                             "activation_window_s": WINDOW_S})  # a GPU model; the only node has none
    store.submit_nowait(commands.put_model(big, 0.0))
    async with trio.open_nursery() as nursery:
        await nursery.start(ScriptedAgent(hub, "n1", engines=("sim", "vllm")).run)
        await start_loop(nursery, store, hub, router)
        await trio.sleep(30)
        route = router.route("big")
        assert route is not None and route.state == "absent", "nobody asked yet: no placement was tried"
        asked = trio.current_time()
        with pytest.raises(NoEndpoint) as refused:
            async with router.acquire("big", deadline=asked + WINDOW_S):
                pass
        # The ask woke the reconciler, whose placement said no: answered then, not at the window's end.
        assert trio.current_time() - asked < 1.0
        assert refused.value.code == "model_unplaceable"
        assert "n1: node has no GPU" in refused.value.message
        nursery.cancel_scope.cancel()


async def test_an_on_demand_model_that_fits_is_placed_by_the_request_that_waits_for_it(
        autojump_clock: trio.testing.MockClock) -> None:
    store, hub, router = MemoryStore(), AgentHub(trio.current_time), Router()
    lazy = ModelDef.from_doc({"name": "lazy", "engine": "sim", "source": "sim://lazy", "mode": "on-demand",
                              "activation_window_s": WINDOW_S})
    store.submit_nowait(commands.put_model(lazy, 0.0))
    async with trio.open_nursery() as nursery:
        agent = ScriptedAgent(hub, "n1")
        await nursery.start(agent.run)
        await start_loop(nursery, store, hub, router)
        await trio.sleep(30)
        assert agent.starts == []
        asked = trio.current_time()
        async with router.acquire("lazy", deadline=asked + WINDOW_S) as endpoint:
            assert endpoint.replica_id == "lazy-r1"
        # Placed at once and ready after the agent's load time (0.5 s): the request waited that long, not its window.
        assert trio.current_time() - asked == pytest.approx(0.5, abs=0.05)
        assert agent.starts == ["lazy-r1"]
        nursery.cancel_scope.cancel()
