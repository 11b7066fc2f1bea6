"""The console (llmgw/console): sign-in and sign-out, the cookie's flags, a wrong key, a viewer refused an
action, CSRF enforced, the key never in a page, a URL or a log; Overview, Requests and Settings show the
facts of a constructed state. Quart's app through httpx's ASGI transport, against a MemoryStore."""

from __future__ import annotations

import functools
import json
import logging
import re
from typing import Any

import httpx
import pytest
import trio
from quart import Response

from llmgw.console import auth, sessions
from llmgw.console.layout import esc
from llmgw import console
from llmgw.control.api import make_app
from llmgw.control.context import Context
from llmgw.control.hub import AgentHub
from llmgw.control.reconciler import Reconciler
from llmgw.domain import commands
from llmgw.domain.commands import usage
from llmgw.domain.keys import hash_key
from llmgw.domain.observed import NodeInfo
from llmgw.testing import MemoryStore
from llmgw.testing.builders import model, node, store_with

ADMIN = "sk-console-admin-0123456789"
VIEWER = "sk-console-viewer-0123456789"
CLIENT = "sk-console-client-0123456789"
NOW = 1_800_000_000.0


class World:
    def __init__(self, store: MemoryStore | None = None, nodes: list[NodeInfo] | None = None) -> None:
        self.store = store or MemoryStore()
        for key, role in ((ADMIN, "admin"), (VIEWER, "viewer"), (CLIENT, "client")):
            self.store.submit_nowait(commands.add_key(hash_key(key), role, role, 0.0))
        self.now = NOW
        self.hub = AgentHub(clock=lambda: self.now)
        for info in nodes or []:
            send, _ = trio.open_memory_channel[dict[str, Any]](10)
            self.hub.report_inventory(self.hub.connect(info.node, send), info)
        self.reconciler = Reconciler(self.store, self.hub, clock=lambda: self.now)
        self.app: Any = make_app(Context(store=self.store, hub=self.hub, reconciler=self.reconciler,
                                         clock=lambda: self.now), (console.register,))

    def client(self, base: str = "http://cp.test") -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url=base)


async def sign_in(c: httpx.AsyncClient, key: str) -> httpx.Response:
    form = await c.get("/signin")
    token = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert token, form.text
    return await c.post("/signin", data={"csrf": token.group(1), "key": key})


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, html
    return found.group(1)


# --- sign-in, sessions, cookies ------------------------------------------------------------------


async def test_signed_out_pages_lead_to_the_sign_in_form_labelled_admin_key() -> None:
    async with World().client() as c:
        r = await c.get("/")
        assert r.status_code == 303 and r.headers["location"] == "/signin"
        form = await c.get("/signin")
    assert '<label for="admin-key">Admin key</label>' in form.text and 'type="password"' in form.text
    assert (await World().client().get("/requests?fragment=1")).status_code == 401  # the script reloads


async def test_sign_in_sets_an_httponly_strict_cookie_that_is_not_the_key_and_sign_out_ends_it() -> None:
    world = World()
    async with world.client() as c:
        r = await sign_in(c, ADMIN)
        assert r.status_code == 303 and r.headers["location"] == "/"
        cookie = next(h for h in r.headers.get_list("set-cookie") if h.startswith(auth.COOKIE + "="))
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Secure" not in cookie
        assert ADMIN not in cookie and hash_key(ADMIN).split(":")[1] not in cookie
        home = await c.get("/")
        assert home.status_code == 200 and 'data-testid="signed-in-as"' in home.text
        for name in ("Overview", "Nodes", "Models", "Requests", "Guardrails", "Settings", "Do"):
            assert f">{name}</a>" in home.text
        out = await c.post("/signout", data={"csrf": csrf_of(home.text)})
        assert out.status_code == 303 and out.headers["location"] == "/signin"
        assert (await c.get("/")).status_code == 303
    assert len(sessions.console_of(world.app).sessions) == 0


