"""The admin API's guard routes over real HTTP, in front of a real one-member Raft store: policies set,
listed, refused with the field named and removed; guards off said plainly; the judges' status in each
case; `judges/enable` from a file named or found in an agent's storage, and `--replace` never silent."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, AsyncIterator

import httpx
import pytest
import trio
from trio_websocket import open_websocket_url

from llmgw.control.service import ControlConfig, ControlHandle, Seed, serve
from llmgw.domain.model import ModelDef
from llmgw.wire import protocol
from tests.support.processes import free_port

pytestmark = pytest.mark.slow

ADMIN, CLIENT = "sk-admin-test", "sk-client-test"
OFF = "guards are OFF: no request is checked (llmgw ctl guard on)"
GGUF = "/models/Llama-Guard-3-1B.Q4_K_M.gguf"


@pytest.fixture
async def control(tmp_path: Path) -> AsyncIterator[ControlHandle]:
    seed = Seed(admin_key=ADMIN, client_key=CLIENT,
                models=[ModelDef.from_doc({"name": "demo", "engine": "sim", "source": "sim://demo"})])
    cfg = ControlConfig(state_dir=tmp_path, raft_addr=f"127.0.0.1:{free_port()}", admin_host="127.0.0.1",
                        admin_port=0, seed=seed)
    async with trio.open_nursery() as nursery:
        handle = await nursery.start(serve, cfg)
        yield handle
        nursery.cancel_scope.cancel()


@pytest.fixture
async def api(control: ControlHandle) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=control.admin_url, headers={"Authorization": f"Bearer {ADMIN}"}) as c:
        # GGUF's directory: a judge's local path must lie in a dir allowed for weights (no agent reports one here)
        assert (await c.put("/api/v1/settings/models.weights_dirs", json=["/models"])).status_code == 200
        yield c


def error_of(r: httpx.Response) -> dict[str, Any]:
    doc = r.json()
    assert set(doc) == {"error"} and set(doc["error"]) == {"code", "message"}, doc
    return doc["error"]  # type: ignore[no-any-return]


async def judge(api: httpx.AsyncClient, name: str) -> dict[str, Any]:
    doc = (await api.get("/api/v1/guard/judges")).json()
    return next(j for j in doc["judges"] if j["model"] == name)  # type: ignore[no-any-return]


async def test_policies_set_listed_shown_and_removed(api: httpx.AsyncClient, control: ControlHandle) -> None:
    r = await api.put("/api/v1/guard/policies/default", json={"judge": "llama-guard", "categories": ["S6", "S1"]})
    assert r.status_code == 201, r.text
    doc = r.json()
    assert doc["created"] is True and doc["policy"]["categories"] == ["S1", "S6"] and doc["enabled"] is True
    assert doc["warnings"] == ["no model named llama-guard: define it with role guard, or "
                               "`llmgw ctl guard judge enable llama-guard --source FILE.gguf`"]
    assert control.store.snapshot().guard_policies["default"].judge == "llama-guard", "committed before the answer"
    again = await api.put("/api/v1/guard/policies/default", json={"name": "default", "judge": "llama-guard",
                                                                  "categories": ["S1", "S6"]})
    assert again.status_code == 200 and again.json()["changed"] is False
    listing = (await api.get("/api/v1/guard/policies")).json()
    assert listing == {"enabled": True, "notice": "", "policies": [doc["policy"]]}
    assert (await api.get("/api/v1/guard/policies/default")).json()["policy"] == doc["policy"]
    assert (await api.delete("/api/v1/guard/policies/default")).json() == {"removed": "default"}
    for method in ("GET", "DELETE"):
        r = await api.request(method, "/api/v1/guard/policies/default")
        assert r.status_code == 404 and error_of(r)["code"] == "policy_not_found"
    assert (await api.get("/api/v1/guard/policies")).json()["policies"] == []


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b'{"judge": "lg", "check": "never"}', "check: must be prompt, response or both"),
        (b'{"judge": "lg", "categories": ["S15"]}', "categories: 'S15' is not a hazard code"),
        (b'{"judge": "lg", "budget_s": 0}', "budget_s: must be above 0"),
        (b'{"judge": "lg", "on_error": "maybe"}', "on_error: must be open"),
        (b'{"judge": "lg", "models": ["*", "demo"]}', 'models: "*" (every model) stands alone'),
        (b'{"check": "prompt"}', "judge: is required"),
        (b'{"name": "other", "judge": "lg"}', "name: is 'other' but the policy is stored as 'p'"),
        (b'{"judge": "lg", "colour": 1}', "colour: unknown key"),
        (b'["judge"]', "policy: must be an object"),
    ],
)
async def test_a_bad_policy_is_refused_naming_the_field(api: httpx.AsyncClient, control: ControlHandle,
                                                        body: bytes, words: str) -> None:
    before = control.store.snapshot().revision
    r = await api.put("/api/v1/guard/policies/p", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and error_of(r)["code"] == "invalid_policy" and words in error_of(r)["message"]
    assert control.store.snapshot().revision == before and not control.store.snapshot().guard_policies
    bad_json = await api.put("/api/v1/guard/policies/p", content=b"{")
    assert bad_json.status_code == 400 and error_of(bad_json)["code"] == "invalid_json"


async def test_guards_off_is_said_plainly_everywhere(api: httpx.AsyncClient) -> None:
    await api.put("/api/v1/guard/policies/p", json={"judge": "llama-guard"})
    assert (await api.put("/api/v1/settings/guard.enabled", json=False)).status_code == 200
    for path in ("/api/v1/guard/policies", "/api/v1/guard/judges"):
        doc = (await api.get(path)).json()
        assert doc["enabled"] is False and doc["notice"] == OFF
    status = (await api.get("/api/v1/status")).json()
    assert status["guard"]["enabled"] is False and OFF in status["warnings"]
    await api.put("/api/v1/settings/guard.enabled", json=True)
    status = (await api.get("/api/v1/status")).json()
    assert status["guard"]["enabled"] is True and OFF not in status["warnings"]


async def test_a_missing_judge_then_enabled_from_a_file(api: httpx.AsyncClient, control: ControlHandle) -> None:
    none = await api.post("/api/v1/guard/judges/enable", json={})
    assert none.status_code == 409 and error_of(none)["code"] == "no_judge_asked"
    await api.put("/api/v1/guard/policies/p", json={"judge": "llama-guard"})
    missing = await judge(api, "llama-guard")
    assert missing["status"] == "missing" and missing["defined"] is False
    status = (await api.get("/api/v1/status")).json()
    assert any(w.startswith("judge llama-guard (policies p): no model named") for w in status["warnings"])
    assert status["guard"]["judges"][0]["status"] == "missing"
    no_file = await api.post("/api/v1/guard/judges/enable", json={})
    assert no_file.status_code == 400 and error_of(no_file)["code"] == "judge_source_required"
    assert "--source" in error_of(no_file)["message"]
    r = await api.post("/api/v1/guard/judges/enable", json={"source": GGUF})
    assert r.status_code == 201, r.text
    doc = r.json()
    assert doc["judge"] == "llama-guard" and doc["changed"] is True and doc["replaced"] is None
    model = control.store.snapshot().models["llama-guard"]
    assert (model.engine, model.role, model.source, model.mode, model.profile.cpu) == (
        "llama.cpp", "guard", GGUF, "always", True)
    assert (model.replicas_min, model.replicas_max) == (1, 1)
    same = await api.post("/api/v1/guard/judges/enable", json={"name": "llama-guard", "source": GGUF})
    assert same.status_code == 200 and same.json()["changed"] is False
    served = await judge(api, "llama-guard")
    assert served["defined"] is True and served["role"] == "guard" and served["status"] in ("down", "unknown")
    assert served["ready"] in (0, None), "no agent: never shown as ready"
    done = await api.post("/api/v1/guard/judges/enable", json={})
    assert done.status_code == 409 and error_of(done)["code"] == "no_judge_missing"


async def test_replace_is_never_silent(api: httpx.AsyncClient, control: ControlHandle) -> None:
    await api.put("/api/v1/guard/policies/p", json={"judge": "demo"})
    wrong = await judge(api, "demo")
    assert wrong["status"] == "not_a_judge" and wrong["problem"].startswith("demo has role chat, not guard")
    refused = await api.post("/api/v1/guard/judges/enable", json={"source": GGUF})
    assert refused.status_code == 409 and error_of(refused)["code"] == "model_not_a_judge"
    assert "--replace" in error_of(refused)["message"]
    assert control.store.snapshot().models["demo"].role == "chat", "nothing changed"
    r = await api.post("/api/v1/guard/judges/enable", json={"source": GGUF, "replace": True})
    assert r.status_code == 200 and r.json()["replaced"] == "chat"
    assert control.store.snapshot().models["demo"].role == "guard"


async def test_enable_asks_for_a_name_when_several_judges_are_missing(api: httpx.AsyncClient) -> None:
    await api.put("/api/v1/guard/policies/a", json={"judge": "lg-a"})
    await api.put("/api/v1/guard/policies/b", json={"judge": "lg-b"})
    r = await api.post("/api/v1/guard/judges/enable", json={"source": GGUF})
    assert r.status_code == 400 and error_of(r)["code"] == "judge_name_required" and "lg-a, lg-b" in r.text
    named = await api.post("/api/v1/guard/judges/enable", json={"name": "lg-b", "source": GGUF})
    assert named.status_code == 201 and named.json()["judge"] == "lg-b"
    for body, field in (({"name": "../x", "source": GGUF}, "name:"), ({"name": "x", "source": "relative.gguf"},
                                                                      "source:"),
                        ({"source": GGUF, "replace": "yes"}, "replace:"), ({"sauce": GGUF}, "sauce:")):
        bad = await api.post("/api/v1/guard/judges/enable", json=body)
        assert bad.status_code == 400 and error_of(bad)["code"] == "invalid_judge"
        assert error_of(bad)["message"].startswith(field), error_of(bad)


def machine(control: ControlHandle, role: str, name: str) -> list[tuple[bytes, bytes]]:
    """The stream's header for a `role` machine `name` inside the control plane's process (its in-memory
    credential, `Context.local_credential`): a stream takes no key."""
    assert control.context is not None
    return [(b"authorization", f"Bearer {control.context.local_credential(role, name)}".encode())]


async def agent_with_storage(control: ControlHandle, ws: Any, paths: list[str]) -> None:
    await ws.send_message(protocol.dumps({"type": "hello", "protocol": protocol.PROTOCOL_VERSION, "node": "n1"}))
    storage = [{"path": "/models", "fabric": "eth", "shared": False, "error": "", "not_weights": [],
                "models": [{"name": p.rsplit("/", 1)[-1][:-5], "path": p, "kind": "gguf", "size": 1} for p in paths]}]
    await ws.send_message(protocol.dumps({"type": "inventory", "inventory": {
        "node": "n1", "cpus": 8, "engines": ["llama.cpp", "sim"], "storage": storage}}))
    with trio.fail_after(5):
        while "n1" not in control.hub.nodes:
            await trio.sleep(0.01)


async def test_enable_finds_the_file_in_an_agents_storage(api: httpx.AsyncClient, control: ControlHandle) -> None:
    await api.put("/api/v1/guard/policies/p", json={"judge": "llama-guard"})
    url = control.admin_url.replace("http://", "ws://") + protocol.STREAM_PATH
    async with open_websocket_url(url, extra_headers=machine(control, "agent", "n1")) as ws:
        await agent_with_storage(control, ws, ["/models/smollm2.gguf", GGUF])
        r = await api.post("/api/v1/guard/judges/enable", json={})
        assert r.status_code == 201, r.text
        assert r.json()["found_on"] == ["n1"] and r.json()["model"]["source"] == GGUF


async def test_a_judge_failure_a_gateway_reports_shows_in_the_status(api: httpx.AsyncClient,
                                                                   control: ControlHandle) -> None:
    await api.put("/api/v1/guard/policies/p", json={"judge": "llama-guard"})
    await api.post("/api/v1/guard/judges/enable", json={"source": GGUF})
    url = control.admin_url.replace("http://", "ws://") + protocol.GATEWAY_STREAM_PATH
    async with open_websocket_url(url, extra_headers=machine(control, "gateway", "gw-1")) as ws:
        await ws.send_message(protocol.dumps({"type": "hello", "protocol": protocol.GATEWAY_PROTOCOL_VERSION,
                                              "gateway": "gw-1"}))
        assert protocol.loads(await ws.get_message())["type"] == "welcome"
        table = protocol.loads(await ws.get_message())
        assert table["type"] == "table" and table["guard_policies"][0]["judge"] == "llama-guard"
        await ws.send_message(protocol.dumps({"type": "judge_failure", "model": "llama-guard"}))  # bad: ignored
        await ws.send_message(protocol.dumps(protocol.judge_failure_message("llama-guard", "answer not parsed")))
        with trio.fail_after(5):
            while "llama-guard" not in control.hub.judge_failures:
                await trio.sleep(0.01)
        found = await judge(api, "llama-guard")
    assert found["last_failure"] == "answer not parsed" and found["last_failure_age_s"] is not None


async def test_a_remote_gateway_reports_its_judges_failures_to_the_leader(api: httpx.AsyncClient,
                                                                          control: ControlHandle) -> None:
    """The whole way: a fail-closed policy whose judge is missing refuses at a real `llmgw gateway`
    (follower), and the gateway tells the leader, whose judge status names the failure."""
    from llmgw.domain.timeouts import TIMEOUTS
    from llmgw.errors import OpenAIError
    from llmgw.gateway.follower import GatewayConfig, GatewayHandle
    from llmgw.gateway.follower import serve as gateway_serve

    fast = dataclasses.replace(TIMEOUTS, gateway_demand_report_s=0.05, gateway_heartbeat_s=0.2)
    r = await api.put("/api/v1/guard/policies/strict", json={"judge": "llama-guard", "models": ["demo"],
                                                             "on_error": "closed", "budget_s": 0.2})
    assert r.status_code == 201, r.text
    async with trio.open_nursery() as nursery:
        assert control.context is not None
        gw: GatewayHandle = await nursery.start(gateway_serve, GatewayConfig(
            controls=[control.admin_url], tls=None,
            local_credential=control.context.local_credential("gateway", "gw-guard"), listen_port=0, name="gw-guard", timeouts=fast))
        async with httpx.AsyncClient(base_url=gw.url, headers={"Authorization": f"Bearer {CLIENT}"}) as http:
            def policies() -> set[str]:
                try:
                    return set(gw.state.snapshot().guard_policies)
                except OpenAIError:  # gateway_not_synced: no table yet
                    return set()

            with trio.fail_after(10):
                while "strict" not in policies():
                    await trio.sleep(0.02)
            answer = await http.post("/v1/chat/completions", json={
                "model": "demo", "messages": [{"role": "user", "content": "hello"}]})
            assert answer.status_code == 400 and answer.json()["error"]["code"] == "guard_refused", answer.text
            assert answer.json()["error"]["message"].startswith("judge: error")
        with trio.fail_after(10):
            while (found := await judge(api, "llama-guard"))["last_failure"] is None:
                await trio.sleep(0.05)
        assert "llama-guard" in found["last_failure"] and found["last_failure_age_s"] is not None
        nursery.cancel_scope.cancel()
