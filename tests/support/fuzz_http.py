"""Hostile HTTP requests for the fuzz tests and their bench runner (Hypothesis strategies), the servers
they hit, each in a thread of its own (the gateway over sim engines, the admin API over a MemoryStore),
and the rule every answer keeps: never a 5xx, never an HTML page, a refusal in the API's error shape.

Deep nesting, huge numbers, NaN, invalid UTF-8, wrong types, unknown and engine-private fields,
hostile headers (keys, content types, long and odd values), odd methods, paths and query strings.
"""

from __future__ import annotations

import base64
import json
import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any
from urllib.parse import quote

import httpx
import trio
from hypothesis import strategies as st

from llmgw.domain import commands
from llmgw.domain.keys import hash_key
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import Endpoint, ModelRoute
from llmgw.gateway.checks import ENGINE_PRIVATE, FIELDS, POST_PATHS
from llmgw.testing import MemoryStore

__all__ = ["ADMIN_KEY", "KEY", "Probe", "admin_probes", "check_answer", "in_thread", "live_admin", "live_gateway",
           "v1_probes"]

KEY = "sk-fuzz-client"
ADMIN_KEY = "sk-fuzz-admin"
MODELS = ("demo", "demo-embed")
# Headers whose hostile values would only break the client's own framing, not test the server.
_FRAMING = {b"content-length", b"transfer-encoding", b"host", b"connection", b"upgrade", b"te", b"trailer",
            b"expect"}


@dataclass(frozen=True)
class Probe:
    """One request: what Hypothesis prints when it finds an answer that breaks the rule."""

    method: str
    path: str
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes

    def send(self, client: httpx.Client) -> httpx.Response:
        return client.request(self.method, self.path, headers=list(self.headers), content=self.body)


# --- values --------------------------------------------------------------------------------

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    _scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)
_field_names = st.sampled_from(sorted({f for fields in FIELDS.values() for f in fields} | ENGINE_PRIVATE)) | st.text(
    max_size=12)


def _base(kind: str, model: str) -> dict[str, Any]:
    if kind == "chat":
        return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    if kind == "completion":
        return {"model": model, "prompt": "hi", "max_tokens": 4}
    return {"model": model, "input": "hi"}


@st.composite
def _v1_body(draw: st.DrawFn, kind: str) -> bytes:
    right = "demo-embed" if kind == "embedding" else "demo"
    model = right if draw(st.integers(0, 4)) else draw(st.sampled_from(MODELS) | st.text(max_size=10))
    base = _base(kind, model)
    shape = draw(st.sampled_from(["fields", "fields", "stream", "raw", "deep", "deep_inside", "number", "utf8"]))
    if shape == "fields":  # wrong types, unknown and private fields, on an otherwise fine request
        extra = draw(st.dictionaries(_field_names, json_values, max_size=3))
        return json.dumps({**base, **extra}).encode()
    if shape == "stream":
        options = draw(st.none() | st.fixed_dictionaries({"include_usage": st.booleans()}) | json_values)
        return json.dumps({**base, "stream": True, "stream_options": options}).encode()
    if shape == "raw":
        return draw(st.binary(max_size=200) | st.sampled_from([b"", b"null", b"[]", b"{}", b'"x"', b"{\"model\":"]))
    if shape == "deep":
        opener = draw(st.sampled_from([b"[", b'{"a":', b'{"model":"demo","messages":[']))
        return opener * draw(st.integers(min_value=1, max_value=200_000))
    if shape == "deep_inside":  # complete JSON, nested inside a field the gateway passes on
        n = draw(st.integers(min_value=1, max_value=3000))
        inner = b"[" * n + b"]" * n
        return json.dumps({**base, "user": None}).encode()[:-1] + b', "metadata": {"x": ' + inner + b"}}"
    if shape == "number":
        digits = draw(st.sampled_from([b"1e999999", b"-1e999999", b"NaN", b"Infinity", b"1" * 5000, b"1" * 4000,
                                       b"0.0000000000000000000000001", b"18446744073709551616", b"-0"]))
        field = draw(st.sampled_from(["max_tokens", "temperature", "n", "seed", "top_p", "dimensions"]))
        return json.dumps(base).encode()[:-1] + b', "' + field.encode() + b'": ' + digits + b"}"
    raw = draw(st.binary(min_size=1, max_size=4).filter(lambda b: b'"' not in b and b"\\" not in b))
    return json.dumps(base).encode().replace(b'"hi"', b'"h' + raw + b'i"')  # invalid UTF-8 in a string


