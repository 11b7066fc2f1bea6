"""A control plane's admin app (with the console) over a MemoryStore and a hub of constructed agents, for the
tests of the Nodes, Models, Guardrails and Do pages; signing in as a browser does (form, cookie, CSRF)."""

from __future__ import annotations

import html as html_lib
import re
from typing import Any, Iterable

import httpx
import trio

from llmgw import console
from llmgw.control.api import make_app
from llmgw.control.context import Context
from llmgw.control.hub import AgentHub, AgentLink
from llmgw.control.reconciler import Reconciler
from llmgw.domain import commands
from llmgw.domain.keys import hash_key
from llmgw.domain.observed import NodeInfo
from llmgw.reconcile import ModelView, Plan
from llmgw.testing import MemoryStore

ADMIN = "sk-console-pages-admin-0123456789"
VIEWER = "sk-console-pages-viewer-0123456789"
NOW = 1_800_000_000.0


class World:
    """The admin app over `store` with `nodes` connected; `views` stand for the reconciler's last pass."""

    def __init__(self, store: MemoryStore | None = None, nodes: Iterable[NodeInfo] = (),
                 views: dict[str, ModelView] | None = None) -> None:
        self.store = store or MemoryStore()
        for key, role in ((ADMIN, "admin"), (VIEWER, "viewer")):
            self.store.submit_nowait(commands.add_key(hash_key(key), role, role, 0.0))
        self.now = NOW
        self.hub = AgentHub(clock=lambda: self.now)
        self.links: dict[str, AgentLink] = {}
        for info in nodes:
            send, _ = trio.open_memory_channel[dict[str, Any]](10)
            self.links[info.node] = self.hub.connect(info.node, send)
            self.hub.report_inventory(self.links[info.node], info)
        self.reconciler = Reconciler(self.store, self.hub, clock=lambda: self.now)
        if views is not None:
            self.reconciler.last_plan = Plan(commands=(), actions=(), routes={}, views=views, unplaceable={})
        self.deps = Context(store=self.store, hub=self.hub, reconciler=self.reconciler, clock=lambda: self.now)
        self.app: Any = make_app(self.deps, (console.register,))

    def client(self, key: str | None = None) -> httpx.AsyncClient:
        headers = {"authorization": f"Bearer {key}"} if key else {}
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url="http://cp.test",
                                 headers=headers)


async def sign_in(c: httpx.AsyncClient, key: str = ADMIN) -> None:
    form = await c.get("/signin")
    r = await c.post("/signin", data={"csrf": csrf_of(form.text), "key": key})
    assert r.status_code == 303, r.text


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, html
    return found.group(1)


def hidden(html: str, form_testid: str) -> dict[str, str]:
    """The fields of the form with this data-testid (hidden inputs: what a browser sends back)."""
    form = re.search(rf'<form[^>]*data-testid="{form_testid}"[^>]*>(.*?)</form>', html, re.S)
    assert form, html
    return {k: html_lib.unescape(v) for k, v in
            re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', form.group(1))}


def text_of(html: str, name: str) -> str:
    """The text inside the first element with this data-testid (tags stripped)."""
    found = re.search(rf'data-testid="{name}"[^>]*>(.*?)</(section|p|div|table|span)>', html, re.S)
    assert found, f"no {name} in {html[:2000]}"
    return html_lib.unescape(re.sub(r"<[^>]+>", "", found.group(1)))


def rows(html: str, table_testid: str) -> list[list[str]]:
    """The body rows of the table with this data-testid, each cell's text."""
    found = re.search(rf'<table[^>]*data-testid="{table_testid}"[^>]*>.*?<tbody>(.*?)</tbody>', html, re.S)
    assert found, f"no table {table_testid}"
    return [[html_lib.unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", r, re.S)]
            for r in re.findall(r"<tr[^>]*>(.*?)</tr>", found.group(1), re.S)]
