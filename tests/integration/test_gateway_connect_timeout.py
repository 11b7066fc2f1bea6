"""A model's own connect timeout (issue 9, point 3: upstream timeouts per model, with defaults), through the whole
gateway: a replica whose host takes no connection (a listener with a full accept queue drops the SYNs, so the
connect hangs as behind a dead route) costs a client the model's `timeouts.connect_s`, and another model's
requests the gateway's default `upstream_connect_s`. Under pytest-trio's autojump MockClock: exact virtual times."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from functools import partial

import httpx
import pytest
import trio
import trio.testing

from llmgw.domain import commands
from llmgw.domain.keys import hash_key
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import Endpoint, ModelRoute
from llmgw.domain.timeouts import TIMEOUTS
from llmgw.gateway.app import GatewayDeps, serve
from llmgw.gateway.router import Router
from llmgw.testing import MemoryStore

KEY = "sk-connect-timeout-client"
OWN_CONNECT_S = 1.5


@pytest.fixture
def unreachable() -> Iterator[str]:
    """The URL of a listener that completes no new connection: backlog 0, its queue filled, nothing accepted."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        fillers = []
        for _ in range(8):  # until a connect hangs: the queue is full from then on
            filler = socket.socket()
            fillers.append(filler)
            filler.settimeout(0.3)
            try:
                filler.connect(("127.0.0.1", port))
            except TimeoutError:
                break
        else:
            pytest.fail("the listener kept taking connections: cannot make a connect hang here")
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            for filler in fillers:
                filler.close()


async def test_a_models_connect_timeout_is_its_own_and_others_keep_the_default(
        unreachable: str, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    store = MemoryStore()
    routes = {}
    for name, timeouts in (("own", {"connect_s": OWN_CONNECT_S}), ("default", None)):
        doc = {"name": name, "engine": "sim", "source": f"sim://{name}"} | ({"timeouts": timeouts} if timeouts else {})
        store.submit_nowait(commands.put_model(ModelDef.from_doc(doc), at=0.0))
        routes[name] = ModelRoute(name, "chat", "ready", (Endpoint(f"{name}-r1", unreachable),))
    store.submit_nowait(commands.add_key(hash_key(KEY), "test", "client", 0.0))
    router = Router()
    router.update_routes(routes)
    host, port = await nursery.start(partial(serve, "127.0.0.1", 0, GatewayDeps(router=router, state=store)))
    async with httpx.AsyncClient(base_url=f"http://{host}:{port}", headers={"authorization": f"Bearer {KEY}"},
                                 timeout=None) as http:
        for model, waited in (("own", OWN_CONNECT_S), ("default", TIMEOUTS.upstream_connect_s)):
            started = trio.current_time()
            response = await http.post("/v1/chat/completions",
                                       json={"model": model, "messages": [{"role": "user", "content": "hi"}]})
            assert response.status_code == 502, response.text
            assert response.json()["error"]["code"] == "upstream_unavailable"
            assert trio.current_time() - started == pytest.approx(waited, abs=0.1), model
    assert OWN_CONNECT_S != TIMEOUTS.upstream_connect_s