async def test_the_cookie_is_secure_when_the_request_came_over_tls() -> None:
    async with World().client("https://cp.test") as c:
        r = await sign_in(c, ADMIN)
    cookie = next(h for h in r.headers.get_list("set-cookie") if h.startswith(auth.COOKIE + "="))
    assert "Secure" in cookie and "HttpOnly" in cookie


@pytest.mark.parametrize("key", ["sk-wrong", CLIENT, ""])
async def test_a_key_that_is_not_admin_or_viewer_cannot_sign_in_and_is_told_why(key: str) -> None:
    async with World().client() as c:
        r = await sign_in(c, key)
        assert r.status_code == 401 and "not an admin or viewer key" in r.text
        assert not any(h.startswith(auth.COOKIE + "=") for h in r.headers.get_list("set-cookie"))
        assert (await c.get("/")).status_code == 303


async def test_the_sign_in_form_needs_its_own_csrf_token() -> None:
    async with World().client() as c:
        await c.get("/signin")
        r = await c.post("/signin", data={"csrf": "forged", "key": ADMIN})
    assert r.status_code == 403 and "CSRF" in r.text


async def test_a_session_ends_after_its_idle_time_and_when_its_key_is_revoked() -> None:
    world = World()
    async with world.client() as c:
        await sign_in(c, ADMIN)
        world.now += world.reconciler.timeouts.console_session_idle_s - 1
        assert (await c.get("/settings")).status_code == 200  # used: its expiry moves on
        world.now += world.reconciler.timeouts.console_session_idle_s + 1
        assert (await c.get("/settings")).status_code == 303
    async with world.client() as c:
        await sign_in(c, VIEWER)
        assert (await c.get("/settings")).status_code == 200
        viewer = next(k for k in world.store.snapshot().keys.values() if k.role == "viewer")
        world.store.submit_nowait(commands.revoke_key(viewer.id, 0.0))
        assert (await c.get("/settings")).status_code == 303


# --- viewers and CSRF on actions --------------------------------------------------------------------


def with_action(world: World) -> list[str]:
    done: list[str] = []

    @auth.console_route(world.app, "/test-action", methods=("GET", "POST"), action=True)
    async def act(session: sessions.Session, deps: Any) -> str | Response:
        done.append(session.key_id)
        return auth.redirect("/")

    return done


async def test_a_viewer_sees_the_pages_but_is_refused_an_action_with_the_reason() -> None:
    world = World()
    done = with_action(world)
    async with world.client() as c:
        await sign_in(c, VIEWER)
        home = await c.get("/")
        assert home.status_code == 200 and "(viewer)" in home.text
        r = await c.post("/test-action", data={"csrf": csrf_of(home.text)})
    assert r.status_code == 403 and done == []
    assert "a viewer sees every page but cannot act" in r.text and 'data-testid="refusal-reason"' in r.text


async def test_every_post_needs_the_session_csrf_token() -> None:
    world = World()
    done = with_action(world)
    async with world.client() as c:
        await sign_in(c, ADMIN)
        home = await c.get("/")
        missing = await c.post("/test-action", data={})
        wrong = await c.post("/test-action", data={"csrf": "x" * 43})
        elsewhere = await c.post("/test-action", data={"csrf": csrf_of(home.text)},
                                 headers={"origin": "https://evil.example"})
        signout = await c.post("/signout", data={})
        assert done == [] and (await c.get("/")).status_code == 200  # the forged sign-out did nothing
        ok = await c.post("/test-action", data={"csrf": csrf_of(home.text)}, headers={"origin": "http://cp.test"})
    for r in (missing, wrong, signout):
        assert r.status_code == 403 and "CSRF token" in r.text, r.text
    assert elsewhere.status_code == 403 and "another site" in elsewhere.text
    assert ok.status_code == 303 and len(done) == 1


