"""Client keys end to end: made, listed and revoked through the admin API of a real control plane
(one-member Raft), used through a remote gateway that follows its table (scope, expiry, limits,
revocation within 2 s); tokens/min charged from an engine's usage; a bad key refused from the
headers alone; admin keys never accepted on `/v1`."""

from __future__ import annotations

import dataclasses
import json
import time
from functools import partial
from pathlib import Path
from typing import Any, AsyncIterator

import httpx
import pytest
import trio
import trio.testing

from llmgw.control.service import ControlConfig, ControlHandle, Seed
from llmgw.control.service import serve as control_serve
from llmgw.domain import commands
from llmgw.domain.keys import hash_key
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import Endpoint, ModelRoute
from llmgw.domain.timeouts import TIMEOUTS
from llmgw.engines import sim
from llmgw.gateway.app import GatewayDeps, serve
from llmgw.gateway.follower import GatewayConfig, GatewayHandle
from llmgw.gateway.follower import serve as gateway_serve
from llmgw.gateway.router import Router
from llmgw.testing import MemoryStore
from tests.support.processes import free_port

ADMIN, CLIENT = "sk-admin-keys-test", "sk-client-keys-test"
FAST = dataclasses.replace(TIMEOUTS, gateway_heartbeat_s=0.2, gateway_silence_s=2.0, gateway_reconnect_min_s=0.05,
                           gateway_reconnect_max_s=0.3, gateway_demand_report_s=0.05)
REVOCATION_S = 2.0  # the promise: every gateway refuses a revoked key within this


@dataclasses.dataclass
class Cluster:
    control: ControlHandle
    gateway: GatewayHandle
    api: httpx.AsyncClient  # the admin API, with the admin key

    def client(self, key: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.gateway.url, headers={"Authorization": f"Bearer {key}"})


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    models = [ModelDef.from_doc({"name": n, "engine": "sim", "source": f"sim://{n}", "mode": "on-demand"})
              for n in ("demo", "other")]
    config = ControlConfig(state_dir=tmp_path / "control", raft_addr=f"127.0.0.1:{free_port()}",
                           admin_host="127.0.0.1", admin_port=0, timeouts=FAST,
                           seed=Seed(admin_key=ADMIN, client_key=CLIENT, models=models))
    async with trio.open_nursery() as nursery:
        control: ControlHandle = await nursery.start(control_serve, config)
        assert control.context is not None
        gateway: GatewayHandle = await nursery.start(gateway_serve, GatewayConfig(
            controls=[control.admin_url], tls=None,
            local_credential=control.context.local_credential("gateway", "gw-keys"), listen_port=0, name="gw-keys", timeouts=FAST))
        async with httpx.AsyncClient(base_url=control.admin_url, headers={"Authorization": f"Bearer {ADMIN}"}) as api:
            cluster = Cluster(control, gateway, api)
            async with cluster.client(CLIENT) as http:
                with trio.fail_after(10):
                    while (await http.get("/v1/models")).status_code != 200:  # the gateway has its table
                        await trio.sleep(0.02)
            yield cluster
        nursery.cancel_scope.cancel()


async def create(api: httpx.AsyncClient, **fields: Any) -> dict[str, Any]:
    r = await api.post("/api/v1/keys", json={"name": "test", **fields})
    assert r.status_code == 201, r.text
    doc: dict[str, Any] = r.json()
    return doc


async def until_status(http: httpx.AsyncClient, path: str, status: int, within: float) -> float:
    """Seconds until GET `path` answers `status` (fails past `within`)."""
    start = time.monotonic()
    with trio.fail_after(within):
        while (await http.get(path)).status_code != status:
            await trio.sleep(0.01)
    return time.monotonic() - start


