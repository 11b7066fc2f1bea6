"""The OpenAI-compatible `/v1` API as a raw ASGI app, and its server (llmgw/wire/front.py).
Owns authentication, request checks, which refusal each failure gets, and the call to an engine
(the answer is relayed by gateway/relay.py).

Raw ASGI rather than a framework: the hot path is one key hash, one JSON parse
and one upstream call, so the gateway adds little to a direct engine call.
Refusals are `llmgw.errors.OpenAIError`s, whose shape and `type` live there.
Never logs a prompt, a completion or a key.
"""

from __future__ import annotations

import gc
import logging
import ssl
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import trio

from llmgw.domain.model import NO_OVERRIDES, ModelDef, ModelTimeouts
from llmgw.domain.observed import Endpoint, ModelRoute
from llmgw.domain.settings import effective
from llmgw.domain.state import ApiKey, ClusterState
from llmgw.domain.timeouts import TIMEOUTS, Timeouts
from llmgw.errors import OpenAIError, describe
from llmgw.gateway.checks import (POST_PATHS, ROLES_FOR, allow, check_limits, check_request, model_doc, role_refusal,
                                  wait_budget, within_limits)
from llmgw.gateway import engine_paths, upstream
from llmgw.gateway.capabilities import asks_tools, calls_no_tools, fit, fitting, no_tools
from llmgw.gateway.auth import KeyCheck
from llmgw.gateway.guard import Guard, GuardStats
from llmgw.gateway.affinity import affinity_key
from llmgw.gateway.dialect import CHAT_PATH, Dialect
from llmgw.gateway.messages import MessagesDialect
from llmgw.gateway.names import Names, visible_names
from llmgw.gateway.answers import asking_usage
from llmgw.gateway.responses import ResponsesDialect
from llmgw.gateway.pool import Limits, LimitsReader, Pool, Ticket, raise_fd_limit
from llmgw.gateway.router import Lease, NoEndpoint, Router
from llmgw.gateway import requestlog_query
from llmgw.gateway.relay import Progress, relay
from llmgw.gateway.requestlog import RequestLog
from llmgw.interfaces import StateReader
from llmgw.logs import request_id_var, role_var
from llmgw.metrics import gateway as gw_metrics
from llmgw.net import url_host
from llmgw.wire.asgi import (MAX_BODY_BYTES, RawApp, Receive, Scope, Send, cancelled_on_disconnect, dumps,
                             parse_object, read_body, send_json)
from llmgw.wire import logquery
from llmgw.wire.front import BACKLOG, Front, adopt_socket, listen_socket
from llmgw.wire.gate import listener_gate

__all__ = [
    "GatewayApp",
    "GatewayDeps",
    "Handover",
    "LISTEN_FD_ENV",
    "make_app",
    "serve",
]

_log = logging.getLogger("llmgw.gateway.app")
_access = logging.getLogger("llmgw.gateway.access")

# A refused request's unread body is discarded up to this many times the cap
# (for at most `Timeouts.gateway_drain_body_s`).
DRAIN_FACTOR = 4

_UNLOGGED = ("/health", "/metrics", logquery.PATH)  # probes and control's queries are not requests to log


# Refusals after which the next model (a fallback, a group alias's next) is tried: the model asked for
# cannot take the request now, and said so at once. Never a refusal of the request itself (a client's
# error, the guard's), nor a failure once the engine had it.
FALLBACK_CODES = frozenset({"model_parked", "model_unplaceable", "model_scheduled_off", "overloaded"})

# Other APIs served over the engines' chat completions (gateway/dialect.py), by path.
DIALECTS: dict[str, Dialect] = {
    "/v1/messages": MessagesDialect(),
    "/v1/responses": ResponsesDialect(),
}  # every path here is one of checks.DIALECT_PATHS (tests/unit/test_dialect.py)


def replica_slots(snap: ClusterState, model: ModelDef) -> int | None:
    """Requests one replica takes at once from this gateway: the model's `limits.concurrency_per_replica`; a LoRA
    adapter's are its base's (it runs on the base's replicas, whose engine has the base's slots)."""
    base = snap.models.get(model.base) if model.base else None
    return (base or model).limits.concurrency_per_replica


def _no_endpoint_status(code: str) -> int:
    return 504 if code == "activation_timeout" else 503