async def test_a_viewer_key_reads_the_admin_api_and_changes_nothing() -> None:
    async with World().client() as c:
        headers = {"Authorization": f"Bearer {VIEWER}"}
        assert (await c.get("/api/v1/settings", headers=headers)).status_code == 200
        r = await c.put("/api/v1/settings/guard.enabled", json=False, headers=headers)
        client = await c.get("/api/v1/settings", headers={"Authorization": f"Bearer {CLIENT}"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "viewer_key"
    assert client.status_code == 401


async def test_the_key_is_never_in_a_page_a_url_or_a_log(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    world = World()
    seen: list[str] = []
    async with world.client() as c:
        r = await sign_in(c, ADMIN)
        seen += [str(r.url), r.headers.get("location", ""), r.text]
        for path in ("/", "/requests", "/settings", "/?fragment=1", "/signin"):
            page = await c.get(path)
            seen += [str(page.url), page.text, json.dumps(dict(page.headers))]
    async with world.client() as c:
        wrong = await sign_in(c, "sk-a-wrong-key-typed-by-hand")
        seen += [wrong.text, json.dumps(dict(wrong.headers))]
    everything = "\n".join(seen) + "\n".join(rec.getMessage() for rec in caplog.records)
    assert ADMIN not in everything and "sk-a-wrong-key-typed-by-hand" not in everything
    assert any("signed in" in rec.getMessage() for rec in caplog.records)  # the log does say who


# --- pages show the state's facts --------------------------------------------------------------------


async def test_the_overview_shows_capacity_fabrics_models_members_guards_webhook_and_usage() -> None:
    store = store_with([model("chat").sim(), model("huge").vllm().gpus(8).classes("b200-192g")])
    nodes = [node("n1").gpus(2, "h100-80g").fabric("ib-a").engines("sim", "vllm").build(),
             node("n2").mig(0, "a100-80g", ("3g.40gb", 40), ("3g.40gb", 40)).fabric("ib-b").engines("sim").build()]
    world = World(store, nodes)
    hour = int(NOW) - int(NOW) % 3600
    rows = [usage.row_doc(hour - 3600, "key_x", "chat", 7, 100, 50, 0, 0)]
    store.submit_nowait(usage.add_usage("gw1", "boot1", 1, rows, "", NOW))
    await world.reconciler.run_once()
    async with world.client() as c:
        await sign_in(c, ADMIN)
        html = (await c.get("/")).text
        fragment = (await c.get("/?fragment=1")).text
    for fact in ("h100-80g", "a100-80g-mig-3g.40gb", "MIG instance", "ib-a", "ib-b", 'data-testid="no-webhook"',
                 'data-testid="members-table"', 'data-testid="guards-state">on',
                 'data-testid="chart-requests"', 'data-value="7"', 'data-value="150"', "huge", "unplaceable"):
        assert fact in html, fact
    assert fragment.startswith('<div id="banners">') and "<nav>" not in fragment and "capacity-table" in fragment
    assert "stopped-banner" not in html


async def test_every_page_says_when_the_system_is_stopped() -> None:
    world = World(store_with(settings={"serving.stopped": True}))
    async with world.client() as c:
        await sign_in(c, VIEWER)
        pages = [(await c.get(path)).text for path in ("/", "/requests", "/settings", "/settings?fragment=1")]
    assert all('data-testid="stopped-banner"' in text for text in pages)


async def test_the_settings_page_lists_every_setting_with_help_default_and_value() -> None:
    from llmgw.domain.settings import SETTINGS

    store = store_with(settings={"notify.webhooks": ["https://hooks.example/services/T0/SECRET"]})
    world = World(store)
    async with world.client() as c:
        await sign_in(c, ADMIN)
        admin_page = (await c.get("/settings")).text
    async with world.client() as c:
        await sign_in(c, VIEWER)
        viewer_page = (await c.get("/settings")).text
    for key, spec in SETTINGS.items():
        assert f'id="setting-{key}"' in admin_page
        row = re.search(rf'id="setting-{re.escape(key)}".*?</tr>', admin_page, re.S)
        assert row is not None
        cells = re.findall(r"<td>(.*?)</td>", "<td>" + row.group(0), re.S)
        assert cells[2] == f"<code>{esc(json.dumps(spec.default))}</code>", (key, cells)  # its default
        assert spec.help.replace("'", "&#x27;").replace('"', "&quot;")[:40] in admin_page.replace("&amp;", "&")
    assert "SECRET" in admin_page and "SECRET" not in viewer_page and "hooks.example" in viewer_page


async def test_the_requests_page_lists_records_with_guard_rule_and_names_the_gateways_that_did_not_answer() -> None:
    record = {"id": "req-gw1-0123456789abcdef", "time": NOW - 5, "key": "key_abc", "model": "chat", "status": 400,
              "error": "guard_refused", "latency_ms": 12.5, "tokens_in": 3, "tokens_out": None,
              "guard_rule": "judge: S6,Specialized Advice", "node": "n1", "gateway": "gw1",
              "served_model": "chat-backup",  # a fallback served it: shown beside the name asked for
              "priority": "bulk", "queue_ms": 41.26}  # its class, and its wait for a slot (one decimal)
    # Before any key was admitted: no class, and it never asked for a slot. Unknown is `-`, never 0.
    unqueued = {**record, "id": "req-gw1-00000000000000ff", "time": NOW - 9, "priority": "", "queue_ms": None}
    asked: list[str] = []

    async def fake_gateway(stream: trio.SocketStream) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += await stream.receive_some(65536)
        asked.append(data.decode("latin-1"))
        body = json.dumps({"requests": [record, unqueued], "cursor": None, "positions": [None, None],
                           "statistics": {"keeps_log": True, "dropped": 0}}).encode()
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                              b"connection: close\r\n\r\n%s" % (len(body), body))
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, fake_gateway, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        world = World()
        hour = int(NOW) - int(NOW) % 3600
        one_row = [usage.row_doc(hour, "key_abc", "chat", 1, 3, 0, 0, 0)]
        world.store.submit_nowait(usage.add_usage("gw1", "b", 1, one_row, f"http://127.0.0.1:{port}", NOW))
        world.store.submit_nowait(usage.add_usage("gw2", "b", 1, one_row, "", NOW))
        async with world.client() as c:
            await sign_in(c, ADMIN)
            r = await c.get("/requests?model=chat&status=4xx&since=2020-01-01&until=2030-01-01T00:00&key=key_abc"
                            "&priority=bulk")
            bad = await c.get("/requests?status=teapot")
            bad_class = await c.get("/requests?priority=urgent")
        nursery.cancel_scope.cancel()
    assert r.status_code == 200
    for fact in ("req-gw1-0123456789abcdef", "judge: S6,Specialized Advice", "guard_refused", 'data-testid='
                 '"gateways-unavailable"', "gw2", "announced no address", "chat → chat-backup"):
        assert fact in r.text, fact
    assert "model=chat" in asked[0] and "status=4xx" in asked[0] and "since=1577836800" in asked[0]
    assert "until=1893456000" in asked[0] and "key=key_abc" in asked[0]  # every filter of the API
    assert "priority=bulk" in asked[0] and len(asked) == 1  # an unknown class is refused before any gateway
    rows = r.text.split('data-testid="requests-table"')[1].split("<tbody>")[1].split("</tr>")
    head = r.text.split('data-testid="requests-table"')[1].split("</thead>")[0]
    assert "<th data-sort=\"1\">class</th><th data-sort=\"1\">queue ms</th>" in head
    assert "<td>bulk</td><td>41.3</td>" in rows[0]
    assert "<td>-</td><td>-</td>" in rows[1] and "<td>0" not in rows[1]
    assert 'data-testid="requests-error"' in bad_class.text and "priority must be one of" in bad_class.text
    assert f"authorization: Bearer {ADMIN}".lower() in asked[0].lower()  # asked with the signed-in key
    assert 'data-testid="requests-error"' in bad.text and "status must be a code" in bad.text
