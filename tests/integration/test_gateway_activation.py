"""Answers about a model that has no ready replica, and about a stopped system, through the whole gateway
over real HTTP: an activation bounded by the model's own window (504 `activation_timeout`), `model_parked`
and `model_unplaceable` at once, and `system_stopped` before anything about the request is read. Under
pytest-trio's autojump MockClock, so "after the window" and "at once" are exact virtual times."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from llmgw.domain import commands
from llmgw.domain.keys import hash_key
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import ModelRoute
from llmgw.gateway.app import GatewayDeps, serve
from llmgw.gateway.router import Router
from llmgw.testing import MemoryStore

KEY = "sk-test-client"
BODY_CAP = 64 * 1024


def _model(name: str, **extra: Any) -> ModelDef:
    return ModelDef.from_doc({"name": name, "engine": "sim", "source": f"sim://{name}", **extra})


@pytest.fixture
async def gw(nursery: trio.Nursery) -> AsyncIterator[tuple[httpx.AsyncClient, Router, MemoryStore]]:
    store = MemoryStore()
    for model in (_model("cold", mode="on-demand", activation_window_s=90), _model("colder", activation_window_s=600),
                  _model("parked-one", activation_window_s=3600), _model("nowhere", activation_window_s=3600),
                  _model("capped", limits={"max_tokens": 8}), _model("embed", role="embedding")):
        store.submit_nowait(commands.put_model(model, at=0.0))
    store.submit_nowait(commands.add_key(hash_key(KEY), "test", "client", 0.0))
    router = Router()
    router.update_routes({
        "cold": ModelRoute("cold", "chat", "absent"),
        "colder": ModelRoute("colder", "chat", "starting"),
        "parked-one": ModelRoute("parked-one", "chat", "parked", (), "5 failed starts; last: CUDA out of memory"),
        "nowhere": ModelRoute("nowhere", "chat", "unplaceable", (), "needs 8 GPUs of class h100-80g; at most 4 free"),
    })
    deps = GatewayDeps(router=router, state=store, max_body_bytes=BODY_CAP)
    host, port = await nursery.start(partial(serve, "127.0.0.1", 0, deps))
    auth = {"authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(base_url=f"http://{host}:{port}", headers=auth, timeout=None) as http:
        yield http, router, store


def chat(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}


def error_of(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    return error


@pytest.mark.parametrize(("model", "window"), [("cold", 90.0), ("colder", 600.0)])
async def test_a_request_waits_for_an_activation_as_long_as_the_models_window_then_504(
        gw: Any, autojump_clock: trio.testing.MockClock, model: str, window: float) -> None:
    http, router, _ = gw
    started = trio.current_time()
    error = error_of(await http.post("/v1/chat/completions", json=chat(model)), 504)
    assert trio.current_time() - started == pytest.approx(window, abs=0.01)  # its own window, to the tick
    assert error["code"] == "activation_timeout" and f"after waiting {window:.0f} s" in error["message"]
    assert model in router.take_activation_asks()  # the wait asked control for a placement


@pytest.mark.parametrize(
    ("model", "code", "reason"),
    [("parked-one", "model_parked", "CUDA out of memory"), ("nowhere", "model_unplaceable", "at most 4 free")],
)
async def test_parked_and_unplaceable_are_answered_without_waiting(
        gw: Any, autojump_clock: trio.testing.MockClock, model: str, code: str, reason: str) -> None:
    http, _, _ = gw
    started = trio.current_time()
    response = await http.post("/v1/chat/completions", json=chat(model))
    assert trio.current_time() == started  # no virtual second passed: nothing was waited for (the window is an hour)
    error = error_of(response, 503)
    assert error["code"] == code and reason in error["message"]
    assert response.headers["x-should-retry"] == "false"


@pytest.mark.parametrize(
    ("path", "content"),
    [
        ("/v1/chat/completions", b"{not json"),
        ("/v1/chat/completions", b"[" * 100_000),
        ("/v1/chat/completions", json.dumps(chat("no-such-model")).encode()),
        ("/v1/chat/completions", json.dumps(chat("capped", max_tokens=9)).encode()),
        ("/v1/chat/completions", json.dumps(chat("embed")).encode()),  # an embedding model: 400 when running
        ("/v1/completions", json.dumps({"model": "cold", "prompt": "x", "n_keep": 4}).encode()),
        ("/v1/embeddings", b'{"model": "embed", "input": "x"}' + b" " * (2 * BODY_CAP)),  # over the cap: 413
    ],
)
async def test_while_stopped_every_known_post_is_503_before_its_body_is_judged(
        gw: Any, path: str, content: bytes) -> None:
    http, _, store = gw
    store.submit_nowait(commands.put_setting("serving.stopped", True, at=1.0))
    response = await http.post(path, content=content, headers={"content-type": "application/json"})
    error = error_of(response, 503)
    assert error["code"] == "system_stopped" and "llmgw start" in error["message"]
    assert response.headers["x-should-retry"] == "false"
    store.submit_nowait(commands.put_setting("serving.stopped", False, at=2.0))
    assert (await http.post(path, content=content)).status_code in (400, 404, 413)  # judged once running


async def test_while_stopped_a_bad_key_is_still_401_and_an_unknown_path_still_404(gw: Any) -> None:
    http, _, store = gw
    store.submit_nowait(commands.put_setting("serving.stopped", True, at=1.0))
    # The key first: a stranger learns nothing about the system's state.
    response = await http.post("/v1/chat/completions", json=chat("cold"), headers={"authorization": "Bearer sk-x"})
    assert error_of(response, 401)["code"] == "invalid_api_key"
    # A path the gateway does not serve is not a request for a model: 404 whether stopped or not.
    assert error_of(await http.post("/v1/no/such/path", json=chat("cold")), 404)["code"] == "not_found"
    assert (await http.get("/v1/models")).status_code == 200  # reading the catalog is not serving
