"""The admin API's OpenAPI document (`llmgw/control/api/openapi.py`): valid OpenAPI 3.1, served without a key
as the code builds it, and holding exactly the route table's routes and the app's, so that it cannot drift
from them."""

from __future__ import annotations

import json
from typing import Any

import httpx
from schemathesis.specs.openapi.definitions import OPENAPI_31_VALIDATOR

from llmgw.control.api import make_app, openapi, route
from llmgw.control.api.table import ROUTES
from llmgw.control.context import Context
from llmgw.control.hub import AgentHub
from llmgw.control.reconciler import Reconciler
from llmgw.testing import MemoryStore

IGNORED_METHODS = {"HEAD", "OPTIONS"}  # added by Quart to every GET / every route


def app() -> Any:
    store, hub = MemoryStore(), AgentHub()
    return make_app(Context(store=store, hub=hub, reconciler=Reconciler(store, hub), clock=lambda: 0.0))


def routes(quart_app: Any) -> dict[str, set[str]]:
    """Each route of the app as an OpenAPI path, with its methods (a WebSocket route's is GET)."""
    out: dict[str, set[str]] = {}
    for rule in quart_app.url_map.iter_rules():
        if rule.endpoint != "static" and not rule.endpoint.startswith("console_"):  # the web console: not the API
            out.setdefault(openapi.rule_path(rule.rule), set()).update(set(rule.methods or ()) - IGNORED_METHODS)
    return out


def test_every_route_is_in_the_document_and_every_operation_is_a_route() -> None:
    documented = {path: {m.upper() for m in ops} for path, ops in openapi.document()["paths"].items()}
    assert documented == routes(app())


def test_the_document_is_the_route_table_and_says_who_may_call_each() -> None:
    """Every line of the table is an operation of the document and back (the streams aside); a public line
    needs no key there, every other one the admin key."""
    table = {(openapi.rule_path(r.rule), r.method.lower()): r for r in ROUTES}
    documented = {(path, method): op for path, ops in openapi.document()["paths"].items()
                  for method, op in ops.items() if path not in openapi.WEBSOCKET_PATHS | openapi.MACHINE_PATHS}
    assert set(documented) == set(table)
    for at, op in documented.items():
        assert (op.get("security") == []) == (table[at].role == route.PUBLIC), at


def test_every_route_of_the_table_takes_the_key_its_method_needs() -> None:
    """Reads take a viewer key (the console's), writes an admin key; only the probes take none, and a
    machine's join (its token is its credential) and the CA's public certificates (what it pins). A release file
    is read by the cluster's machines with their certificate (or an admin key), never a viewer key."""
    for r in ROUTES:
        if r.role == route.MACHINE:
            assert (r.method, r.rule) == ("GET", "/api/v1/releases/<sha256>")
        elif r.role != route.PUBLIC:
            assert r.role == (route.ADMIN if r.writes else route.VIEWER), (r.method, r.rule)
    assert {r.rule for r in ROUTES if r.role == route.PUBLIC} == set(openapi.NO_KEY_PATHS)


def test_a_werkzeug_rule_reads_as_an_openapi_path() -> None:
    assert openapi.rule_path("/api/v1/models/<path:name>/retry") == "/api/v1/models/{name}/retry"
    assert openapi.rule_path("/api/v1/keys/<key_id>") == "/api/v1/keys/{key_id}"


def test_the_document_is_valid_openapi_3_1() -> None:
    doc = json.loads(json.dumps(openapi.document()))  # as served: plain JSON
    errors = [f"{'/'.join(map(str, e.instance_path))}: {e.message}" for e in OPENAPI_31_VALIDATOR.iter_errors(doc)]
    assert not errors, errors[:5]
    refs = {r for r in json.dumps(doc).split('"$ref": "')[1:]}
    for ref in {r.partition('"')[0] for r in refs}:
        _, section, name = ref.rsplit("/", 2)
        assert name in doc["components"][section], f"{ref} names nothing"


def test_every_admin_operation_needs_the_admin_key_and_says_what_refuses_it() -> None:
    for path, ops in openapi.document()["paths"].items():
        for method, op in ops.items():
            if path in openapi.NO_KEY_PATHS or path in openapi.WEBSOCKET_PATHS | openapi.MACHINE_PATHS:  # no key
                continue
            assert "security" not in op, f"{method} {path} overrides the admin key"
            assert {"401", "503"} <= set(op["responses"]), f"{method} {path}"
            if method in ("post", "put", "delete"):  # the Idempotency-Key is read (and checked: 400) on each
                assert "Idempotency-Key" in {p["name"] for p in op["parameters"]}, f"{method} {path}"
                assert "400" in op["responses"], f"{method} {path}"


def test_the_bounds_it_states_are_the_ones_the_code_checks() -> None:
    posted = openapi.document()["paths"]["/api/v1/models"]["post"]["parameters"]
    idempotency = next(p for p in posted if p["name"] == "Idempotency-Key")["schema"]
    assert idempotency["maxLength"] == route.IDEMPOTENCY_KEY_MAX_CHARS
    assert "1 MiB" in openapi.document()["components"]["responses"]["E413"]["description"]
    assert route.MAX_BODY_BYTES == 1 << 20


async def test_it_is_served_without_a_key_as_json() -> None:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app()), base_url="http://control.test") as c:
        r = await c.get(openapi.PATH)
        refused = await c.get("/api/v1/status")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert r.json() == openapi.document()
    assert refused.status_code == 401, "the document needs no key; the API still does"