def _no_endpoint_error(e: NoEndpoint) -> OpenAIError:
    """The refusal for `e`; `model_activating` has `Retry-After` and the activation's progress beside `error`
    (`model_scheduled_off`: `Retry-After` when its schedule's rule ends)."""
    headers = [(b"retry-after", str(e.retry_after).encode())] if e.retry_after is not None else []
    if e.activation is None:
        return OpenAIError(_no_endpoint_status(e.code), e.code, e.message, headers=headers)
    return OpenAIError(503, e.code, e.message, headers=headers, extra={"activation": e.activation.to_doc(e.now)})


@dataclass
class GatewayDeps:
    router: Router
    state: StateReader
    pool: Pool | None = None  # upstream connections (pool.py); built (and closed by `serve`) when None
    max_body_bytes: int = MAX_BODY_BYTES
    timeouts: Timeouts = TIMEOUTS
    # What GET /health adds to {"status": "ok"} (a remote gateway: its table's age and leader).
    health: Callable[[], dict[str, Any]] | None = None
    requestlog: RequestLog | None = None  # None: records only counted (no files); `serve` runs its writer
    keys: KeyCheck | None = None  # client keys and their limits (auth.py); the app makes one when None
    guard_stats: GuardStats | None = None  # guard counters, judges' failures (gateway/guard.py); made when None
    metrics: gw_metrics.RequestMetrics | None = field(default_factory=gw_metrics.RequestMetrics)  # None: off


def make_app(deps: GatewayDeps) -> GatewayApp:
    """The ASGI app; whoever serves it calls `aclose()` when done (`serve` does)."""
    return GatewayApp(deps)