@st.composite
def _headers(draw: st.DrawFn, key: str) -> tuple[tuple[bytes, bytes], ...]:
    auth = draw(st.sampled_from([f"Bearer {key}".encode()] * 12 + [
        b"Bearer", b"Bearer  x", b"bearer " + key.encode(), b"Basic " + key.encode(), b"Bearer " + b"x" * 5000,
        b"Bearer \xe9\xff", b"Bearer " + key.encode() + b" extra", b""]))
    headers = [(b"authorization", auth)] if auth else []
    headers.append((b"content-type", draw(st.sampled_from(
        [b"application/json", b"text/plain", b"application/json; charset=latin-1", b"multipart/form-data", b""]))))
    names = st.from_regex(rb"\A[a-z][a-z0-9-]{0,15}\Z").filter(lambda n: n not in _FRAMING)
    values = st.binary(max_size=60).map(lambda v: bytes(c for c in v if c >= 0x20 and c != 0x7F).strip())
    headers += draw(st.lists(st.tuples(names, values | st.just(b"v" * 6000)), max_size=3))
    return tuple(headers)


@st.composite
def v1_probes(draw: st.DrawFn) -> Probe:
    """A request to a `/v1` route (or next to one), hostile somewhere."""
    if draw(st.integers(0, 4)):  # mostly the POST routes, POSTed: the requests that reach an engine
        path, method = draw(st.sampled_from(sorted(POST_PATHS))), "POST"
    else:
        path = draw(st.sampled_from(["/v1/models", "/v1/models/demo", "/health", *POST_PATHS])
                    | st.text(max_size=12).map(lambda t: "/v1/models/" + quote(t, safe=""))
                    | st.text(max_size=12).map(lambda t: "/v1/" + quote(t)))
        method = draw(st.sampled_from(["POST", "GET", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]))
    kind = POST_PATHS.get(path) or draw(st.sampled_from(sorted(FIELDS)))
    return Probe(method, path, draw(_headers(KEY)), draw(_v1_body(kind)))


# Already escaped for a URL: invalid UTF-8, NUL, dot segments, an escaped slash, numbers no parser should take
# whole ('²' is a digit to str.isdigit, int() stops at 4300 digits), and a cursor nesting deeper than json can.
_RAW_URL_TEXT = ["%ff", "%c3%28", "%00", "%2e%2e", "..", "%2F", "%C2%B2", "nan", "inf", "-1e999", "1" * 5000, "",
                 base64.urlsafe_b64encode(b"[" * 3000).decode()]
_url_text = st.text(min_size=1, max_size=12).map(lambda t: quote(t, safe="")) | st.sampled_from(_RAW_URL_TEXT)
_QUERY_NAMES = ["since", "until", "limit", "cursor", "status", "by", "model", "key", "x"]


def _query_names(template: str) -> list[str]:
    """The query parameters the admin API's OpenAPI document gives the route (any of them, else)."""
    from llmgw.control.api.openapi import document, rule_path

    ops = document()["paths"].get(rule_path(template), {}).values()
    return sorted({p["name"] for op in ops for p in op.get("parameters", ()) if p["in"] == "query"}) or _QUERY_NAMES


@st.composite
def _admin_query(draw: st.DrawFn, template: str) -> str:
    """A query string, half the time empty; else the route's parameters (and others) with hostile values."""
    if draw(st.booleans()):
        return ""
    names = st.sampled_from(_query_names(template)) | st.text(max_size=6).map(lambda t: quote(t, safe=""))
    pairs = draw(st.lists(st.tuples(names, st.sampled_from(_RAW_URL_TEXT) | _url_text), min_size=1, max_size=4))
    return "?" + "&".join(f"{name}={value}" for name, value in pairs)


