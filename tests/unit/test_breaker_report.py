"""Open circuit breakers reach the operator: a remote gateway sends them up beside its demand, the leader keeps
each gateway's last word, and `GET /api/v1/models/{name}`, `ctl model show` and the console's model page
show them with the gateway inside the control plane's own."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from console_world import ADMIN, World, rows, sign_in
from llmgw.cli.ctl.render import render_model
from llmgw.control.gateway_stream import GatewayHub
from llmgw.domain.observed import Endpoint, ModelRoute
from llmgw.domain.timeouts import TIMEOUTS
from llmgw.gateway.follower import JudgeFailures, _report
from llmgw.gateway.router import Router
from llmgw.testing import MemoryStore
from llmgw.testing.builders import model, placed, store_with
from llmgw.wire import protocol


def _router_with_an_open_breaker() -> Router:
    router = Router(breaker_open_s=30.0)
    router.update_routes({"chat": ModelRoute("chat", "chat", "ready", (Endpoint("chat-r1", "http://a.test"),
                                                                       Endpoint("chat-r2", "http://b.test")))})
    return router


async def _trip(router: Router, replica: str, failures: int = 5) -> None:
    tripped = 0
    while tripped < failures:
        lease = router.acquire("chat", deadline=trio.current_time() + 60)
        async with lease as endpoint:
            if endpoint.replica_id == replica:
                lease.failed("the engine answered HTTP 502", failures)
                tripped += 1


class _Socket:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def send_message(self, text: str) -> None:
        self.sent.append(protocol.loads(text))


async def test_a_gateway_sends_its_open_breakers_when_they_change(autojump_clock: trio.testing.MockClock) -> None:
    router = _router_with_an_open_breaker()
    ws = _Socket()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_report, ws, router, TIMEOUTS, JudgeFailures(1.0))  # type: ignore[arg-type]
        await trio.sleep(1)
        assert ws.sent[0]["breakers"] == {}  # the first report says: none
        await _trip(router, "chat-r1")
        await trio.sleep(2)
        said = [m["breakers"] for m in ws.sent if "breakers" in m]
        assert len(said) == 2  # once when it opened, not on every report
        assert said[-1]["chat-r1"]["model"] == "chat"
        assert said[-1]["chat-r1"]["reason"] == "5 consecutive failures; last: the engine answered HTTP 502"
        assert 0 <= said[-1]["chat-r1"]["open_s"] <= TIMEOUTS.gateway_demand_report_s and said[-1]["chat-r1"]["half_open"] is False
        nursery.cancel_scope.cancel()


async def test_the_leader_keeps_each_gateways_last_word_and_forgets_a_gone_one() -> None:
    hub = GatewayHub(MemoryStore(), "m1", clock=lambda: 1000.0)
    one, two = hub.connect("gw1", "10.0.0.1"), hub.connect("gw2", "10.0.0.2")
    hub.report_demand(one, {"type": "demand", "breakers": {
        "chat-r1": {"model": "chat", "reason": "5 consecutive failures; last: HTTP 500", "open_s": 12.5,
                    "half_open": True},
        "bad": "x", "worse": {"model": "chat", "open_s": "soon"}}})  # malformed: passed over
    hub.report_demand(two, {"type": "demand", "outstanding": {"chat": 1}})  # an older gateway: no word on breakers
    [seen] = hub.open_breakers_seen()
    assert (seen.model, seen.replica_id, seen.gateway, seen.since, seen.half_open) == ("chat", "chat-r1", "gw1",
                                                                                      987.5, True)
    hub.report_demand(one, {"type": "demand", "last_used_age": {}})  # no word: the last one holds
    assert len(hub.open_breakers_seen()) == 1
    hub.report_demand(one, {"type": "demand", "breakers": {}})
    assert hub.open_breakers_seen() == []
    hub.report_demand(two, {"type": "demand", "breakers": {"chat-r2": {"model": "chat", "reason": "r", "open_s": 1}}})
    hub.disconnect(two)
    assert hub.open_breakers_seen() == []


async def test_the_api_ctl_and_console_show_why_a_replica_is_out_of_rotation() -> None:
    world = World(store_with([model("chat").sim().replicas(2)], [placed("chat", "n1", []), placed("chat", "n1", [])]))
    local = _router_with_an_open_breaker()
    await _trip(local, "chat-r1")
    remote = GatewayHub(world.store, "m1", clock=lambda: world.now)
    remote.report_demand(remote.connect("gw-east", "10.0.0.3"), {"type": "demand", "breakers": {
        "chat-r2": {"model": "chat", "reason": "3 consecutive failures; last: timed out", "open_s": 40}}})
    world.reconciler.demand[:] = [local, remote]
    async with world.client(ADMIN) as api:
        doc = (await api.get("/api/v1/models/chat")).json()["model"]
        listed = (await api.get("/api/v1/models")).json()["models"]
    breakers = doc["status"]["breakers"]  # oldest first (the world's clock is not the wall's: not compared here)
    assert sorted((b["replica_id"], b["gateway"]) for b in breakers) == [("chat-r1", "local"), ("chat-r2", "gw-east")]
    breakers.sort(key=lambda b: b["replica_id"], reverse=True)
    assert breakers[1]["reason"] == "5 consecutive failures; last: the engine answered HTTP 502"
    assert len(listed[0]["status"]["breakers"]) == 2
    text = render_model(doc)
    assert "OUT OF ROTATION (circuit breaker open)" in text
    assert "gw-east" in text and "3 consecutive failures; last: timed out" in text
    assert "OUT OF ROTATION" not in render_model({**doc, "status": {**doc["status"], "breakers": []}})
    async with world.client() as c:
        await sign_in(c)
        page = (await c.get("/models/chat")).text
    shown = sorted(rows(page, "model-breakers"), reverse=True)
    assert [(r[0], r[1], r[2], r[3]) for r in shown] == [
        ("chat-r2", "gw-east", "40 s", "3 consecutive failures; last: timed out"),
        ("chat-r1", "local", shown[1][2], "5 consecutive failures; last: the engine answered HTTP 502")]
