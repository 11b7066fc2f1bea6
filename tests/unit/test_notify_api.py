"""`GET /api/v1/notify/status`, `POST /api/v1/notify/test`, `notify.webhooks` validated, the conditions in
`GET /api/v1/status`; and `ctl notify status|test` printing what the real API answered. The admin app in
process (ASGI), its notifier posting to a real webhook server on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import trio

from llmgw.control.api import make_app
from llmgw.control.context import Context
from llmgw.control.hub import AgentHub
from llmgw.control.reconciler import Reconciler
from llmgw.domain import commands
from llmgw.domain.keys import hash_key
from llmgw.domain.settings import SettingError, validate
from llmgw.notify.hooks import hook_id
from llmgw.notify.notifier import Notifier
from llmgw.notify.watch import control_conditions, http_post
from llmgw.testing import MemoryStore
from llmgw.testing.builders import cpu_node, model
from llmgw.testing.webhooks import WebhookReceiver
from ctl_fakes import FakeApi, ctl

ADMIN = "sk-notify-admin"


@dataclass
class Api:
    client: httpx.AsyncClient
    deps: Context
    receiver: WebhookReceiver
    url: str


@asynccontextmanager
async def api() -> AsyncIterator[Api]:
    store, hub = MemoryStore(), AgentHub(clock=trio.current_time)
    store.submit_nowait(commands.add_key(hash_key(ADMIN), "admin", "admin", 0.0))
    receiver = WebhookReceiver()
    async with httpx.AsyncClient(timeout=None) as out, trio.open_nursery() as nursery:
        url = await nursery.start(receiver.serve)
        notifier = Notifier(http_post(out), clock=trio.current_time, cluster=lambda: {"leader": "local"})
        await nursery.start(notifier.run)
        deps = Context(store=store, hub=hub, reconciler=Reconciler(store, hub, clock=trio.current_time),
                           clock=trio.current_time, notifier=notifier)
        app: Any = make_app(deps)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://control.test",
                                     headers={"Authorization": f"Bearer {ADMIN}"}) as client:
            yield Api(client, deps, receiver, url)
        nursery.cancel_scope.cancel()


async def test_with_no_webhook_the_status_says_how_to_set_one_and_a_test_is_refused() -> None:
    async with api() as a:
        r = await a.client.get("/api/v1/notify/status")
        assert r.status_code == 200, r.text
        doc = r.json()
        assert doc["configured"] == 0 and "llmgw ctl settings notify.webhooks" in doc["hint"]
        refused = await a.client.post("/api/v1/notify/test")
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "no_webhooks"
        assert "ctl settings notify.webhooks" in refused.json()["error"]["message"]
    shown = ctl(["notify", "status"], FakeApi().on("GET", "/api/v1/notify/status", json_body=doc))
    assert shown.rc == 0 and "no notify.webhooks: set one: llmgw ctl settings notify.webhooks" in shown.out


async def test_a_test_event_reaches_the_webhooks_and_ctl_prints_each_outcome() -> None:
    async with api() as a:
        hooks = [a.url + "/json", {"url": a.url + "/slack/SECRET", "format": "slack"}, a.url + "/down"]
        a.receiver.answers["/down"] = 500
        put = await a.client.put("/api/v1/settings/notify.webhooks", json=hooks)
        assert put.status_code == 200, put.text
        r = await a.client.post("/api/v1/notify/test")
        assert r.status_code == 200, r.text
        tested = r.json()
        assert tested["delivered"] == 2
        assert [(w["format"], w["outcome"]) for w in tested["webhooks"]] == [
            ("json", "delivered"), ("slack", "delivered"), ("json", "failed")]
        assert a.receiver.events("/json")[0]["event"] == "test"
        assert "text" in a.receiver.events("/slack/SECRET")[0]
        status = (await a.client.get("/api/v1/notify/status")).json()
        assert [h["id"] for h in status["webhooks"]] == [hook_id(h if isinstance(h, str) else h["url"]) for h in hooks]
        assert "SECRET" not in str(status) and "SECRET" not in str(tested)
    out = ctl(["notify", "test"], FakeApi().on("POST", "/api/v1/notify/test", json_body=tested))
    assert out.rc == 1, out  # one webhook did not take it
    assert "answered HTTP 500" in out.out and out.out.count("delivered") == 2
    shown = ctl(["notify", "status"], FakeApi().on("GET", "/api/v1/notify/status", json_body=status))
    assert shown.rc == 0 and "recent deliveries" in shown.out and "retrying (1 failed tries)" in shown.out


async def test_conditions_in_the_status_and_the_notifier_posts_them() -> None:
    async with api() as a:
        await a.client.put("/api/v1/settings/notify.webhooks", json=[a.url + "/h"])
        a.deps.store.submit_nowait(commands.put_model(model("m").sim().always().build(), 0.0))
        send, _ = trio.open_memory_channel[dict[str, Any]](10)
        a.deps.hub.report_inventory(a.deps.hub.connect("n1", send), cpu_node("n1", "sim"))
        await a.deps.reconciler.run_once()
        for _ in range(3):
            a.deps.hub.note_restart("m")
        doc = (await a.client.get("/api/v1/status")).json()
        storm = [c for c in doc["conditions"] if c["kind"] == "restart_storm"]
        assert storm and storm[0]["subject"] == "m" and storm[0]["severity"] == "warning"
        found = control_conditions(a.deps)  # what the leader's check posts: the same
        assert [c.to_doc() for c in found] == doc["conditions"]
        assert a.deps.notifier is not None
        a.deps.notifier.configure([])
        a.deps.notifier.observe(found, trio.current_time())
        shown = ctl(["notify", "status"], FakeApi().on("GET", "/api/v1/notify/status", json_body=(
            await a.client.get("/api/v1/notify/status")).json()))
        assert "ACTIVE CONDITIONS" in shown.out and "restart_storm" in shown.out


@pytest.mark.parametrize(("value", "words"), [
    (["ftp://x/y"], "is not an http(s) URL"),
    (["http://"], "is not an http(s) URL"),
    ([{"url": "http://a/b", "format": "teams"}], "format must be one of json, slack"),
    ([{"url": "http://a/b", "secret": 1}], "unknown field(s) 'secret'"),
    ([{"format": "slack"}], "must be a URL or an object with a url"),
    (["http://a/b", "http://a/b"], "listed twice"),
    ("http://a/b", "must be a list"),
])
def test_bad_webhooks_are_refused_with_words(value: Any, words: str) -> None:
    with pytest.raises(SettingError) as e:
        validate("notify.webhooks", value)
    assert words in e.value.message


def test_good_webhooks_pass() -> None:
    validate("notify.webhooks", ["https://hooks.example/x", {"url": "http://h:9/y", "format": "slack"},
                                 {"url": "https://z"}])
    validate("notify.webhooks", [])


async def test_a_failing_webhook_shows_in_the_status_warnings() -> None:
    async with api() as a:
        a.receiver.answers["/down"] = 502
        await a.client.put("/api/v1/settings/notify.webhooks", json=[a.url + "/down"])
        for _ in range(3):
            assert (await a.client.post("/api/v1/notify/test")).json()["delivered"] == 0
        doc = (await a.client.get("/api/v1/status")).json()
        (failing,) = [c for c in doc["conditions"] if c["kind"] == "webhook_failing"]
        assert failing["subject"] == hook_id(a.url + "/down") and failing["severity"] == "critical"
        assert failing["words"] in doc["warnings"] and "answered HTTP 502" in failing["words"]
