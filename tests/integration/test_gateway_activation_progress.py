"""A client that does not wait for a cold start (`x-llmgw-wait`), through the whole gateway over real HTTP:
503 `model_activating` with `Retry-After` and the activation's progress, at once or when its budget runs out;
400 `invalid_wait` before anything is asked; a client that waits served once the route turns ready; the
window a large checkpoint stretches. Under pytest-trio's autojump MockClock where "at once" must be exact;
the wall clock the activation's `since` is on is the router's own, fixed here."""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from llmgw.domain import commands
from llmgw.domain.activation import Progress
from llmgw.domain.keys import hash_key
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import Endpoint, ModelRoute
from llmgw.domain.timeouts import TIMEOUTS
from llmgw.engines import sim
from llmgw.gateway.app import GatewayDeps, serve
from llmgw.gateway.router import Router
from llmgw.testing import MemoryStore

KEY = "sk-test-client"
WALL = 1_765_000_000.0  # the router's wall clock, stopped
GIB = 1 << 30
# Loading 13 GiB for 10 s of an estimated 100 s: 90 s left.
LOADING = Progress("loading", since=WALL - 10, bytes_total=13 * GIB, expected_s=100.0)


def _model(name: str, **extra: Any) -> ModelDef:
    return ModelDef.from_doc({"name": name, "engine": "sim", "source": f"sim://{name}", **extra})


@pytest.fixture
async def gw(nursery: trio.Nursery) -> AsyncIterator[tuple[httpx.AsyncClient, Router]]:
    store = MemoryStore()
    for model in (_model("big", activation_window_s=300), _model("cold", mode="on-demand", activation_window_s=90),
                  _model("huge", activation_window_s=90)):
        store.submit_nowait(commands.put_model(model, at=0.0))
    store.submit_nowait(commands.add_key(hash_key(KEY), "test", "client", 0.0))
    router = Router(wall=lambda: WALL)
    router.update_routes({
        "big": ModelRoute("big", "chat", "starting", (), "replicas are starting", activation=LOADING),
        "cold": ModelRoute("cold", "chat", "absent"),
        # An older leader's route has no window; this one's checkpoint needs 600 s by the estimate.
        "huge": ModelRoute("huge", "chat", "starting", (), "replicas are starting", window_s=600.0),
    })
    deps = GatewayDeps(router=router, state=store)
    host, port = await nursery.start(partial(serve, "127.0.0.1", 0, deps))
    auth = {"authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(base_url=f"http://{host}:{port}", headers=auth, timeout=None) as http:
        yield http, router


def chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}]}


def activating(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 503, response.text
    doc: dict[str, Any] = response.json()
    assert doc["error"]["code"] == "model_activating" and doc["error"]["type"] == "service_unavailable"
    return doc


async def test_a_client_that_does_not_wait_hears_the_progress_at_once_and_its_ask_starts_the_model(
        gw: Any, autojump_clock: trio.testing.MockClock) -> None:
    http, router = gw
    started = trio.current_time()
    response = await http.post("/v1/chat/completions", json=chat("big"), headers={"x-llmgw-wait": "false"})
    assert trio.current_time() == started  # not a tick of waiting
    doc = activating(response)
    assert response.headers["retry-after"] == "90"  # the estimate's time left
    assert doc["activation"] == {"phase": "loading", "since": WALL - 10, "bytes_done": None,
                                 "bytes_total": 13 * GIB, "expected_s": 100.0, "eta_s": 90.0, "elapsed_s": 10.0}
    assert "loading the 13.0 GiB checkpoint for 10 s, about 90 s left" in doc["error"]["message"]
    assert "big" in router.take_activation_asks()  # the model is still asked for


async def test_an_on_demand_model_nobody_started_is_placing_with_the_default_retry_after(
        gw: Any, autojump_clock: trio.testing.MockClock) -> None:
    http, router = gw
    response = await http.post("/v1/chat/completions", json=chat("cold"), headers={"x-llmgw-wait": "0"})
    doc = activating(response)
    assert response.headers["retry-after"] == f"{TIMEOUTS.activation_retry_after_s:.0f}"
    assert doc["activation"]["phase"] == "placing" and doc["activation"]["eta_s"] is None
    assert "cold" in router.take_activation_asks()  # which starts an on-demand model


async def test_a_budget_shorter_than_the_eta_is_refused_at_once_and_a_longer_one_runs_out_then(
        gw: Any, autojump_clock: trio.testing.MockClock) -> None:
    http, _ = gw
    started = trio.current_time()
    short = await http.post("/v1/chat/completions", json=chat("big"), headers={"x-llmgw-wait": "20"})
    assert trio.current_time() == started
    assert "will not be ready within the 20 s" in activating(short)["error"]["message"]
    long = await http.post("/v1/chat/completions", json=chat("big"), headers={"x-llmgw-wait": "120.5"})
    assert trio.current_time() - started == pytest.approx(120.5, abs=0.01)  # its budget, to the tick
    assert "not ready within the 120.5 s" in activating(long)["error"]["message"]


async def test_a_budget_past_the_window_ends_at_the_window_with_504(
        gw: Any, autojump_clock: trio.testing.MockClock) -> None:
    http, _ = gw
    started = trio.current_time()
    response = await http.post("/v1/chat/completions", json=chat("big"), headers={"x-llmgw-wait": "1000"})
    assert response.status_code == 504 and response.json()["error"]["code"] == "activation_timeout"
    assert trio.current_time() - started == pytest.approx(300, abs=0.01)


async def test_the_window_a_large_checkpoint_needs_is_waited_out(
        gw: Any, autojump_clock: trio.testing.MockClock) -> None:
    http, _ = gw
    started = trio.current_time()
    response = await http.post("/v1/chat/completions", json=chat("huge"))
    assert response.status_code == 504
    assert trio.current_time() - started == pytest.approx(600, abs=0.01)  # the route's, not the definition's 90


@pytest.mark.parametrize("value", ["soon", "-1", "nan", "inf", "1e999", "", "yes", "+5"])
async def test_an_invalid_wait_is_400_before_anything_is_asked(gw: Any, value: str) -> None:
    http, router = gw
    response = await http.post("/v1/chat/completions", json=chat("cold"), headers={"x-llmgw-wait": value})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "invalid_wait"
    assert response.json()["error"]["param"] == "x-llmgw-wait"
    assert router.take_activation_asks() == {}


async def test_a_client_that_waits_is_served_once_the_route_turns_ready(gw: Any, nursery: trio.Nursery) -> None:
    http, router = gw
    url = await nursery.start(partial(sim.serve, sim.SimOptions("127.0.0.1", 0, "big", "chat", 0)))
    answers: list[httpx.Response] = []

    async def ask() -> None:
        answers.append(await http.post("/v1/chat/completions", json=chat("big"), headers={"x-llmgw-wait": "95"}))

    async with trio.open_nursery() as waiting:
        waiting.start_soon(ask)
        with trio.fail_after(10):
            while router.statistics().waiting.get("big") != 1:  # it waits (its 95 s outlast the ETA)
                await trio.sleep(0.01)
        router.update_routes({"big": ModelRoute("big", "chat", "ready", (Endpoint("big-r1", url),))})
    [answer] = answers
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"]
