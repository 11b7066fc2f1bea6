"""The admin API (S14) over real HTTP, in front of a real one-member Raft store:
writes are committed before they return, and bad input changes nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, AsyncIterator

import httpx
import pytest
import trio
from trio_websocket import open_websocket_url

from llmgw.control.api import make_app
from llmgw.control.context import Context
from llmgw.control.hub import AgentHub
from llmgw.control.reconciler import Reconciler
from llmgw.control.service import ControlConfig, ControlHandle, Seed, serve
from llmgw.domain import commands
from llmgw.domain.keys import hash_key
from llmgw.domain.model import ModelDef
from llmgw.store import CommitUnknown, NotLeader, StoreNotReady, StoreUnavailable
from llmgw.testing import MemoryStore
from llmgw.wire import protocol
from tests.support.processes import free_port

pytestmark = pytest.mark.slow

ADMIN, CLIENT = "sk-admin-test", "sk-client-test"


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
        yield c


def error_of(r: httpx.Response) -> dict[str, Any]:
    doc = r.json()
    assert set(doc) == {"error"} and set(doc["error"]) == {"code", "message"}, doc
    assert doc["error"]["message"]
    return doc["error"]  # type: ignore[no-any-return]


async def test_write_then_read_sees_it(api: httpx.AsyncClient) -> None:
    r = await api.post("/api/v1/models", json={"name": "extra", "engine": "sim", "source": "sim://extra",
                                                "mode": "on-demand"})
    assert r.status_code == 201
    assert r.json()["model"]["mode"] == "on-demand"
    got = await api.get("/api/v1/models/extra")
    assert got.status_code == 200 and got.json()["model"]["source"] == "sim://extra"
    again = await api.post("/api/v1/models", json={"name": "extra", "engine": "sim", "source": "sim://extra2"})
    assert again.status_code == 200, "a second POST of a name replaces it"
    assert (await api.get("/api/v1/models/extra")).json()["model"]["source"] == "sim://extra2"
    assert (await api.delete("/api/v1/models/extra")).json() == {"removed": "extra"}
    assert (await api.get("/api/v1/models/extra")).status_code == 404
    names = [m["name"] for m in (await api.get("/api/v1/models")).json()["models"]]
    assert names == ["demo"]


async def test_settings_round_trip(api: httpx.AsyncClient) -> None:
    listing = (await api.get("/api/v1/settings")).json()["settings"]
    assert listing["serving.stopped"] == {"value": False, "default": False, "set": False,
                                          "help": listing["serving.stopped"]["help"]}
    r = await api.put("/api/v1/settings/serving.stopped", json=True)
    assert r.json() == {"key": "serving.stopped", "value": True}
    got = (await api.get("/api/v1/settings/serving.stopped")).json()
    assert got["value"] is True and got["set"] is True


async def test_status_shape(api: httpx.AsyncClient) -> None:
    doc = (await api.get("/api/v1/status")).json()
    assert set(doc) >= {"cluster", "nodes", "models", "warnings", "notify"}
    assert doc["cluster"]["leader"] and doc["cluster"]["stopped"] is False
    demo = doc["models"][0]
    assert demo["name"] == "demo"
    # no agent is connected: the model is unplaceable and says why; never "0 ready" as healthy
    assert any("no notify.webhooks" in w for w in doc["warnings"])


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "code"),
    [
        ("POST", "/api/v1/models", b'{"name": "x", ', 400, "invalid_json"),
        ("POST", "/api/v1/models", b"", 400, "invalid_json"),
        ("POST", "/api/v1/models", b'["a list"]', 400, "invalid_model"),
        ("POST", "/api/v1/models", b'{"name": "x", "engine": "sim", "source": "sim://x", "replicas": {"min": "1"}}',
         400, "invalid_model"),
        ("POST", "/api/v1/models", b'{"name": "x", "engine": "llama.cpp", "source": "/models/../../etc/passwd"}',
         400, "invalid_model"),
        ("POST", "/api/v1/models", b'{"name": "../etc", "engine": "sim", "source": "sim://x"}', 400, "invalid_model"),
        ("POST", "/api/v1/models", b'{"name": "x", "engine": "sim", "source": "sim://x", "args": "--rm -rf"}',
         400, "invalid_model"),
        ("POST", "/api/v1/models", b'{"name": "x", "engine": "tensorrt", "source": "/m"}', 400, "invalid_model"),
        ("POST", "/api/v1/models", b'{"name": "x", "base": ["a list"], "source": "/m/a.gguf"}', 400, "invalid_model"),
        ("POST", "/api/v1/plan", b'{"name": "x", "base": {"an": "object"}, "source": "/m/a.gguf"}', 400,
         "invalid_model"),
        ("GET", "/api/v1/models/ghost", b"", 404, "model_not_found"),
        ("GET", "/api/v1/models/..%2F..%2Fetc%2Fpasswd", b"", 404, "model_not_found"),
        ("DELETE", "/api/v1/models/ghost", b"", 404, "model_not_found"),
        ("POST", "/api/v1/models/ghost/retry", b"", 404, "model_not_found"),
        ("PUT", "/api/v1/settings/no.such.key", b"true", 404, "unknown_setting"),
        ("PUT", "/api/v1/settings/serving.stopped", b'"yes"', 400, "invalid_setting"),
        ("PUT", "/api/v1/settings/notify.webhooks", b'["ftp://x"]', 400, "invalid_setting"),
        ("GET", "/api/v1/nope", b"", 404, "not_found"),
        ("PATCH", "/api/v1/models", b"{}", 405, "method_not_allowed"),
    ],
)
async def test_bad_input_is_refused_and_changes_nothing(
    api: httpx.AsyncClient, control: ControlHandle, method: str, path: str, body: bytes, status: int, code: str
) -> None:
    before = control.store.snapshot()
    r = await api.request(method, path, content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == status, r.text
    assert error_of(r)["code"] == code
    assert control.store.snapshot() is before


async def test_fallbacks_and_aliases_are_checked_against_the_catalog_and_a_refusal_changes_nothing(
        api: httpx.AsyncClient, control: ControlHandle) -> None:
    def model(name: str, **extra: Any) -> dict[str, Any]:
        return {"name": name, "engine": "sim", "source": f"sim://{name}", **extra}

    before = control.store.snapshot()
    for doc, words in [
        (model("a", fallbacks=["nope"]), "fallbacks: 'nope' is not a defined model"),
        (model("a", fallbacks=["a"]), "fallbacks: must not name the model itself ('a')"),
        (model("a", aliases=["demo"]), "aliases: 'demo' is the name of a model"),
        (model("a", role="embedding", fallbacks=["demo"], aliases=["demo", "x"]),
         "fallbacks: 'demo' has role chat; a fallback must have this model's role (embedding); "
         "aliases: 'demo' is the name of a model"),  # every problem at once
    ]:
        r = await api.post("/api/v1/models", json=doc)
        assert r.status_code == 400 and error_of(r) == {"code": "invalid_model", "message": words}, r.text
    assert control.store.snapshot() is before
    r = await api.post("/api/v1/models", json=model("a", fallbacks=["demo"], aliases=["friendly"]))
    assert r.status_code == 201, r.text
    shown = (await api.get("/api/v1/models/a")).json()["model"]
    assert (shown["fallbacks"], shown["aliases"]) == (["demo"], ["friendly"])
    assert "fallbacks" not in (await api.get("/api/v1/models/demo")).json()["model"]
    r = await api.post("/api/v1/models", json=model("friendly"))  # a model may not take an alias's name
    assert r.status_code == 400 and "'friendly' is an alias of model 'a'" in error_of(r)["message"]


# httpx abandons its request-body generator when the server answers before reading it all.
@pytest.mark.filterwarnings("ignore:Async generator 'httpx._content.ByteStream.__aiter__':ResourceWarning")
async def test_huge_body_is_refused(api: httpx.AsyncClient, control: ControlHandle) -> None:
    before = control.store.snapshot()
    big = json.dumps({"name": "x", "engine": "sim", "source": "sim://x", "args": ["a" * 1000] * 3000})
    r = await api.post("/api/v1/models", content=big, headers={"Content-Type": "application/json"})
    assert r.status_code == 413
    assert error_of(r)["code"] == "request_too_large"
    assert control.store.snapshot() is before


@pytest.mark.parametrize("auth", [None, "Bearer", "Bearer sk-wrong", f"Bearer {CLIENT}", f"Basic {ADMIN}"])
async def test_admin_key_required(control: ControlHandle, auth: str | None) -> None:
    headers = {"Authorization": auth} if auth else {}
    async with httpx.AsyncClient(base_url=control.admin_url, headers=headers) as c:
        for method, path in (("GET", "/api/v1/status"), ("POST", "/api/v1/models"), ("PUT", "/api/v1/settings/x")):
            r = await c.request(method, path, json={})
            assert r.status_code == 401
            assert error_of(r)["code"] == "unauthorized"


def machine(control: ControlHandle, role: str, name: str) -> list[tuple[bytes, bytes]]:
    """The stream's header for a `role` machine `name` inside the control plane's process
    (`Context.local_credential`)."""
    assert control.context is not None
    return [(b"authorization", f"Bearer {control.context.local_credential(role, name)}".encode())]


async def test_a_stream_takes_a_machine_credential_and_no_key_not_even_the_admin_key(control: ControlHandle) -> None:
    url = control.admin_url.replace("http://", "ws://") + protocol.STREAM_PATH
    # A key is for people and scripts, never a machine's credential: on this plain loopback control plane
    # only a machine inside its process can speak (409 no_tls says so); over TLS a key gets 401
    # (tests/integration/test_trust_credentials.py).
    # The upgrade asked by hand: trio-websocket leaves a rejected handshake's socket to the collector,
    # whose ResourceWarning then lands in whichever test runs when it collects.
    host, port = control.admin_url.removeprefix("http://").rsplit(":", 1)
    for key in (CLIENT, ADMIN):
        async with await trio.open_tcp_stream(host, int(port)) as raw:
            await raw.send_all(
                f"GET {protocol.STREAM_PATH} HTTP/1.1\r\nhost: {host}\r\nconnection: Upgrade\r\n"
                f"upgrade: websocket\r\nsec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                f"authorization: Bearer {key}\r\n\r\n".encode())
            answer = b""
            while b"no_tls" not in answer and (data := await raw.receive_some(65536)):
                answer += data
        assert answer.startswith(b"HTTP/1.1 409"), answer
        assert b"no_tls" in answer, answer
    async with open_websocket_url(url, extra_headers=machine(control, "agent", "n1")) as ws:
        await ws.send_message(protocol.dumps({"type": "hello", "protocol": 999, "node": "n1"}))
        answer = protocol.loads(await ws.get_message())
        assert answer["type"] == "refused" and "protocol" in answer["reason"]
    assert control.hub.nodes == {}


async def test_agent_stream_registers_the_node_and_forgets_it_on_close(control: ControlHandle) -> None:
    url = control.admin_url.replace("http://", "ws://") + protocol.STREAM_PATH
    async with open_websocket_url(url, extra_headers=machine(control, "agent", "n1")) as ws:
        await ws.send_message(protocol.dumps({"type": "hello", "protocol": protocol.PROTOCOL_VERSION, "node": "n1"}))
        await ws.send_message(protocol.dumps({"type": "inventory", "inventory": {"node": "n1", "cpus": 8,
                                                                                  "engines": ["sim"]}}))
        assert protocol.loads(await ws.get_message())["type"] == "welcome"
        # the reconciler places `demo` on the new node and asks the agent to start it
        start = protocol.loads(await ws.get_message())
        assert start["type"] == "start_replica" and start["model"]["name"] == "demo"
        assert control.hub.nodes["n1"].cpus == 8
    with trio.fail_after(5):
        while "n1" in control.hub.nodes:
            await trio.sleep(0.01)
    assert "n1" in control.hub.lost


# --- Idempotency-Key: a retried write applies once and answers as the first did ------------------------------------

EXTRA = {"name": "extra", "engine": "sim", "source": "sim://extra"}


async def test_a_retry_with_the_same_key_applies_once_and_answers_the_same(
    api: httpx.AsyncClient, control: ControlHandle
) -> None:
    before = control.store.snapshot().revision
    first = await api.post("/api/v1/models", json=EXTRA, headers={"Idempotency-Key": "create-extra-1"})
    again = await api.post("/api/v1/models", json=EXTRA, headers={"Idempotency-Key": "create-extra-1"})
    assert first.status_code == again.status_code == 201, "the retry says 'created', as the first did"
    assert again.content == first.content
    assert control.store.snapshot().revision == before + 1, "applied once"
    # Another key is another request: applied again (a replace, this time).
    other = await api.post("/api/v1/models", json=EXTRA, headers={"Idempotency-Key": "create-extra-2"})
    assert other.status_code == 200 and control.store.snapshot().revision == before + 2


async def test_a_retried_delete_answers_as_the_first_not_404(api: httpx.AsyncClient, control: ControlHandle) -> None:
    assert (await api.post("/api/v1/models", json=EXTRA)).status_code == 201
    first = await api.delete("/api/v1/models/extra", headers={"Idempotency-Key": "rm-extra"})
    revision = control.store.snapshot().revision
    again = await api.delete("/api/v1/models/extra", headers={"Idempotency-Key": "rm-extra"})
    assert (first.status_code, first.json()) == (again.status_code, again.json()) == (200, {"removed": "extra"})
    assert control.store.snapshot().revision == revision
    fresh = await api.delete("/api/v1/models/extra", headers={"Idempotency-Key": "rm-extra-2"})
    assert fresh.status_code == 404 and error_of(fresh)["code"] == "model_not_found"


async def test_a_retry_on_another_member_or_after_a_restart_answers_from_the_replicated_record(
    api: httpx.AsyncClient, control: ControlHandle
) -> None:
    """A fresh app over the same store has none of the first one's answers kept: the outcome
    recorded in the replicated state still makes the retry say 'created', and apply nothing."""
    first = await api.post("/api/v1/models", json=EXTRA, headers={"Idempotency-Key": "k-7"})
    revision = control.store.snapshot().revision
    other = make_app(Context(store=control.store, hub=control.hub, reconciler=control.reconciler,
                                 clock=lambda: 0.0))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=other), base_url="http://member2",
                                 headers={"Authorization": f"Bearer {ADMIN}"}) as member2:
        again = await member2.post("/api/v1/models", json=EXTRA, headers={"Idempotency-Key": "k-7"})
    assert (first.status_code, again.status_code) == (201, 201)
    assert again.json()["model"]["source"] == first.json()["model"]["source"]
    assert control.store.snapshot().revision == revision


async def test_the_same_key_for_a_different_request_is_refused(api: httpx.AsyncClient, control: ControlHandle) -> None:
    assert (await api.put("/api/v1/settings/serving.stopped", json=True, headers={"Idempotency-Key": "s"})).is_success
    before = control.store.snapshot()
    r = await api.put("/api/v1/settings/serving.stopped", json=False, headers={"Idempotency-Key": "s"})
    assert r.status_code == 422 and error_of(r)["code"] == "idempotency_key_reused"
    assert control.store.snapshot() is before


async def test_keys_are_scoped_to_the_admin_key(api: httpx.AsyncClient, control: ControlHandle) -> None:
    await control.store.submit(commands.add_key(hash_key("sk-admin-two"), "two", "admin", 0.0))
    first = await api.post("/api/v1/models", json=EXTRA, headers={"Idempotency-Key": "same"})
    async with httpx.AsyncClient(base_url=control.admin_url, headers={"Authorization": "Bearer sk-admin-two"}) as two:
        second = await two.post("/api/v1/models", json=EXTRA, headers={"Idempotency-Key": "same"})
    assert (first.status_code, second.status_code) == (201, 200), "another client's key is its own: applied again"


@pytest.mark.parametrize("key", [b"", b"x" * 201, b"caf\xc3\xa9", b"tab\there"])
async def test_a_bad_idempotency_key_is_refused(api: httpx.AsyncClient, control: ControlHandle, key: bytes) -> None:
    before = control.store.snapshot()
    r = await api.post("/api/v1/models", json=EXTRA, headers=[(b"Idempotency-Key", key)])
    assert r.status_code == 400 and error_of(r)["code"] == "invalid_idempotency_key"
    assert control.store.snapshot() is before
    assert (await api.get("/api/v1/models", headers=[(b"Idempotency-Key", key)])).status_code == 200, "reads ignore it"


# --- every store error reaches the client in the admin error shape ------------------------------------------------


class FailingStore(MemoryStore):
    """Reads as a store with an admin key; every write raises `failure`."""

    def __init__(self, failure: Exception) -> None:
        super().__init__()
        self.submit_nowait(commands.add_key(hash_key(ADMIN), "admin", "admin", 0.0))
        self.submit_nowait(commands.put_model(ModelDef.from_doc(EXTRA), 0.0))
        self.failure = failure

    async def submit(self, command: dict[str, Any]) -> Any:
        raise self.failure


WRITES = [("POST", "/api/v1/models", EXTRA), ("PUT", "/api/v1/settings/serving.stopped", True),
          ("DELETE", "/api/v1/models/extra", None), ("POST", "/api/v1/models/extra/retry", None)]


@pytest.mark.parametrize(
    ("failure", "code", "words"),
    [
        (CommitUnknown("no commit confirmed within 10 s (no quorum?)"), "commit_unknown", "may or may not"),
        (NotLeader("10.0.0.2:7000"), "not_leader", "10.0.0.2:7000"),
        (NotLeader(None), "not_leader", "no leader is known"),
        (StoreUnavailable("commit failed: queue_full"), "store_unavailable", "queue_full"),
        (StoreNotReady("no leader among 3 members"), "store_unavailable", "no leader among 3"),
        (RuntimeError("a bug"), "internal_error", "RuntimeError"),
    ],
    ids=["commit-unknown", "not-leader", "no-leader", "unavailable", "not-ready", "bug"],
)
async def test_each_store_error_is_an_admin_error(failure: Exception, code: str, words: str) -> None:
    store = FailingStore(failure)
    app = make_app(Context(store=store, hub=AgentHub(), reconciler=Reconciler(store, AgentHub()),
                               clock=lambda: 0.0))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://member",
                                 headers={"Authorization": f"Bearer {ADMIN}"}) as c:
        for method, path, body in WRITES:
            r = await c.request(method, path, content=json.dumps(body).encode() if body is not None else b"",
                                headers={"Content-Type": "application/json", "Idempotency-Key": "k1"})
            assert r.status_code == (500 if code == "internal_error" else 503), (method, path, r.text)
            assert r.headers["content-type"] == "application/json"
            err = error_of(r)
            assert err["code"] == code and words in err["message"], err


async def test_commit_unknown_says_a_retry_is_safe_only_with_a_key() -> None:
    store = FailingStore(CommitUnknown("no commit confirmed within 10 s"))
    app = make_app(Context(store=store, hub=AgentHub(), reconciler=Reconciler(store, AgentHub()),
                               clock=lambda: 0.0))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://member",
                                 headers={"Authorization": f"Bearer {ADMIN}"}) as c:
        keyed = error_of(await c.delete("/api/v1/models/extra", headers={"Idempotency-Key": "k"}))["message"]
        bare = error_of(await c.delete("/api/v1/models/extra"))["message"]
    assert "may or may not have been applied" in keyed and "same Idempotency-Key is safe" in keyed
    assert "may or may not have been applied" in bare and "no Idempotency-Key" in bare
