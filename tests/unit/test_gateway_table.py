"""The table a remote gateway follows, without sockets: its wire form (`protocol.table_message` /
`read_table`), the gateway's `FollowedState` (unknown before the first table; its age, on a
MockClock) and the leader's `GatewayHub` (versions, withheld routes, demand as ages)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
import trio.testing

from llmgw.control.gateway_stream import GatewayHub
from llmgw.control.hub import AgentHub
from llmgw.domain import commands
from llmgw.domain.keys import hash_key
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import Endpoint, ModelRoute
from llmgw.domain.settings import effective
from llmgw.errors import OpenAIError
from llmgw.gateway.follower import FollowedState
from llmgw.testing import MemoryStore
from llmgw.wire import protocol

CLIENT, ADMIN = "sk-client-table-test", "sk-admin-table-test"
ROUTES = {"demo": ModelRoute("demo", "chat", "ready", (Endpoint("demo-r1", "http://10.0.0.5:4000"),)),
          "lazy": ModelRoute("lazy", "chat", "parked", (), "it failed 5 times: bad weights")}


@pytest.fixture
def clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


def store() -> MemoryStore:
    s = MemoryStore()
    s.submit_nowait(commands.add_key(hash_key(ADMIN), "admin", "admin", 1.0))
    s.submit_nowait(commands.add_key(hash_key(CLIENT), "ci", "client", 1.0))
    s.submit_nowait(commands.put_model(ModelDef.from_doc({"name": "demo", "engine": "sim", "source": "sim://demo"}), 1.0))
    s.submit_nowait(commands.put_setting("serving.stopped", True, 1.0))
    return s


def wire(message: dict[str, Any]) -> dict[str, Any]:
    return protocol.loads(protocol.dumps(message))


def test_the_table_round_trips_with_key_hashes_only() -> None:
    state = store().snapshot()
    text = protocol.dumps(protocol.table_message(3, "10.0.0.1:7000", state, ROUTES))
    assert CLIENT not in text and ADMIN not in text, "never a raw key on the wire"
    table = protocol.read_table(protocol.loads(text))
    assert (table.version, table.leader, table.skipped) == (3, "10.0.0.1:7000", ())
    assert table.state.revision == state.revision
    assert table.state.models == state.models
    assert {h: k.role for h, k in table.state.keys.items()} == {hash_key(ADMIN): "admin", hash_key(CLIENT): "client"}
    assert effective(table.state.settings, "serving.stopped") is True
    assert table.routes == ROUTES
    assert not table.state.placements, "a gateway needs no placements"


def test_routes_not_known_stay_unknown_and_a_model_that_does_not_read_is_skipped() -> None:
    message = wire(protocol.table_message(1, "m", store().snapshot(), None))
    assert protocol.read_table(message).routes is None
    message["models"].append({"name": "future", "engine": "warp-drive", "source": "x"})
    table = protocol.read_table(message)
    assert list(table.state.models) == ["demo"]
    assert len(table.skipped) == 1 and table.skipped[0].startswith("future: ")
    del message["keys"]
    with pytest.raises(protocol.ProtocolError, match="unreadable table"):
        protocol.read_table(message)
    bad_route = wire(protocol.table_message(1, "m", store().snapshot(), ROUTES))
    bad_route["routes"][0]["state"] = "dancing"
    with pytest.raises(protocol.ProtocolError, match="dancing"):
        protocol.read_table(bad_route)


async def test_followed_state_is_unknown_until_the_first_table_then_ages(clock: trio.testing.MockClock) -> None:
    followed = FollowedState(["http://c1:8081", "http://c2:8081"])
    with pytest.raises(OpenAIError) as refused:
        followed.snapshot()
    assert (refused.value.status, refused.value.code) == (503, "gateway_not_synced")
    assert "http://c1:8081, http://c2:8081" in refused.value.message
    assert followed.health() == {"table_age_s": None, "leader": None}, "unknown is null, never 0"
    followed.confirm(trio.current_time())
    assert followed.health()["table_age_s"] is None, "a heartbeat vouches for no table"

    table = protocol.read_table(wire(protocol.table_message(1, "m", store().snapshot(), ROUTES)))
    followed.leader = "http://c1:8081"
    followed.apply(table, trio.current_time())
    assert followed.snapshot() is table.state
    assert followed.health() == {"table_age_s": 0.0, "leader": "http://c1:8081"}
    await trio.sleep(7.5)
    assert followed.health()["table_age_s"] == 7.5
    followed.confirm(trio.current_time())
    assert followed.health()["table_age_s"] == 0.0
    followed.leader = None
    await trio.sleep(40)
    assert followed.health() == {"table_age_s": 40.0, "leader": None}


async def test_wait_changed_wakes_on_a_newer_table(clock: trio.testing.MockClock) -> None:
    followed = FollowedState(["http://c1:8081"])
    state = store().snapshot()
    got: list[int] = []

    async def waiter() -> None:
        got.append((await followed.wait_changed(state.revision - 1)).revision)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.sleep(1)
        assert got == []
        followed.apply(protocol.read_table(wire(protocol.table_message(1, "m", state, None))), trio.current_time())
    assert got == [state.revision]


async def test_the_hub_numbers_tables_and_sends_a_new_one_only_on_change(clock: trio.testing.MockClock) -> None:
    s = store()
    hub = GatewayHub(s, "10.0.0.1:7000")
    v1, text1 = hub.table()
    assert json.loads(text1)["routes"] is None, "no routes before the reconciler published"
    assert hub.table() == (v1, text1)
    hub.update_routes(ROUTES)
    v2, text2 = hub.table()
    assert v2 == v1 + 1 and len(json.loads(text2)["routes"]) == 2
    s.submit_nowait(commands.put_setting("serving.stopped", False, 2.0))
    v3, text3 = hub.table()
    assert v3 == v2 + 1 and json.loads(text3)["settings"]["serving.stopped"] is False


async def test_a_new_leaders_routes_wait_for_its_agents(clock: trio.testing.MockClock) -> None:
    """Routes with no endpoints from a leader that has heard from no agent yet would stall the
    gateways: they are withheld until every node with a placement reported, or the quiet time."""
    s = store()
    s.submit_nowait(commands.add_placement("demo", "n1", (), "h", 1.0))
    agents = AgentHub(clock=trio.current_time)
    hub = GatewayHub(s, "m", agents=agents, clock=trio.current_time)
    hub.update_routes({"demo": ModelRoute("demo", "chat", "starting")})
    assert json.loads(hub.table()[1])["routes"] is None, "n1 has not reported: keep your routes"
    send, _ = trio.open_memory_channel[dict[str, Any]](1)
    link = agents.connect("n1", send)
    assert json.loads(hub.table()[1])["routes"] is None, "connected is not reported"
    agents.report_replicas(link, [])
    assert json.loads(hub.table()[1])["routes"] is not None

    late = GatewayHub(s, "m", agents=AgentHub(clock=trio.current_time), clock=trio.current_time)
    late.update_routes({"demo": ModelRoute("demo", "chat", "starting")})
    await trio.sleep(late.timeouts.reconcile_startup_quiet_s - 0.1)
    assert json.loads(late.table()[1])["routes"] is None
    await trio.sleep(0.1)
    assert json.loads(late.table()[1])["routes"] is not None, "a node that never reports holds nothing forever"


async def test_demand_arrives_as_ages_and_asks_wake_the_reconciler(clock: trio.testing.MockClock) -> None:
    woken: list[float] = []
    hub = GatewayHub(store(), "m", wake=lambda: woken.append(trio.current_time()))
    link = hub.connect("gw1", "10.0.0.9")
    await trio.sleep(100)
    hub.report_demand(link, {"type": "demand", "last_used_age": {"demo-r1": 2.5}, "asks_age": {}})
    assert hub.last_used() == {"demo-r1": 97.5} and woken == []
    hub.report_demand(link, {"type": "demand", "last_used_age": {"demo-r1": 10.0}, "asks_age": {}})
    assert hub.last_used() == {"demo-r1": 97.5}, "an older use (another gateway's) never moves it back"
    hub.report_demand(link, {"type": "demand", "last_used_age": {"x": "soon", "y": -3}, "asks_age": {"lazy": 0.5}})
    assert hub.last_used() == {"demo-r1": 97.5, "y": 100.0}, "bad ages are dropped, negative ones are now"
    assert woken == [100.0]
    assert hub.take_activation_asks() == {"lazy": 99.5}
    assert hub.take_activation_asks() == {}
    hub.disconnect(link)
    assert [(g["name"], g["connected"]) for g in hub.gateways()] == [("gw1", False)]


async def test_a_member_that_stops_leading_forgets_its_routes(clock: trio.testing.MockClock) -> None:
    """Led again later, it must not hand gateways the routes of its previous term."""
    leading = [True]
    hub = GatewayHub(store(), "m", agents=AgentHub(clock=trio.current_time), clock=trio.current_time)
    hub.update_routes(ROUTES)
    hub.report_demand(hub.connect("gw1", "10.0.0.9"), {"last_used_age": {"demo-r1": 1.0}, "asks_age": {"lazy": 0}})
    assert json.loads(hub.table()[1])["routes"] is not None
    async with trio.open_nursery() as nursery:
        await nursery.start(hub.watch_leadership, lambda: leading[0])
        await trio.sleep(10)
        assert json.loads(hub.table()[1])["routes"] is not None, "still leading: nothing forgotten"
        leading[0] = False
        # Half a poll past the next one: waking at the same virtual instant as the watcher's poll
        # would leave the order of the two to trio's scheduler.
        await trio.sleep(hub.timeouts.gateway_heartbeat_s * 1.5)
        assert json.loads(hub.table()[1])["routes"] is None
        assert hub.last_used() == {} and hub.take_activation_asks() == {}
        nursery.cancel_scope.cancel()
