"""The request log end to end, in one trio run over real sockets: a control plane, an agent with a sim
engine and two remote gateways with state dirs. Each request leaves one record on its gateway;
`GET /api/v1/requests[/ID]` asks both gateways and merges; usage is committed to Raft and outlives
a gateway; a gateway that is gone is named, not silently left out; no prompt reaches any file."""

from __future__ import annotations

import dataclasses
import functools
import io
import re
from pathlib import Path
from typing import Any, Awaitable, Callable

import httpx
import pytest
import trio

from llmgw.agent import AgentConfig
from llmgw.agent import serve as agent_serve
from llmgw.cli.ctl.app import run_ctl
from llmgw.control.service import ControlConfig, ControlHandle, Seed
from llmgw.control.service import serve as control_serve
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import NodeInfo
from llmgw.domain.timeouts import TIMEOUTS
from llmgw.gateway.follower import GatewayConfig, GatewayHandle
from llmgw.gateway.follower import serve as gateway_serve
from llmgw.testing import FakeGpuProbe
from tests.support.processes import free_port

pytestmark = pytest.mark.slow

ADMIN, CLIENT = "sk-admin-requestlog-test", "sk-client-requestlog-test"
FAST = dataclasses.replace(TIMEOUTS, gateway_heartbeat_s=0.2, gateway_silence_s=2.0, gateway_reconnect_min_s=0.05,
                           gateway_reconnect_max_s=0.3, gateway_demand_report_s=0.05, requestlog_flush_s=0.05,
                           usage_report_s=0.1, requests_query_s=1.0)
CHAT = "/v1/chat/completions"
SECRET = "prompt-4f1e9c2a-never-stored"


async def until(check: Callable[[], Awaitable[bool]], timeout: float) -> None:
    with trio.fail_after(timeout):
        while not await check():
            await trio.sleep(0.05)