@st.composite
def admin_probes(draw: st.DrawFn, rules: list[tuple[str, frozenset[str]]]) -> Probe:
    """A request to one of the admin API's `rules` (path template, methods): its variables filled
    with odd text, a hostile query string, any method, a body of any JSON value or any bytes."""
    # The routes that read a query string have the most to read: drawn as often as all the others together.
    queried = [rule for rule in rules if _query_names(rule[0]) is not _QUERY_NAMES]
    template, methods = draw(st.sampled_from(rules) | st.sampled_from(queried or rules))
    path = template
    while "<" in path:
        head, _, rest = path.partition("<")
        path = head + (draw(_url_text) or "x") + rest.partition(">")[2]
    path += draw(_admin_query(template))
    method = draw(st.sampled_from(sorted(methods)) | st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH"]))
    body = draw(json_values.map(lambda v: json.dumps(v).encode()) | st.binary(max_size=100)
                | st.integers(1, 100_000).map(lambda n: b"[" * n)
                | st.sampled_from([b"", b"NaN", b"1e999999", b"{\"name\": \"\xff\"}"]))
    return Probe(method, path, draw(_headers(ADMIN_KEY)), body)


# --- the rule -------------------------------------------------------------------------------


def check_answer(probe: Probe, response: httpx.Response, shape: str) -> None:
    """No 5xx, no HTML; a refusal in the API's error shape (`shape`: "openai" or "admin")."""
    status = response.status_code
    assert status < 500, f"{status} for {probe!r}: {response.text[:300]}"
    content_type = response.headers.get("content-type", "")
    if shape == "admin" and _console(probe.path):
        return  # the console's pages (and its static files) are no API: HTML by design, no error shape
    assert "html" not in content_type and not response.text.lstrip().lower().startswith("<"), (
        f"an HTML page for {probe!r}: {response.text[:300]}")
    if content_type.startswith("application/json") and response.content and probe.method != "HEAD":
        json.loads(response.content, parse_constant=partial(_not_json, probe))  # NaN, Infinity: no client reads them
    if status < 400 or probe.method == "HEAD" or not response.content:
        return
    assert content_type.startswith("application/json"), f"{status} {content_type!r} for {probe!r}"
    error = response.json()["error"]
    keys = {"message", "type", "param", "code"} if shape == "openai" else {"code", "message"}
    assert set(error) == keys and error["message"], f"{error!r} for {probe!r}"
    if shape == "openai":
        assert response.headers.get("x-request-id", "").startswith("req-"), f"no x-request-id for {probe!r}"


def _console(path: str) -> bool:
    """A path the console answers (`/`, `/nodes`, ...): everything the admin port serves outside the API."""
    return not path.startswith(("/api/", "/metrics", "/health", "/v1"))


def _not_json(probe: Probe, constant: str) -> Any:
    raise AssertionError(f"{constant} in a JSON answer (no JSON parser but Python's reads it) for {probe!r}")


# --- the servers, each on its own trio loop in a thread ---------------------------------------


@contextmanager
def in_thread(main: Any) -> Iterator[str]:
    """Run `main(task_status)` (which reports a URL) on its own trio loop in a thread, until the block ends."""
    ready: queue.Queue[tuple[str, trio.lowlevel.TrioToken, trio.CancelScope] | BaseException] = queue.Queue()

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            url = await nursery.start(main)
            ready.put((url, trio.lowlevel.current_trio_token(), nursery.cancel_scope))

    def thread() -> None:
        try:
            trio.run(run)
        except BaseException as error:  # told to the waiting test rather than lost in the thread
            ready.put(error)

    worker = threading.Thread(target=thread, name="fuzz-server", daemon=True)
    worker.start()
    got = ready.get(timeout=60)
    if isinstance(got, BaseException):
        raise got
    url, token, scope = got
    try:
        yield url
    finally:
        trio.from_thread.run_sync(scope.cancel, trio_token=token)
        worker.join(30)


async def _gateway(*, task_status: trio.TaskStatus[str]) -> None:
    from llmgw.engines import sim
    from llmgw.gateway.app import GatewayDeps, serve
    from llmgw.gateway.router import Router

    store = MemoryStore()
    store.submit_nowait(commands.add_key(hash_key(KEY), "fuzz", "client", 0.0))
    routes = {}
    async with trio.open_nursery() as nursery:
        for name, role in (("demo", "chat"), ("demo-embed", "embedding")):
            store.submit_nowait(commands.put_model(
                ModelDef.from_doc({"name": name, "engine": "sim", "source": f"sim://{name}", "role": role}), at=0.0))
            url = await nursery.start(partial(sim.serve, sim.SimOptions("127.0.0.1", 0, name, role, 0)))
            routes[name] = ModelRoute(name, role, "ready", (Endpoint(f"{name}-r1", url),))
        router = Router()
        router.update_routes(routes)
        host, port = await nursery.start(partial(serve, "127.0.0.1", 0, GatewayDeps(router=router, state=store)))
        task_status.started(f"http://{host}:{port}")


def live_gateway() -> Any:
    """A gateway over two sim engines (`demo`, `demo-embed`), served from a thread; yields its URL."""
    return in_thread(_gateway)


async def _admin(rules_out: list[tuple[str, frozenset[str]]], *, task_status: trio.TaskStatus[str]) -> None:
    from hypercorn.trio import serve as hypercorn_serve

    from llmgw.wire.asgi import hypercorn_config
    from llmgw import console
    from llmgw.control.api import make_app
    from llmgw.control.context import Context
    from llmgw.control.hub import AgentHub
    from llmgw.control.reconciler import Reconciler

    store = MemoryStore()
    store.submit_nowait(commands.add_key(hash_key(ADMIN_KEY), "fuzz", "admin", 0.0))
    store.submit_nowait(commands.put_model(
        ModelDef.from_doc({"name": "demo", "engine": "sim", "source": "sim://demo"}), at=0.0))
    hub = AgentHub()
    app = make_app(Context(store=store, hub=hub, reconciler=Reconciler(store, hub), clock=lambda: 0.0),
                   (console.register,))
    rules_out.extend((rule.rule, frozenset(rule.methods or ())) for rule in app.url_map.iter_rules()
                     if not rule.rule.startswith("/static"))
    config = hypercorn_config("127.0.0.1", 0, logger="llmgw.control.server", graceful_s=1, keep_alive_s=30)
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(partial(hypercorn_serve, app, config))
        task_status.started(binds[0])


@contextmanager
def live_admin() -> Iterator[tuple[str, list[tuple[str, frozenset[str]]]]]:
    """The admin API over a MemoryStore, served from a thread; yields its URL and its routes."""
    rules: list[tuple[str, frozenset[str]]] = []
    with in_thread(partial(_admin, rules)) as url:
        yield url, rules