class GatewayApp(RawApp):
    """Raw ASGI app; `make_app` builds it. `aclose()` closes an upstream pool it built."""

    def __init__(self, deps: GatewayDeps) -> None:
        self.deps = deps
        self._owns_pool = deps.pool is None
        if deps.pool is None:
            raise_fd_limit()  # two sockets per request in flight
        self.pool = deps.pool if deps.pool is not None else Pool(deps.timeouts)
        self._limits = LimitsReader()
        self._drain_s = deps.timeouts.gateway_drain_body_s  # read once, not per refusal
        self.log = deps.requestlog or RequestLog(None, "local")
        self.keys = deps.keys if deps.keys is not None else KeyCheck()
        self.names = Names()  # the catalog's aliases
        self.guard = Guard(deps.router, self.pool, deps.timeouts, deps.guard_stats)
        self.metrics = gw_metrics.Exporter(deps.metrics, self.guard.stats, self.log)  # its own registry, not the global
        self.metrics.breakers = lambda: [(str(b["model"]), rid) for rid, b in deps.router.breaker_report().items()]
        self.metrics.queue_depth = lambda: self.pool.depth

    async def aclose(self) -> None:
        if self._owns_pool:
            self.pool.close()

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = trio.current_time()
        ex = Progress(self.log.new_id())
        wall = time.time()
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
            if ex.key is not None:
                self.keys.charge(ex.key, ex.tokens_in, ex.tokens_out)  # tokens/min: after the answer
            status = 499 if ex.disconnected else ex.status
            # Every request is in the request log (`ctl requests`); the process log gets a line only for a
            # failure of ours or an engine's (5xx), unless at debug level: a line per request costs the
            # loop more than the request log's record.
            _access.log(
                logging.INFO if status >= 500 else logging.DEBUG,
                "%s %s model=%s replica=%s status=%d ms=%.1f",
                method,
                path,
                ex.model,
                ex.replica,
                status,
                (trio.current_time() - started) * 1000,
            )
            if not path.startswith(_UNLOGGED):
                record = self.log.finish(ex, path, status, wall, started)
                if self.deps.metrics is not None:
                    self.deps.metrics.count(record)  # plain ints, no lock: llmgw/metrics/gateway.py
            request_id_var.reset(token)

    async def _dispatch(self, ex: Progress, scope: Scope, receive: Receive, send: Send) -> None:
        method: str = scope["method"]
        path: str = scope["path"]
        if path == "/health":
            allow(method, "GET")
            extra = self.deps.health() if self.deps.health is not None else {}
            await self._send(ex, send, 200, dumps({"status": "ok", **extra}))
            return
        if path == "/metrics":  # Prometheus scrapes with no key, as /health (docs/observability.md)
            allow(method, "GET")
            ex.started, ex.status = True, 200
            await self.metrics.answer(send)
            return
        kind = POST_PATHS.get(path)
        if kind is None and (dialect := DIALECTS.get(path)) is not None:
            ex.dialect, kind = dialect, "chat"  # its refusals in its own shape from here on
        if kind is None:
            if path.startswith(logquery.PATH):  # control asks this gateway's log (admin key)
                await self._send(ex, send, *await requestlog_query.answer(scope, self.deps.state, self.log))
                return
            if path == "/v1/models" or path.startswith("/v1/models/"):
                allow(method, "GET")
                snap = self.deps.state.snapshot()
                ex.key = self.keys.admit(scope["headers"], snap)
                await self._send(ex, send, 200, dumps(self._models(path[len("/v1/models/") :], ex.key, snap)))
                return
            raise OpenAIError(404, "not_found", f"unknown path {method} {path}")
        allow(method, "POST")
        snap = self.deps.state.snapshot()
        ex.key = self.keys.admit(scope["headers"], snap)  # from the headers alone: before the body is read
        ex.ticket = Ticket(ex.key.id, self.keys.priority(ex.key, scope["headers"]))  # 403 above the key's class
        if effective(snap.settings, "serving.stopped"):
            raise OpenAIError(503, "system_stopped", "the system is stopped: no model is served until an operator "
                                                     "resumes it (`llmgw start`)")
        patience = wait_budget(scope["headers"])  # x-llmgw-wait: a bad value costs no body read
        raw = await read_body(scope, receive, ex, self.deps.max_body_bytes)
        body = parse_object(raw)
        sent_to = path
        if ex.dialect is not None:  # another API's request, as the chat completion the engine is sent
            ex.translation = ex.dialect.start(body)
            body, sent_to = ex.translation.chat, CHAT_PATH
            raw = dumps(body)
        name, stream = check_request(kind, body)
        hide_usage = False
        if stream:  # every stream is counted: ask for its usage (kept from a client that did not ask)
            raw, hide_usage = asking_usage(body, raw)
        # The model, or an alias's models, then their fallbacks (gateway/names.py); 404 alike for a missing
        # name and one out of scope.
        tries = self.keys.models(ex.key, snap, name, self.names.groups(snap.models), self.deps.router.least_loaded)
        model = tries[0]
        ex.model = name  # only catalog names (and aliases) reach the log: they are validated, a client's are not
        if model.role not in ROLES_FOR[kind]:
            raise role_refusal(kind, name, model.role, path)
        call = engine_paths.plan(kind, model.engine, model.name, path, body)  # None: the body goes as it came
        check_limits(body, model.limits, name)  # the definition's max_tokens / max_n
        fitted = fit(kind, model.engine, body, name)  # a field its engine cannot honour: refused by name
        tools = asks_tools(kind, body)  # and tools its replicas' chat template would ignore (llama.cpp's /props)
        if tools and calls_no_tools(self.deps.router.route(model.name)):
            raise no_tools(name)
        ex.guard = self.guard.plan(snap, model.name, kind, body, ex)  # None (one lookup) when no policy applies
        if ex.guard is not None:
            await ex.guard.check_prompt()  # before the engine sees the request
        limits = self._limits(snap.settings)
        refusal: OpenAIError | None = None
        # A client that goes away cancels what its request waits on: an activation,
        # or the upstream call (which frees the replica).
        async with cancelled_on_disconnect(scope, receive, ex):
            for i, model in enumerate(tries):
                try:
                    if i:  # a fallback (or a group's next model): only one that would take this request
                        if (model.role not in ROLES_FOR[kind] or not within_limits(body, model.limits)
                                or not engine_paths.serves(kind, model.engine)
                                or (its := fitting(kind, model.engine, body)) is None
                                or (tools and calls_no_tools(self.deps.router.route(model.name)))):
                            continue
                        call = engine_paths.plan(kind, model.engine, model.name, path, body)
                        fitted = its  # the body as this model's engine is to get it
                        await self._replan_guard(snap, model.name, kind, body, ex)
                    ex.served = model.name
                    sent = raw if model.name == name and fitted is body else self._renamed(fitted, model.name, stream)
                    window = self.deps.router.window_s(model.name, model.activation_window_s)
                    deadline = trio.current_time() + window
                    chars = model.affinity_chars()
                    # Its replica by the request's leading text, the same from any gateway (gateway/affinity.py).
                    affinity = affinity_key(kind, body, chars) if chars else None
                    lease = self.deps.router.acquire(model.name, deadline=deadline,
                                                     max_waiting=limits.activation_queue, patience=patience,
                                                     affinity=affinity, load_factor=limits.affinity_load_factor)
                    async with lease as endpoint:
                        ex.replica, ex.node = endpoint.replica_id, endpoint.node
                        if tools and endpoint.tool_calls is False and calls_no_tools(
                                self.deps.router.route(model.name)):  # known only once it became ready
                            raise no_tools(name if i == 0 else model.name)
                        if endpoint.loras and call is None:  # llama.cpp holding LoRA adapters: each one's scale
                            sent = self._with_lora(fitted, model.name, self.deps.router.route(model.name),
                                                   endpoint.loras, stream)
                        await self._exchange(ex, lease, endpoint, sent_to, sent, stream, send, limits, hide_usage,
                                             model.timeouts, replica_slots(snap, model), call)
                    refusal = None
                    break
                except NoEndpoint as no_endpoint:
                    error = _no_endpoint_error(no_endpoint)
                except OpenAIError as failed:
                    error = failed  # raised below, outside the watch (a nursery), so it is not wrapped in a group
                if error.code not in FALLBACK_CODES or ex.started:
                    refusal = error  # a refusal of this request itself, or an answer under way: no other model
                    break
                ex.served = ""
                refusal = refusal or error  # the model asked for refuses: its words, if no fallback serves
        if refusal is not None:
            raise refusal

    def _renamed(self, body: dict[str, Any], served: str, stream: bool) -> bytes:
        """The body for another model than the one named (an alias's, a fallback), or without the gateway's
        own fields (gateway/capabilities.py): its `model` is the served model's, as its engine knows itself
        (vLLM refuses another name)."""
        body = {**body, "model": served}
        return asking_usage(body, dumps(body))[0] if stream else dumps(body)

    def _with_lora(self, body: dict[str, Any], served: str, route: ModelRoute | None, loras: int,
                   stream: bool) -> bytes:
        """A request to a llama.cpp replica that holds `loras` LoRA adapters (ids 0..loras-1), which names them by
        id in the request's `lora` field and keeps a request's scales for the next ones on its slot: every id at
        scale 0, but a LoRA adapter's own (its id on every replica of its route: reconcile/adapters.py) at 1,
        asked for under its base's name."""
        chosen = route.lora_id if route is not None else None
        body = {**body, "model": route.base if route is not None and route.base else served,
                "lora": [{"id": i, "scale": 1.0 if i == chosen else 0.0} for i in range(loras)]}
        return asking_usage(body, dumps(body))[0] if stream else dumps(body)

    async def _replan_guard(self, snap: ClusterState, served: str, kind: str, body: dict[str, Any],
                            ex: Progress) -> None:
        """The guard checks of a fallback: the prompt judged again only under other policies than it was."""
        checks = self.guard.plan(snap, served, kind, body, ex)
        if checks is not None and (ex.guard is None or checks.policies != ex.guard.policies):
            await checks.check_prompt()
        ex.guard = checks

    # --- checks -----------------------------------------------------------------

    def _models(self, one: str, key: ApiKey, snap: ClusterState) -> dict[str, Any]:
        groups = self.names.groups(snap.models)
        if one:
            self.keys.models(key, snap, one, groups, tuple)  # 404 unless a model or alias this key may use
            return model_doc(one)
        return {"object": "list", "data": [model_doc(name) for name in visible_names(snap.models, groups, key.scope)]}

    # --- the proxy --------------------------------------------------------------

    async def _exchange(
        self, ex: Progress, lease: Lease, endpoint: Endpoint, path: str, raw: bytes, stream: bool, send: Send,
        limits: Limits, hide_usage: bool = False, waits: ModelTimeouts = NO_OVERRIDES, slots: int | None = None,
        call: engine_paths.Call | None = None,
    ) -> None:
        """Send the body unchanged to the replica and relay its answer (streamed chunk for chunk, or whole);
        `call`: the engine's own path and body instead, its answer read back in the gateway's shape."""
        # Once more on a dropped kept-alive connection; on another replica when this one refuses connections
        # or answers nothing (a non-streamed answer is read whole first: also when it breaks off).
        # The model's own upstream timeouts and slots per replica; the request's turn by its class and key.
        if call is not None:
            path, raw = call.path, call.body
        response, endpoint = await upstream.answer(self.pool, lease, endpoint, ex.model, path, raw, ex.request_id,
                                                   limits, waits, whole=not stream, ticket=ex.ticket, slots=slots)
        ex.replica, ex.node = endpoint.replica_id, endpoint.node
        if call is not None:  # (never streamed: read whole above)
            response = await engine_paths.translated(call, response, ex.request_id, lease.answered)
        if ex.guard is not None and ex.guard.checks_response:
            response = await ex.guard.hold(response, stream)  # judged whole before the client gets any of it
        await relay(ex, response, endpoint, stream, send, hide_usage, POST_PATHS.get(path, ""))
        if ex.error in ("upstream_error", "upstream_timeout"):  # it broke off mid-stream: its breaker counts it
            lease.failed(f"its answer broke off mid-stream ({ex.error})", limits.breaker_failures)

    # --- responses --------------------------------------------------------------

    async def _send(
        self, ex: Progress, send: Send, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        ex.started = True
        ex.status = status
        mine = [(b"x-request-id", ex.request_id.encode())]
        if ex.dialect is not None:
            mine += ex.dialect.headers(ex.request_id)
        await send_json(send, status, body, [*mine, *(extra or ())])

    async def _refuse(self, ex: Progress, scope: Scope, receive: Receive, send: Send, error: OpenAIError) -> None:
        ex.error = error.code or ""
        if ex.body_done:
            if not ex.disconnected:
                await self._send(ex, send, error.status, dumps(self._error_doc(ex, error)), error.headers)
            return
        # The whole answer goes out at once, from the headers alone (an invalid key costs no body
        # read); the unread body is discarded after it, before the message ends, so a client still
        # sending reads its answer and the connection is kept or closed cleanly.
        body = dumps(self._error_doc(ex, error))
        ex.started, ex.status = True, error.status
        head = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                (b"x-request-id", ex.request_id.encode()), *error.headers]
        if ex.dialect is not None:
            head += ex.dialect.headers(ex.request_id)
        await send({"type": "http.response.start", "status": error.status, "headers": head})
        await send({"type": "http.response.body", "body": body, "more_body": True})
        await self._discard_body(ex, scope, receive)
        if not ex.disconnected:
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    @staticmethod
    def _error_doc(ex: Progress, error: OpenAIError) -> dict[str, Any]:
        return error.doc() if ex.dialect is None else ex.dialect.error_doc(error)

    async def _discard_body(self, ex: Progress, scope: Scope, receive: Receive) -> None:
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


