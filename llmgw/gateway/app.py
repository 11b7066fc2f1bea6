"""The OpenAI-compatible `/v1` API (S4) as a raw ASGI app, and its hypercorn server.
Owns authentication, request checks, which refusal (S14) each failure gets and the streaming proxy to engines.

Raw ASGI rather than a framework: the hot path is one key hash, one JSON parse
and one upstream call, so the gateway adds little to a direct engine call.
Refusals are `llmgw.errors.OpenAIError`s, whose shape and `type` live there.
Never logs a prompt, a completion or a key.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import httpx
import trio
from hypercorn.trio import serve as hypercorn_serve

from llmgw.asgi import (
    MAX_BODY_BYTES,
    Exchange,
    Receive,
    Scope,
    Send,
    cancel_on_disconnect,
    dumps,
    hypercorn_config,
    lifespan,
    parse_object,
    read_body,
    send_json,
)
from llmgw.domain.keys import hash_key
from llmgw.domain.observed import Endpoint
from llmgw.domain.settings import effective
from llmgw.domain.state import ClusterState
from llmgw.domain.timeouts import TIMEOUTS, Timeouts
from llmgw.errors import OpenAIError, describe
from llmgw.gateway.checks import (
    POST_PATHS,
    ROLES_FOR,
    allow,
    bearer,
    check_request,
    model_doc,
    role_words,
)
from llmgw.gateway import upstream
from llmgw.gateway.router import NoEndpoint, Router
from llmgw.interfaces import StateReader
from llmgw.logs import request_id_var, role_var

__all__ = [
    "GatewayApp",
    "GatewayDeps",
    "make_app",
    "make_client",
    "parse_bind",
    "serve",
]

_log = logging.getLogger("llmgw.gateway.app")
_access = logging.getLogger("llmgw.gateway.access")

# A refused request's unread body is discarded up to this many times the cap
# (for at most `Timeouts.gateway_drain_body_s`).
DRAIN_FACTOR = 4

# Hop-by-hop (RFC 9110 §7.6.1) plus what this server sets itself.
_DROP_UPSTREAM = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"date",
        b"server",
        b"content-length",
        b"x-request-id",
    }
)


def _no_endpoint_status(code: str) -> int:
    return 504 if code == "activation_timeout" else 503


@dataclass
class GatewayDeps:
    router: Router
    state: StateReader
    client: httpx.AsyncClient | None = None  # built (and closed by `serve`) when None
    max_body_bytes: int = MAX_BODY_BYTES
    timeouts: Timeouts = TIMEOUTS
    # What GET /health adds to {"status": "ok"} (a remote gateway: its table's age and leader).
    health: Callable[[], dict[str, Any]] | None = None


def make_client(timeouts: Timeouts = TIMEOUTS) -> httpx.AsyncClient:
    """The upstream client: no read timeout (generations take what they take)."""
    t = timeouts
    return httpx.AsyncClient(
        timeout=httpx.Timeout(connect=t.upstream_connect_s, read=None, write=t.upstream_write_s, pool=t.upstream_pool_s),
        # Expire idle connections before the engines' server closes them.
        limits=httpx.Limits(max_connections=1000, max_keepalive_connections=200, keepalive_expiry=t.upstream_idle_s),
    )


def make_app(deps: GatewayDeps) -> GatewayApp:
    """The ASGI app; whoever serves it calls `aclose()` when done (`serve` does)."""
    return GatewayApp(deps)


class _Exchange(Exchange):
    """One request's progress: what its log line reports and how far its answer got."""

    __slots__ = ("request_id", "model", "replica", "status", "started")

    def __init__(self, request_id: str) -> None:
        super().__init__()
        self.request_id = request_id
        self.model = "-"
        self.replica = "-"
        self.status = 0
        self.started = False


