"""The admin API (`/api/v1/...`, S14) and the agents' stream endpoint, as a quart-trio app.

`make_app(deps)` receives its collaborators; a write returns after it is
committed, so a read that follows it sees it. Refusals are
`llmgw.errors.AdminError`s: `{"error": {"code", "message"}}`.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import trio
from quart import Response, request, websocket
from quart_trio import QuartTrio

from llmgw import __version__, protocol
from llmgw.control.hub import AgentHub
from llmgw.control.reconciler import Reconciler
from llmgw.domain import commands, summary
from llmgw.domain.commands import CommandError
from llmgw.domain.keys import hash_key
from llmgw.domain.model import DefinitionError, ModelDef
from llmgw.domain.observed import NodeInfo, Observed, ReplicaObs
from llmgw.domain.state import ClusterState
from llmgw.domain.settings import SETTINGS, SettingError, effective, validate
from llmgw.errors import AdminError
from llmgw.interfaces import WritableStore

log = logging.getLogger("llmgw.control.admin")

MAX_BODY_BYTES = 1 << 20


@dataclass
class ControlDeps:
    store: WritableStore
    hub: AgentHub
    reconciler: Reconciler
    clock: Callable[[], float]
    self_id: str = "local"
    store_status: Callable[[], dict[str, Any]] = field(default=lambda: {})


def _error(error: AdminError) -> Response:
    return Response(json.dumps(error.doc()), status=error.status, content_type="application/json")


def _ok(doc: Any, status: int = 200) -> Response:
    return Response(json.dumps(doc), status=status, content_type="application/json")


def make_app(deps: ControlDeps) -> QuartTrio:
    app = QuartTrio("llmgw.control")
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    app.config["RESPONSE_TIMEOUT"] = None

    def require_admin(headers: Any) -> None:
        auth = headers.get("authorization", "")
        scheme, _, key = auth.partition(" ")
        if scheme.lower() != "bearer" or not key:
            raise AdminError(401, "unauthorized", "send the admin key as 'Authorization: Bearer <key>'")
        if deps.store.snapshot().key_role(hash_key(key.strip())) != "admin":
            raise AdminError(401, "unauthorized", "this key is not an admin key of this cluster")

    async def body_json() -> Any:
        data = await request.get_data(as_text=False)
        if not data:
            raise AdminError(400, "invalid_json", "the request body is empty; send JSON")
        try:
            return json.loads(data)
        except (ValueError, UnicodeDecodeError) as e:
            raise AdminError(400, "invalid_json", f"the request body is not valid JSON: {e}") from None

    async def commit(command: dict[str, Any]) -> Any:
        try:
            return await deps.store.submit(command)
        except CommandError as e:
            status = 404 if e.code.endswith("not_found") else 400
            raise AdminError(status, e.code, e.message) from None

    def cluster_info() -> dict[str, Any]:
        st = deps.store_status()
        leader = st.get("leader") or (deps.self_id if deps.store.is_leader() else None)
        return {
            "leader": leader,
            "self": deps.self_id,
            "version": __version__,
            "members": [{"id": deps.self_id, "role": "leader" if deps.store.is_leader() else "standby",
                         "state": "up", "commit_index": st.get("commit_index"), "last_applied": st.get("last_applied")}],
        }

    def views() -> dict[str, Any] | None:
        plan = deps.reconciler.last_plan
        return plan.views if plan else None

    def model_doc(
        name: str, state: ClusterState, observed: Observed, plan_views: dict[str, Any] | None
    ) -> dict[str, Any]:
        m = state.models.get(name)
        if m is None:
            raise AdminError(404, "model_not_found", f"no model named {name!r}")
        view = plan_views.get(name) if plan_views else None
        return {**m.to_doc(), "status": summary.model_status(state, observed, name, view)}

    def one_model(name: str) -> dict[str, Any]:
        return model_doc(name, deps.store.snapshot(), deps.hub.observed(), views())

    def route(rule: str, methods: list[str]) -> Callable[[Callable[..., Awaitable[Response]]], Any]:
        def wrap(fn: Callable[..., Awaitable[Response]]) -> Any:
            async def handler(**kwargs: Any) -> Response:
                try:
                    require_admin(request.headers)
                    return await fn(**kwargs)
                except AdminError as e:
                    return _error(e)
            handler.__name__ = fn.__name__
            return app.route(rule, methods=methods)(handler)
        return wrap

    @app.get("/health")
    async def health() -> Response:
        return _ok({"status": "ok", "leader": deps.store.is_leader()})

    @route("/api/v1/status", ["GET"])
    async def status() -> Response:
        state = deps.store.snapshot()
        return _ok(summary.build(state, deps.hub.observed(), views(), cluster_info()))

    @route("/api/v1/models", ["GET"])
    async def list_models() -> Response:
        state, observed, plan_views = deps.store.snapshot(), deps.hub.observed(), views()
        return _ok({"models": [model_doc(n, state, observed, plan_views) for n in sorted(state.models)]})

    @route("/api/v1/models", ["POST"])
    async def serve_model() -> Response:
        doc = await body_json()
        try:
            model = ModelDef.from_doc(doc)
        except DefinitionError as e:
            raise AdminError(400, "invalid_model", str(e)) from None
        result = await commit(commands.put_model(model, deps.clock()))
        log.info("model %s %s", model.name, "created" if result["created"] else "replaced")
        return _ok({"model": one_model(model.name)}, 201 if result["created"] else 200)

    @route("/api/v1/models/<path:name>", ["GET"])
    async def show_model(name: str) -> Response:
        return _ok({"model": one_model(name)})

    @route("/api/v1/models/<path:name>", ["DELETE"])
    async def remove_model(name: str) -> Response:
        await commit(commands.remove_model(name, deps.clock()))
        log.info("model %s removed", name)
        return _ok({"removed": name})

    @route("/api/v1/models/<path:name>/retry", ["POST"])
    async def retry_model(name: str) -> Response:
        await commit(commands.retry_model(name, deps.clock()))
        return _ok({"retried": name})

    @route("/api/v1/settings", ["GET"])
    async def list_settings() -> Response:
        stored = deps.store.snapshot().settings
        return _ok({"settings": {
            k: {"value": effective(stored, k), "default": s.default, "help": s.help, "set": k in stored}
            for k, s in sorted(SETTINGS.items())
        }})

    @route("/api/v1/settings/<path:key>", ["GET"])
    async def get_setting(key: str) -> Response:
        if key not in SETTINGS:
            raise AdminError(404, "unknown_setting", f"unknown setting {key!r}; known: {', '.join(sorted(SETTINGS))}")
        stored = deps.store.snapshot().settings
        return _ok({"key": key, "value": effective(stored, key), "default": SETTINGS[key].default,
                    "set": key in stored})

    @route("/api/v1/settings/<path:key>", ["PUT"])
    async def put_setting(key: str) -> Response:
        value = await body_json()
        try:
            validate(key, value)
        except SettingError as e:
            code = "unknown_setting" if key not in SETTINGS else "invalid_setting"
            raise AdminError(404 if key not in SETTINGS else 400, code, str(e)) from None
        await commit(commands.put_setting(key, value, deps.clock()))
        log.info("setting %s changed", key)
        return _ok({"key": key, "value": value})

    @route("/api/v1/nodes", ["GET"])
    async def nodes() -> Response:
        return _ok({"nodes": summary.nodes(deps.store.snapshot(), deps.hub.observed())})

    @route("/api/v1/cluster/members", ["GET"])
    async def members() -> Response:
        info = cluster_info()
        return _ok({"members": info["members"], "leader": info["leader"]})

    @app.errorhandler(404)
    async def not_found(_: Any) -> Response:
        return _error(AdminError(404, "not_found", f"no such endpoint: {request.method} {request.path}"))

    @app.errorhandler(405)
    async def bad_method(_: Any) -> Response:
        return _error(AdminError(405, "method_not_allowed", f"{request.method} is not allowed on {request.path}"))

    @app.errorhandler(413)
    async def too_large(_: Any) -> Response:
        return _error(AdminError(413, "request_too_large", f"request bodies are limited to {MAX_BODY_BYTES} bytes"))

    @app.websocket(protocol.STREAM_PATH)
    async def agent_stream() -> Any:
        try:
            require_admin(websocket.headers)
        except AdminError as e:
            return _error(e)
        await websocket.accept()
        await _agent_session(deps)
        return None

    return app


async def _agent_session(deps: ControlDeps) -> None:
    """One agent's stream: hello + inventory, then reports in, commands out."""
    hello = protocol.loads(await websocket.receive())
    if hello.get("type") != "hello" or hello.get("protocol") != protocol.PROTOCOL_VERSION:
        await websocket.send(protocol.dumps({"type": "refused", "reason": "unsupported protocol"}))
        return
    if not deps.store.is_leader():
        await websocket.send(protocol.dumps({"type": "refused", "reason": "not the leader",
                                             "leader": deps.store_status().get("leader")}))
        return
    node = str(hello.get("node", ""))
    first = protocol.loads(await websocket.receive())
    if first.get("type") != "inventory" or not node:
        await websocket.send(protocol.dumps({"type": "refused", "reason": "expected an inventory"}))
        return
    send, receive = trio.open_memory_channel[dict[str, Any]](256)
    link = deps.hub.connect(node, send)
    try:
        deps.hub.report_inventory(link, NodeInfo.from_doc({**first["inventory"], "node": node}))
        await websocket.send(protocol.dumps({"type": "welcome", "node": node, "leader": deps.self_id}))
        async with trio.open_nursery() as nursery:
            async def outbound() -> None:
                async with receive:
                    async for message in receive:
                        await websocket.send(protocol.dumps(message))
                nursery.cancel_scope.cancel()  # the hub closed this link (a newer stream replaced it)

            nursery.start_soon(outbound)
            while True:
                message = protocol.loads(await websocket.receive())
                kind = message["type"]
                if kind == "replicas":
                    reports = [ReplicaObs.from_doc(r, node) for r in message.get("replicas", [])]
                    deps.hub.report_replicas(link, reports)
                elif kind == "inventory":
                    deps.hub.report_inventory(link, NodeInfo.from_doc({**message["inventory"], "node": node}))
                # A "heartbeat" records nothing: it only keeps traffic on the stream, so a dead connection shows.
    except protocol.ProtocolError as e:
        log.warning("node %s sent a bad message: %s", node, e)
    except (KeyError, ValueError, TypeError) as e:
        log.warning("node %s sent a malformed report: %s", node, e)
    finally:
        deps.hub.disconnect(link)