# --- server -------------------------------------------------------------------------


# The descriptor of the /v1 listening socket a gateway left open for the program that runs next in its process.
LISTEN_FD_ENV = "LLMGW_GATEWAY_LISTEN_FD"


@dataclass
class Handover:
    """A restart in place (the leader's `restart_gateway`): `asked` set starts the drain (llmgw/wire/front.py);
    once drained, the /v1 listening socket is left open and its descriptor is `fd`, for the program that runs
    next as this same process. `inherited`: the descriptor a previous program left so, adopted instead of a
    new bind (connections queued meanwhile are served, none refused)."""

    inherited: int | None = None
    asked: trio.Event = field(default_factory=trio.Event)
    fd: int | None = None


async def _serve_then_stop(front: Front, sockets: list[Any], trigger: Callable[[], Awaitable[None]] | None,
                           done: trio.CancelScope, hand_over: list[Any], *, task_status: trio.TaskStatus[None]) -> None:
    await front.serve(sockets, shutdown_trigger=trigger, hand_over=hand_over, task_status=task_status)
    done.cancel()  # the server stopped (its trigger fired): so does the request log's writer, after a last write


async def serve(
    listen_host: str,
    listen_port: int,
    deps: GatewayDeps,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    reuse_port: bool = False,
    query_listen: tuple[str, int] | None = None,
    open_when: Callable[[], Awaitable[object]] | None = None,
    tls: ssl.SSLContext | None = None,
    query_tls: ssl.SSLContext | None | bool = True,
    listening: trio.Event | None = None,
    handover: Handover | None = None,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the gateway until cancelled (or `shutdown_trigger` returns: in-flight requests get a grace).

    Reports `(host, port)` it listens on through `task_status`, the real port when `listen_port` is 0.
    `reuse_port`: other processes may listen on the same port (`llmgw gateway --workers N`).
    `query_listen`: a second listener of this process alone, where control asks for its request log
    (on a port shared with other workers, the kernel would pick which process answers).
    `open_when`: the `/v1` port is held at once but takes connections only once this returns, or after
    `gateway_open_wait_s` (a worker joins its shared port when it has its table: until then its share of
    clients would get 503s while the other workers could serve them); `task_status` reports after that.
    `tls`: every listener speaks TLS with it (an operator's certificate, or the gateway's own from the
    cluster's CA); None: plain HTTP. `query_tls`: the `query_listen` listener's own (the gateway's own
    certificate, which control plans verify, when /v1 serves an operator's); True: as /v1.
    `listening`: set once the request log answers (its `query_url` known), before `open_when` is waited on.
    `handover`: this gateway can restart in place (see `Handover`); its trigger is `handover.asked`.
    """
    role_var.set("gateway")  # this task's context: every request task inherits it
    app = make_app(deps)
    sockets = []
    front: Front | None = None
    if handover is not None:
        shutdown_trigger = handover.asked.wait
    try:
        if handover is not None and handover.inherited is not None:
            try:
                sockets.append(adopt_socket(handover.inherited))  # listening already: its queue is served
                _log.info("took over the listening socket the previous program left (descriptor %d)",
                          handover.inherited)
            except ValueError as e:
                _log.warning("%s=%d: %s; listening anew", LISTEN_FD_ENV, handover.inherited, e)
        if not sockets:
            sockets.append(await listen_socket(listen_host, listen_port, reuse_port=reuse_port,
                                               listen=open_when is None))
        if query_listen is not None:
            sockets.append(await listen_socket(*query_listen))
        # How many client connections this process holds, from its open-files limit (llmgw/wire/gate.py).
        gate = listener_gate("gateway", log_every_s=deps.timeouts.listener_limit_log_s)
        app.metrics.connections = gate.statistics
        front = Front(app, timeouts=deps.timeouts, new_id=app.log.new_id, gate=gate, tls=tls)
        scheme = "https" if tls is not None else "http"
        query_scheme = scheme if query_tls is True or len(sockets) == 1 else ("https" if query_tls else "http")
        async with trio.open_nursery() as nursery:
            tls_of = [True] + [query_tls] * (len(sockets) - 1)
            await nursery.start(partial(_serve_then_stop, front,
                                        list(zip(sockets, tls_of))[0 if open_when is None else 1:],
                                        shutdown_trigger, nursery.cancel_scope,
                                        sockets[:1] if handover is not None else []))
            host, port = sockets[0].getsockname()[:2]
            query_host, query_port = sockets[-1].getsockname()[:2]
            app.log.query_url = f"{query_scheme}://{url_host(query_host)}:{query_port}"
            if listening is not None:
                listening.set()
            nursery.start_soon(app.log.run)  # the request log's writer: off the request path
            if open_when is not None:
                with trio.move_on_after(deps.timeouts.gateway_open_wait_s) as waiting:
                    await open_when()
                if waiting.cancelled_caught:
                    _log.warning("no table from control after %g s: taking connections anyway (answered 503 "
                                 "gateway_not_synced until one comes)", deps.timeouts.gateway_open_wait_s)
                sockets[0].listen(BACKLOG)
                if not front.closing:  # (a restart asked before it ever opened: the next program accepts)
                    front.add(sockets[0])
            _log.info("gateway listening on %s://%s:%d", scheme, url_host(host), port)
            # What is alive now (modules, the app, the table) lives as long as the process: out of the
            # collector's way, so a full collection scans what requests left behind, not every import
            # (tens of ms on a loaded `llmgw up`: the p99 of added latency).
            gc.freeze()
            # The request log's and the log's writer threads take the GIL in batches; by default the loop
            # could wait 5 ms for it back (the p99 of added latency). It waits at most this long now.
            sys.setswitchinterval(deps.timeouts.gateway_gil_switch_s)
            task_status.started((host, port))
    finally:
        if handover is not None and front is not None and front.stopped and sockets:
            # Drained for a restart in place: /v1's socket stays open, listening, for the next program.
            handover.fd = sockets.pop(0).detach()
        for sock in sockets:
            sock.close()
        with trio.CancelScope(shield=True):
            await app.aclose()