class GatewayApp:
    """Raw ASGI app; `make_app` builds it. `aclose()` closes an upstream client it built."""

    def __init__(self, deps: GatewayDeps) -> None:
        self.deps = deps
        self._owns_client = deps.client is None
        self.client = deps.client if deps.client is not None else make_client(deps.timeouts)
        self._drain_s = deps.timeouts.gateway_drain_body_s  # read once, not per refusal

    async def aclose(self) -> None:
        if self._owns_client:
            await self.client.aclose()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "lifespan":
            await lifespan(receive, send)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = trio.current_time()
        ex = _Exchange("req-" + os.urandom(8).hex())
        token = request_id_var.set(ex.request_id)
        method: str = scope["method"]
        # The raw target for the log: h11 refused control characters in it, the decoded path may have some.
        path = scope.get("raw_path", b"").decode("ascii", "replace") or scope["path"]
        try:
            try:
                await self._dispatch(ex, scope, receive, send)
            except OpenAIError as error:
                if not ex.started:
                    await self._refuse(ex, scope, receive, send, error)
            except Exception:
                _log.exception("request failed: %s %s", method, path)
                if not ex.started:
                    failure = OpenAIError(500, "internal_error", "the gateway failed; see its log")
                    await self._refuse(ex, scope, receive, send, failure)
        finally:
            status = 499 if ex.disconnected else ex.status
            # Load balancers probe /health every few seconds; those lines would bury the requests.
            _access.log(
                logging.DEBUG if path == "/health" else logging.INFO,
                "%s %s model=%s replica=%s status=%d ms=%.1f",
                method,
                path,
                ex.model,
                ex.replica,
                status,
                (trio.current_time() - started) * 1000,
            )
            request_id_var.reset(token)

    async def _dispatch(self, ex: _Exchange, scope: Scope, receive: Receive, send: Send) -> None:
        method: str = scope["method"]
        path: str = scope["path"]
        if path == "/health":
            allow(method, "GET")
            extra = self.deps.health() if self.deps.health is not None else {}
            await self._send(ex, send, 200, dumps({"status": "ok", **extra}))
            return
        kind = POST_PATHS.get(path)
        if kind is None:
            if path == "/v1/models" or path.startswith("/v1/models/"):
                allow(method, "GET")
                self._authenticate(scope, self.deps.state.snapshot())
                await self._send(ex, send, 200, dumps(self._models(path[len("/v1/models/") :])))
                return
            raise OpenAIError(404, "not_found", f"unknown path {method} {path}")
        allow(method, "POST")
        snap = self.deps.state.snapshot()
        self._authenticate(scope, snap)
        if effective(snap.settings, "serving.stopped"):
            raise OpenAIError(503, "system_stopped", "the system is stopped: no model is served until an operator "
                                                     "resumes it (`llmgw start`)")
        raw = await read_body(scope, receive, ex, self.deps.max_body_bytes)
        body = parse_object(raw)
        name, stream = check_request(kind, body)
        model = snap.models.get(name)
        if model is None:
            raise OpenAIError(404, "model_not_found", f"the model {name!r} does not exist", param="model")
        ex.model = name  # only catalog names reach the log: they are validated, a client's are not
        if model.role not in ROLES_FOR[kind]:
            raise OpenAIError(400, "model_not_supported", role_words(name, model.role, path), param="model")
        deadline = trio.current_time() + model.activation_window_s
        refusal: OpenAIError | None = None
        async with trio.open_nursery() as nursery:
            # A client that goes away cancels what its request waits on: an activation,
            # or the upstream call (which frees the replica).
            nursery.start_soon(cancel_on_disconnect, receive, nursery.cancel_scope, ex)
            try:
                async with self.deps.router.acquire(name, deadline=deadline) as endpoint:
                    ex.replica = endpoint.replica_id
                    await self._exchange(ex, endpoint, path, raw, stream, send)
            except NoEndpoint as no_endpoint:
                refusal = OpenAIError(_no_endpoint_status(no_endpoint.code), no_endpoint.code, no_endpoint.message)
            except OpenAIError as error:
                refusal = error  # raised below, outside the nursery, so it is not wrapped in a group
            nursery.cancel_scope.cancel()
        if refusal is not None:
            raise refusal

    # --- checks -----------------------------------------------------------------

    def _authenticate(self, scope: Scope, snap: ClusterState) -> None:
        key = bearer(scope["headers"])
        if not key:
            raise OpenAIError(
                401,
                "invalid_api_key",
                "no API key: send it as 'Authorization: Bearer KEY'",
                headers=[(b"www-authenticate", b"Bearer")],
            )
        api_key = snap.keys.get(hash_key(key))
        if api_key is None or api_key.role not in ("client", "admin"):
            raise OpenAIError(401, "invalid_api_key", "incorrect API key", headers=[(b"www-authenticate", b"Bearer")])

    def _models(self, one: str) -> dict[str, Any]:
        models = self.deps.state.snapshot().models
        if one:
            if one not in models:
                raise OpenAIError(404, "model_not_found", f"the model {one!r} does not exist", param="model")
            return model_doc(one)
        return {"object": "list", "data": [model_doc(name) for name in sorted(models)]}

    # --- the proxy --------------------------------------------------------------

    async def _exchange(
        self, ex: _Exchange, endpoint: Endpoint, path: str, raw: bytes, stream: bool, send: Send
    ) -> None:
        """Send the body unchanged to the replica and relay its answer (streamed as it comes, or whole)."""
        request = self.client.build_request(
            "POST",
            endpoint.url + path,
            content=raw,
            headers=[
                (b"content-type", b"application/json"),
                # Raw bytes are relayed as they come, so nothing may be compressed.
                (b"accept-encoding", b"identity"),
                (b"x-request-id", ex.request_id.encode()),
            ],
        )
        try:
            response = await upstream.send(self.client, request)  # once more on a dropped kept-alive connection
        except (httpx.ConnectError, httpx.ConnectTimeout) as error:
            _log.warning("replica %s of model %s cannot be reached: %s", endpoint.replica_id, ex.model, describe(error))
            raise OpenAIError(
                502, "upstream_unavailable", f"replica {endpoint.replica_id} of model {ex.model!r} cannot be reached"
            ) from None
        except httpx.PoolTimeout:
            raise OpenAIError(503, "overloaded", "the gateway has too many requests in flight; retry later") from None
        except httpx.TransportError as error:
            _log.warning("replica %s of model %s failed: %s", endpoint.replica_id, ex.model, describe(error))
            raise _upstream_failed(endpoint, ex) from None
        try:
            headers = _response_headers(response.headers.raw, ex.request_id)
            if not stream:
                try:
                    # Every checkpoint of this loop is inside httpx's generators, so a
                    # cancellation unwinds them all (none is left to the garbage collector).
                    body = b"".join([chunk async for chunk in response.aiter_raw()])
                except httpx.TransportError as error:
                    _log.warning("replica %s of model %s failed: %s", endpoint.replica_id, ex.model, describe(error))
                    raise _upstream_failed(endpoint, ex) from None
                headers.append((b"content-length", str(len(body)).encode()))
                ex.started = True
                ex.status = response.status_code
                await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
                ex.finished = True
                await send({"type": "http.response.body", "body": body, "more_body": False})
                return
            ex.started = True
            ex.status = response.status_code
            await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
            # The upstream is read by its own task: a cancelled `send` would otherwise
            # leave httpx's nested generators suspended. The buffer is unbounded, but a
            # response is bounded by its token limit, as a buffered one is.
            into, out = trio.open_memory_channel[bytes](math.inf)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_pump, response, into, endpoint, ex)
                async for chunk in out:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            ex.finished = True
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await response.aclose()

    # --- responses --------------------------------------------------------------

    async def _send(
        self, ex: _Exchange, send: Send, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        ex.started = True
        ex.status = status
        await send_json(send, status, body, [(b"x-request-id", ex.request_id.encode()), *(extra or ())])

    async def _refuse(self, ex: _Exchange, scope: Scope, receive: Receive, send: Send, error: OpenAIError) -> None:
        if not ex.body_done:
            await self._discard_body(ex, scope, receive)
        if not ex.disconnected:
            await self._send(ex, send, error.status, dumps(error.doc()), error.headers)

    async def _discard_body(self, ex: _Exchange, scope: Scope, receive: Receive) -> None:
        """Read (a bounded amount of) the unread body before refusing: HTTP/1.1 clients
        such as httpx read no answer until they have sent everything, and the server
        closing under them loses the refusal."""
        limit = DRAIN_FACTOR * self.deps.max_body_bytes
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                return  # not worth the bandwidth: answer and let the connection close
        seen = 0
        with trio.move_on_after(self._drain_s):
            while seen <= limit:
                message = await receive()
                if message["type"] == "http.disconnect":
                    ex.disconnected = True
                    return
                seen += len(message.get("body", b""))
                if not message.get("more_body", False):
                    return


# --- helpers ----------------------------------------------------------------------


def _response_headers(raw: list[tuple[bytes, bytes]], request_id: str) -> list[tuple[bytes, bytes]]:
    named: set[bytes] = set()
    for name, value in raw:
        if name.lower() == b"connection":
            # Headers the upstream declared hop-by-hop for this connection only.
            named.update(v.strip().lower() for v in value.split(b","))
    headers = [
        (lower, value)
        for name, value in raw
        if (lower := name.lower()) not in _DROP_UPSTREAM and lower not in named
    ]
    headers.append((b"x-request-id", request_id.encode()))
    return headers


def _upstream_failed(endpoint: Endpoint, ex: _Exchange) -> OpenAIError:
    return OpenAIError(502, "upstream_error", f"replica {endpoint.replica_id} of model {ex.model!r} failed")


async def _pump(
    response: httpx.Response, into: trio.MemorySendChannel[bytes], endpoint: Endpoint, ex: _Exchange
) -> None:
    try:
        async for chunk in response.aiter_raw():
            into.send_nowait(chunk)  # no checkpoint outside the generator (see `_exchange`)
    except httpx.TransportError as error:
        # The status is already sent: say so in the stream, where OpenAI's SDKs look for it.
        _log.warning("replica %s of model %s failed mid-stream: %s", endpoint.replica_id, ex.model, describe(error))
        err = OpenAIError(502, "upstream_error", f"replica {endpoint.replica_id} failed mid-stream")
        into.send_nowait(b"data: " + dumps(err.doc()) + b"\n\n")
    finally:
        into.close()


# --- server -------------------------------------------------------------------------


def parse_bind(bind: str) -> tuple[str, int]:
    """`http://127.0.0.1:8080` or `http://[::1]:8080` -> (host, port)."""
    hostport = bind.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    return host.strip("[]"), int(port)


async def serve(
    listen_host: str,
    listen_port: int,
    deps: GatewayDeps,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the gateway until cancelled (or `shutdown_trigger` returns: in-flight requests get a grace).

    Reports `(host, port)` it listens on through `task_status`, the real port when `listen_port` is 0.
    """
    role_var.set("gateway")  # this task's context: every request task inherits it
    app = make_app(deps)
    config = hypercorn_config(
        listen_host,
        listen_port,
        logger="llmgw.gateway.server",
        graceful_s=deps.timeouts.gateway_shutdown_grace_s,
        # Longer than the keep-alive of clients' pools (httpx: 5 s), so the server is
        # never the side that closes a connection a client is about to reuse.
        keep_alive_s=deps.timeouts.gateway_keep_alive_s,
    )
    try:
        async with trio.open_nursery() as nursery:
            binds: list[str] = await nursery.start(
                partial(hypercorn_serve, app, config, shutdown_trigger=shutdown_trigger)  # type: ignore[arg-type]
            )
            bound = parse_bind(binds[0])
            _log.info("gateway listening on %s", binds[0])
            task_status.started(bound)
    finally:
        with trio.CancelScope(shield=True):
            await app.aclose()