async def test_requests_are_logged_on_their_gateway_queried_through_control_and_counted(tmp_path: Path) -> None:
    raft_port, admin_port = free_port(), free_port()
    admin_url = f"http://127.0.0.1:{admin_port}"
    seed = Seed(admin_key=ADMIN, client_key=CLIENT,
                models=[ModelDef.from_doc({"name": "demo", "engine": "sim", "source": "sim://demo"})])
    probe = FakeGpuProbe(NodeInfo("x", hostname="test-node", cpus=2, engines=("sim",)))
    async with trio.open_nursery() as nursery:
        control: ControlHandle = await nursery.start(control_serve, ControlConfig(
            state_dir=tmp_path / "control", raft_addr=f"127.0.0.1:{raft_port}", admin_host="127.0.0.1",
            admin_port=admin_port, seed=seed, timeouts=FAST))
        context = control.context
        assert context is not None
        await nursery.start(agent_serve, AgentConfig(controls=[admin_url], tls=None,
                                                     local_credential=context.local_credential("agent", "n1"),
                                                     state_dir=tmp_path / "agent", node="n1", probe=probe,
                                                     timeouts=FAST))
        gateways: dict[str, GatewayHandle] = {}
        scopes: dict[str, trio.CancelScope] = {}
        for name in ("gw-a", "gw-b"):
            scopes[name] = trio.CancelScope()

            async def run(name: str = name, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
                with scopes[name]:
                    await gateway_serve(GatewayConfig(controls=[admin_url], tls=None,
                                                      local_credential=context.local_credential("gateway", name),
                                                      listen_port=0, name=name, timeouts=FAST,
                                                      state_dir=tmp_path / name), task_status=task_status)
            gateways[name] = await nursery.start(run)
        api = httpx.AsyncClient(base_url=admin_url, headers={"Authorization": f"Bearer {ADMIN}"})
        clients = {n: httpx.AsyncClient(base_url=g.url, headers={"Authorization": f"Bearer {CLIENT}"})
                   for n, g in gateways.items()}
        async with api, clients["gw-a"], clients["gw-b"]:
            async def served() -> bool:
                for c in clients.values():
                    r = await c.post(CHAT, json={"model": "demo", "messages": [{"role": "user", "content": "x"}]})
                    if r.status_code != 200:
                        return False
                return True
            await until(served, 30)
            ids = {}
            for name, http in clients.items():
                r = await http.post(CHAT, json={"model": "demo", "messages": [{"role": "user", "content": SECRET}]})
                assert r.status_code == 200
                ids[name] = r.headers["x-request-id"]
                assert re.fullmatch(rf"req-{name.replace('-', '')}-[0-9a-f]{{16}}", ids[name])
            refused = await clients["gw-b"].post(CHAT, json={"model": "nope", "messages": []})
            assert refused.status_code in (400, 404)

            # Each request's record, from the gateway its id names, once each gateway's writer has written it (every
            # `requestlog_flush_s`: on a busy machine gw-b's may come well after gw-a's); tokens from the engine's usage.
            async def recorded() -> bool:
                for rid in (*ids.values(), refused.headers["x-request-id"]):
                    if (await api.get(f"/api/v1/requests/{rid}")).status_code != 200:
                        return False
                return True
            await until(recorded, 30)
            doc = (await api.get(f"/api/v1/requests/{ids['gw-a']}")).json()
            record = doc["request"]
            assert doc["gateway"] == "gw-a" and record["model"] == "demo" and record["status"] == 200
            assert record["tokens_in"] and record["tokens_out"] and record["node"] == "n1"
            assert record["replica"].startswith("demo-") and record["latency_ms"] > 0 and record["key"]

            # The newest from both gateways, merged newest first; filters; pages by cursor.
            listed = (await api.get("/api/v1/requests", params={"model": "demo", "limit": "2"})).json()
            assert listed["gateways"]["answered"] == ["gw-a", "gw-b"] and listed["gateways"]["unavailable"] == []
            assert len(listed["requests"]) == 2 and listed["next_cursor"]
            ends = [r["time"] + r["latency_ms"] / 1000 for r in listed["requests"]]
            assert ends == sorted(ends, reverse=True)
            seen = {r["id"] for r in listed["requests"]}
            cursor = listed["next_cursor"]
            while cursor:
                page = (await api.get("/api/v1/requests", params={"model": "demo", "limit": "2",
                                                                   "cursor": cursor})).json()
                assert not seen & {r["id"] for r in page["requests"]}
                seen |= {r["id"] for r in page["requests"]}
                cursor = page["next_cursor"]
            assert set(ids.values()) <= seen
            errors = (await api.get("/api/v1/requests", params={"status": "4xx"})).json()["requests"]
            assert [r["id"] for r in errors] == [refused.headers["x-request-id"]]
            # Each admitted request ran in its key's class (`default`); none in `bulk`.
            classed = (await api.get("/api/v1/requests", params={"priority": "default"})).json()["requests"]
            assert set(ids.values()) <= {r["id"] for r in classed}
            assert all(r["priority"] == "default" for r in classed)
            assert (await api.get("/api/v1/requests", params={"priority": "bulk"})).json()["requests"] == []

            # Usage: committed to Raft in batches, per key and model.
            async def counted() -> bool:
                rows = (await api.get("/api/v1/usage", params={"model": "demo"})).json()["usage"]
                return bool(sum(r["requests"] for r in rows) == len(seen))
            await until(counted, 10)

            # A gateway that is gone is named; its usage stays.
            scopes["gw-b"].cancel()
            gone = (await api.get("/api/v1/requests", params={"model": "demo"})).json()
            assert [u["gateway"] for u in gone["gateways"]["unavailable"]] == ["gw-b"]
            assert {r["gateway"] for r in gone["requests"]} == {"gw-a"}
            missing = await api.get(f"/api/v1/requests/{ids['gw-b']}")
            assert missing.status_code == 503 and missing.json()["error"]["code"] == "gateway_unavailable"
            rows = (await api.get("/api/v1/usage", params={"model": "demo"})).json()["usage"]
            assert sum(r["requests"] for r in rows) == len(seen)

            # The operator's commands (ctl is synchronous: it runs in a thread).
            env = {"LLMGW_URL": admin_url, "LLMGW_KEY": ADMIN}
            for argv, expect in ((["request", ids["gw-a"]], ids["gw-a"]),
                                 (["requests", "--model", "demo", "--since", "1h"], "did not answer"),
                                 (["usage"], "demo")):
                out, err = io.StringIO(), io.StringIO()
                code = await trio.to_thread.run_sync(functools.partial(run_ctl, argv, env=env, stdout=out, stderr=err))
                assert code == 0, err.getvalue()
                assert expect in out.getvalue()

        # Prompts are never stored: not on the gateways, not on control.
        for path in tmp_path.rglob("*"):
            if path.is_file():
                assert SECRET.encode() not in path.read_bytes(), path
        assert control.gateways is not None
        nursery.cancel_scope.cancel()