@pytest.mark.slow
async def test_create_list_use_and_revoke_within_two_seconds(cluster: Cluster) -> None:
    made = await create(cluster.api, name="ci bot", models=["demo"], requests_per_min=1000)
    secret, key_id = made["key"], made["id"]
    assert secret.startswith("sk-llmgw-") and key_id.startswith("key_") and made["models"] == ["demo"]
    listing = (await cluster.api.get("/api/v1/keys")).json()["keys"]
    text = json.dumps(listing)
    assert secret not in text and hash_key(secret) not in text and hash_key(secret)[7:] not in text
    names = [k["name"] for k in listing]
    assert sorted(names[:2]) == ["admin", "client"] and names[2] == "ci bot", "the seeded ones too, oldest first"
    assert all(k["id"].startswith("key_") for k in listing)

    async with cluster.client(secret) as http:
        await until_status(http, "/v1/models", 200, 5)  # the new key reached the gateway
        assert [m["id"] for m in (await http.get("/v1/models")).json()["data"]] == ["demo"], "only its scope"
        out_of_scope = await http.get("/v1/models/other")
        missing = await http.get("/v1/models/nothing")
        assert out_of_scope.status_code == missing.status_code == 404
        assert out_of_scope.json()["error"]["message"].replace("other", "X") == \
            missing.json()["error"]["message"].replace("nothing", "X")
        r = await http.post("/v1/chat/completions", json={"model": "other", "messages": [{"role": "user",
                                                                                          "content": "hi"}]})
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"

        start = time.monotonic()
        revoked = await cluster.api.delete(f"/api/v1/keys/{key_id}")
        assert revoked.status_code == 200 and revoked.json() == {"revoked": key_id}
        await until_status(http, "/v1/models", 401, REVOCATION_S)
        print(f"revoked, and refused by the remote gateway, in {(time.monotonic() - start) * 1000:.0f} ms")
        assert (await http.get("/v1/models")).json()["error"]["code"] == "invalid_api_key"
    again = await cluster.api.delete(f"/api/v1/keys/{key_id}")
    assert again.status_code == 404 and again.json()["error"]["code"] == "key_not_found"
    assert key_id not in json.dumps((await cluster.api.get("/api/v1/keys")).json())


@pytest.mark.slow
async def test_limits_expiry_and_admin_keys_at_a_remote_gateway(cluster: Cluster) -> None:
    limited = await create(cluster.api, requests_per_min=2)
    expired = await create(cluster.api, expires_at=1_000_000.0)
    async with cluster.client(limited["key"]) as http:
        await until_status(http, "/v1/models", 200, 5)  # one of its two
        assert (await http.get("/v1/models")).status_code == 200
        r = await http.get("/v1/models")
        assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limited"
        assert 1 <= int(r.headers["retry-after"]) <= 30 and "x-request-id" in r.headers
    async with cluster.client(expired["key"]) as http:
        r = await http.get("/v1/models")
        assert r.status_code == 401 and r.json()["error"]["code"] == "key_expired"
    async with cluster.client(ADMIN) as http:  # the admin key works on the admin API, never on /v1
        r = await http.post("/v1/chat/completions", json={"model": "demo", "messages": []})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert (await http.get("/v1/models")).status_code == 401
    admin = await create(cluster.api, role="admin")
    async with cluster.client(admin["key"]) as http:
        assert (await http.get("/v1/models")).status_code == 401
    assert (await cluster.api.get("/api/v1/keys", headers={"Authorization": f"Bearer {CLIENT}"})).status_code == 401


