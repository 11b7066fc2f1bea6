"""What the admin API's fuzz found (tests/integration/test_admin_schemathesis.py, test_gateway_fuzz.py), each
pinned: a query or a member address that was answered 500, or as JSON no client reads (NaN), is a 400 now."""

from __future__ import annotations

import base64
from typing import Any
import httpx
import pytest

from llmgw.control.api import make_app
from llmgw.control.context import Context
from llmgw.control.hub import AgentHub
from llmgw.control.members import member_addr
from llmgw.control.reconciler import Reconciler
from llmgw.domain import commands
from llmgw.domain.keys import hash_key
from llmgw.errors import AdminError
from llmgw.testing import MemoryStore

ADMIN = "sk-bad-input-admin"


def client() -> httpx.AsyncClient:
    store, hub = MemoryStore(), AgentHub()
    store.submit_nowait(commands.add_key(hash_key(ADMIN), "admin", "admin", 0.0))
    app: Any = make_app(Context(store=store, hub=hub, reconciler=Reconciler(store, hub), clock=lambda: 0.0))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://control.test",
                             headers={"Authorization": f"Bearer {ADMIN}"})


DEEP_CURSOR = base64.urlsafe_b64encode(b"[" * 3000).decode()


@pytest.mark.parametrize(("query", "words"), [
    ("/api/v1/requests?limit=%C2%B2", "limit must be a whole number"),  # '²'.isdigit(), int('²') raises
    ("/api/v1/requests?limit=" + "1" * 5000, "limit must be a whole number"),  # int() stops at 4300 digits
    ("/api/v1/requests?cursor=" + DEEP_CURSOR, "cursor is not one this API gave"),  # json.loads: RecursionError
    ("/api/v1/requests?status=", "status is empty"),  # the gateways read it as no filter
    ("/api/v1/requests?since=", "since is empty"),
    ("/api/v1/requests?priority=", "priority is empty"),
    ("/api/v1/requests?priority=urgent", "priority must be one of system, interactive, default, bulk"),
    ("/api/v1/requests?modle=demo", "unknown query parameter 'modle'"),  # a misspelt filter: not unfiltered
    ("/api/v1/usage?since=nan", "finite"),  # answered 200 with `"since": NaN`
    ("/api/v1/usage?until=-1e999", "finite"),
    ("/api/v1/usage?model=demo&by=hour&bogus=1", "unknown query parameter 'bogus'"),
])
async def test_a_query_the_routes_cannot_read_is_a_400_with_words(query: str, words: str) -> None:
    async with client() as c:
        r = await c.get(query)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "invalid_query" and words in error["message"], error


async def test_the_filters_that_are_fine_still_answer() -> None:
    async with client() as c:
        listed = await c.get("/api/v1/requests?limit=10&model=demo&key=&status=4xx&since=0&until=2e9&priority=bulk")
        used = await c.get("/api/v1/usage?since=0&until=2e9&by=day")
    assert listed.status_code == 200 and listed.json()["requests"] == [], listed.text
    assert used.status_code == 200 and used.json()["since"] == 0.0, used.text


@pytest.mark.parametrize("text", ["/\u00c9:066", "h\u00f6st:7000", "host:\u00b2", "a b:1", "x" * 300 + ":1"])
def test_a_member_address_no_resolver_takes_is_refused_before_any_dial(text: str) -> None:
    # A non-ASCII host made trio's getaddrinfo raise an IDNA error (500); '²' passed isdigit, failed int().
    with pytest.raises(AdminError) as refused:
        member_addr(text)
    assert (refused.value.status, refused.value.code) == (400, "invalid_member")


@pytest.mark.parametrize("text", ["10.0.0.2:7000", "control-2.example:7000", "[::1]:7000", "::1:7000"])
def test_member_addresses_that_are_fine_still_are(text: str) -> None:
    assert member_addr(text) == text