@pytest.mark.slow
async def test_refusals_of_the_admin_routes(cluster: Cluster) -> None:
    for body, words in (({"name": ""}, "name must be"), ({"name": "x", "role": "root"}, "role must be"),
                        ({"name": "x", "colour": "red"}, "unknown field 'colour'"),
                        ({"name": "x", "role": "admin", "models": ["demo"]}, "only client keys"),
                        ({"name": "x", "tokens_per_min": -1}, "tokens_per_min must be")):
        r = await cluster.api.post("/api/v1/keys", json=body)
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_key", r.text
        assert words in r.json()["error"]["message"]
    assert (await cluster.api.delete("/api/v1/keys/not-an-id")).status_code == 404
    admin_id = next(k["id"] for k in (await cluster.api.get("/api/v1/keys")).json()["keys"] if k["role"] == "admin")
    r = await cluster.api.delete(f"/api/v1/keys/{admin_id}")
    assert r.status_code == 409 and r.json()["error"]["code"] == "last_admin_key"
    # A create retried with the same Idempotency-Key gets the same key back, not a second one.
    headers = {"Idempotency-Key": "create-once"}
    first = await cluster.api.post("/api/v1/keys", json={"name": "once"}, headers=headers)
    second = await cluster.api.post("/api/v1/keys", json={"name": "once"}, headers=headers)
    assert first.status_code == second.status_code == 201 and first.json()["key"] == second.json()["key"]
    assert [k["name"] for k in (await cluster.api.get("/api/v1/keys")).json()["keys"]].count("once") == 1
    warned = await create(cluster.api, models=["later"])
    assert warned["warnings"] == ["model 'later' is not in the catalog (yet)"]


# --- one gateway process in front of a sim engine --------------------------------------------


@pytest.fixture
async def local(nursery: trio.Nursery) -> AsyncIterator[tuple[str, MemoryStore]]:
    store = MemoryStore()
    store.submit_nowait(commands.put_model(ModelDef.from_doc({"name": "demo", "engine": "sim",
                                                               "source": "sim://demo"}), 0.0))
    store.submit_nowait(commands.add_key(hash_key(CLIENT), "client", "client", 0.0, tokens_per_min=60))
    url = await nursery.start(partial(sim.serve, sim.SimOptions("127.0.0.1", 0, "demo", "chat", 0)))
    router = Router()
    router.update_routes({"demo": ModelRoute("demo", "chat", "ready", (Endpoint("demo-r1", url),))})
    # A refused body is discarded for up to 30 s: the 401 must not wait for it.
    slow_drain = dataclasses.replace(TIMEOUTS, gateway_drain_body_s=30.0)
    host, port = await nursery.start(partial(serve, "127.0.0.1", 0, GatewayDeps(router=router, state=store,
                                                                                timeouts=slow_drain)))
    yield f"http://{host}:{port}", store


async def test_tokens_per_minute_are_charged_from_the_engines_usage(local: tuple[str, MemoryStore]) -> None:
    url, _ = local
    body = {"model": "demo", "messages": [{"role": "user", "content": " ".join(["word"] * 80)}]}
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {CLIENT}"}) as http:
        first = await http.post("/v1/chat/completions", json=body)
        assert first.status_code == 200, first.text
        usage = first.json()["usage"]
        assert usage["total_tokens"] > 60, "the answer took more than the key's minute"
        second = await http.post("/v1/chat/completions", json=body)
        assert second.status_code == 429 and second.json()["error"]["code"] == "rate_limited"
        assert int(second.headers["retry-after"]) >= 1


async def test_a_bad_key_is_refused_from_the_headers_alone(local: tuple[str, MemoryStore],
                                                           autojump_clock: trio.testing.MockClock) -> None:
    url, _ = local
    host, port = url.removeprefix("http://").rsplit(":", 1)
    for key in ("sk-wrong", ADMIN, CLIENT + "x"):
        stream = await trio.open_tcp_stream(host, int(port))
        async with stream:
            head = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\nauthorization: Bearer {key}\r\n"
                    "content-type: application/json\r\ncontent-length: 100000\r\n\r\n")
            await stream.send_all(head.encode())  # the body never comes
            sent = trio.current_time()
            got = b""
            with trio.fail_after(120):  # (virtual seconds: a bound on a hang)
                while b"\r\n\r\n" not in got or not got.rstrip().endswith(b"}"):
                    chunk = await stream.receive_some(65536)
                    assert chunk, f"closed before the answer: {got!r}"
                    got += chunk
            # At once (MockClock): not after the 30 s a refused body may be drained for, nor the body's idle wait.
            assert trio.current_time() - sent < 1.0
            head_part, _, body_part = got.partition(b"\r\n\r\n")
            assert head_part.startswith(b"HTTP/1.1 401 "), head_part
            assert json.loads(body_part)["error"]["code"] == "invalid_api_key"
