"""The admin API (`/api/v1/...`, S14) as a quart-trio app; the agents' and gateways' streams register on it.

`make_app(deps)` receives its collaborators; a write returns after it is
committed, so a read that follows it sees it, and applies at most once per
`Idempotency-Key`. Refusals, store errors included, are `llmgw.errors.AdminError`s:
`{"error": {"code", "message"}}`.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import logging
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping

from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from llmgw import __version__
from llmgw import console
from llmgw.control import (admin_errors, admin_guard, admin_guard_ask, admin_keys, admin_metrics, admin_nodes,
                           admin_notify, admin_plan, admin_requests, admin_system, agent_stream, gateway_stream,
                           openapi)
from llmgw.control.hub import AgentHub
from llmgw.control.members import Members
from llmgw.control.reconciler import Reconciler
from llmgw.domain import commands, summary
from llmgw.domain.commands import CommandError
from llmgw.domain.conditions import conditions
from llmgw.domain.keys import hash_key
from llmgw.domain.memory import estimate_for
from llmgw.domain.model import DefinitionError, ModelDef
from llmgw.domain.observed import Observed
from llmgw.domain.state import ClusterState
from llmgw.domain.settings import SETTINGS, SettingError, effective, validate
from llmgw.errors import AdminError
from llmgw.interfaces import WritableStore
from llmgw.notify.notifier import Notifier
from llmgw.store import CommitUnknown, NotLeader, StoreUnavailable

log = logging.getLogger("llmgw.control.admin")

MAX_BODY_BYTES = 1 << 20
IDEMPOTENCY_KEY_MAX_CHARS = 200
KEPT_REPLIES = 1024  # answers to keyed writes this member replays byte for byte
WRITE_METHODS = frozenset({"POST", "PUT", "DELETE", "PATCH"})


@dataclass
class _Write:
    """One write request's idempotency: its command id, and the fingerprint of what it asked."""

    cid: str
    keyed: bool  # the client sent an Idempotency-Key (else `cid` is fresh, never seen again)
    digest: str = ""


@dataclass(frozen=True)
class _Reply:
    digest: str
    status: int
    body: bytes


class _Replayed(Exception):
    """A keyed write this member already answered: the first answer is sent again."""

    def __init__(self, reply: _Reply) -> None:
        self.reply = reply


_write: contextvars.ContextVar[_Write] = contextvars.ContextVar("llmgw_admin_write")


def idempotency_key(headers: Any) -> str | None:
    """The request's `Idempotency-Key` (None when absent); 400 unless 1..200 printable ASCII."""
    key: str | None = headers.get("idempotency-key")
    if key is None:
        return None
    if not (0 < len(key) <= IDEMPOTENCY_KEY_MAX_CHARS and all(" " <= ch <= "~" for ch in key)):
        raise AdminError(400, "invalid_idempotency_key",
                         f"Idempotency-Key must be 1..{IDEMPOTENCY_KEY_MAX_CHARS} printable ASCII characters"
                         " (a UUID is a good one)")
    return key


def scoped_cid(key_hash: str, key: str) -> str:
    """The command id of a client's key: scoped to its admin key, so two clients never collide."""
    return "k:" + hashlib.sha256(f"{key_hash}\n{key}".encode()).hexdigest()[:32]


def store_error(error: Exception, keyed: bool) -> AdminError | None:
    """The admin error for a store that could not commit (None: not a store error)."""
    if isinstance(error, CommitUnknown):
        retry = ("Retrying with the same Idempotency-Key is safe: the write is applied at most once."
                 if keyed else
                 "This request had no Idempotency-Key: read the state before retrying, or a retry may apply"
                 " it twice.")
        return AdminError(503, "commit_unknown",
                          f"the write was handed to the Raft log but its commit was not confirmed ({error}): it may"
                          f" or may not have been applied. {retry}")
    if isinstance(error, NotLeader):
        where = (f"the leader is the member with Raft address {error.leader}" if error.leader else
                 "no leader is known (an election may be under way; retry shortly)")
        return AdminError(503, "not_leader", f"this member is not the leader, so nothing was written; {where}")
    if isinstance(error, StoreUnavailable):
        return AdminError(503, "store_unavailable", f"the replicated store cannot take writes now, so nothing was"
                                                    f" written: {error}")
    return None


@dataclass
class ControlDeps:
    store: WritableStore
    hub: AgentHub
    reconciler: Reconciler
    clock: Callable[[], float]
    self_id: str = "local"
    store_status: Callable[[], dict[str, Any]] = field(default=lambda: {})
    # The Raft group this member is one of: forwarding to the leader, the member table, changes.
    # None: a store without a group (tests' MemoryStore); this member answers everything itself.
    members: Members | None = None
    # Webhook deliveries by outcome (the notifier's, llmgw/notify) for GET /metrics; None: none kept.
    webhook_deliveries: Callable[[], Mapping[str, int]] | None = None
    # The leader's notifier (llmgw/notify): webhook health for the conditions, /api/v1/notify/*; None: none.
    notifier: Notifier | None = None


def _error(error: AdminError) -> Response:
    return Response(json.dumps(error.doc()), status=error.status, content_type="application/json")


def _ok(doc: Any, status: int = 200) -> Response:
    return Response(json.dumps(doc), status=status, content_type="application/json")


def make_app(deps: ControlDeps) -> QuartTrio:
    app = QuartTrio("llmgw.control")
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    app.config["RESPONSE_TIMEOUT"] = None

    replies: OrderedDict[str, _Reply] = OrderedDict()

    def require_admin(headers: Any, method: str = "POST") -> str:
        """The admin key's hash; 401 unless the request carries an admin key of this cluster (or, for a
        GET, a viewer key: it reads what the console shows, and is refused every change with a 403)."""
        auth = headers.get("authorization", "")
        scheme, _, key = auth.partition(" ")
        if scheme.lower() != "bearer" or not key:
            raise AdminError(401, "unauthorized", "send the admin key as 'Authorization: Bearer <key>'")
        key_hash = hash_key(key.strip())
        role = deps.store.snapshot().key_role(key_hash)
        if role == "viewer" and method not in ("GET", "HEAD"):
            raise AdminError(403, "viewer_key", "this is a viewer key: it reads (GET) but changes nothing; "
                                                "use an admin key")
        if role != "admin" and role != "viewer":
            raise AdminError(401, "unauthorized", "this key is not an admin key of this cluster")
        return key_hash

    async def body_json() -> Any:
        data = await request.get_data(as_text=False)
        if not data:
            raise AdminError(400, "invalid_json", "the request body is empty; send JSON")
        try:
            return json.loads(data)
        except (ValueError, UnicodeDecodeError) as e:
            raise AdminError(400, "invalid_json", f"the request body is not valid JSON: {e}") from None
        except RecursionError:
            raise AdminError(400, "invalid_json", "the request body is nested too deeply") from None

    def replay_kept(digest: str) -> None:
        """Note what this write asks (`digest`); a keyed write this member already answered is
        answered again as it was (`_Replayed`), and the same key for another request is refused."""
        write = _write.get()
        write.digest = digest
        kept = replies.get(write.cid) if write.keyed else None
        if kept is not None:
            if kept.digest != write.digest:
                raise AdminError(422, "idempotency_key_reused", "this Idempotency-Key was already used for a"
                                 " different request; send a new key for a new request")
            raise _Replayed(kept)

    async def commit(command: dict[str, Any]) -> Any:
        """Commit this request's command under its idempotency id; its result once applied.

        A keyed write this member already answered is answered again as it was (`_Replayed`);
        one another member answered, or before a restart, returns the result it recorded."""
        command = commands.with_cid(command, _write.get().cid)
        replay_kept(commands.digest(command))
        try:
            return await deps.store.submit(command)
        except CommandError as e:
            status = {"idempotency_key_reused": 422, "apply_failed": 500}.get(
                e.code, 404 if e.code.endswith("not_found") else 400)
            raise AdminError(status, e.code, e.message) from None

    async def keep_reply(write: _Write, response: Response) -> None:
        if write.keyed and write.digest and 200 <= response.status_code < 300:
            replies[write.cid] = _Reply(write.digest, response.status_code, await response.get_data(as_text=False))
            while len(replies) > KEPT_REPLIES:
                replies.popitem(last=False)

    async def cluster_info(authorization: str | None = None) -> dict[str, Any]:
        """The control planes' table; each member is asked with `authorization` (default: the caller's)."""
        if deps.members is not None:
            return await deps.members.table(authorization or request.headers.get("authorization"))
        st = deps.store_status()
        leader = st.get("leader") or (deps.self_id if deps.store.is_leader() else None)
        answer = {"role": "leader" if deps.store.is_leader() else "standby", "leader": leader, "ready": True,
                  "commit_index": st.get("commit_index"), "applied_index": st.get("last_applied"),
                  "revision": deps.store.snapshot().revision}
        return {"leader": leader, "self": deps.self_id, "version": __version__,
                "members": summary.member_rows([{"id": deps.self_id, "answer": answer}], deps.clock())}

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

    def route(rule: str, methods: list[str], *,
              local: bool = False) -> Callable[[Callable[..., Awaitable[Response]]], Any]:
        """An admin route: the admin key checked, writes made idempotent, every refusal in the admin
        error shape. On a standby, a route that is not `local` is forwarded to the leader."""
        writes = WRITE_METHODS.intersection(methods)

        def wrap(fn: Callable[..., Awaitable[Response]]) -> Any:
            async def handler(**kwargs: Any) -> Response:
                write: _Write | None = None
                try:
                    if not local and deps.members is not None and not deps.store.is_leader():
                        body = await request.get_data(as_text=False)
                        assert isinstance(body, bytes)
                        return await deps.members.forward(request.method, _raw_path(), body, request.headers)
                    key_hash = require_admin(request.headers, request.method)
                    if request.method not in writes:
                        return await fn(**kwargs)
                    key = idempotency_key(request.headers)
                    write = _Write(scoped_cid(key_hash, key) if key else "u:" + uuid.uuid4().hex, key is not None)
                    token = _write.set(write)
                    try:
                        response = await fn(**kwargs)
                    finally:
                        _write.reset(token)
                    await keep_reply(write, response)
                    return response
                except AdminError as e:
                    return _error(e)
                except _Replayed as r:
                    return Response(r.reply.body, status=r.reply.status, content_type="application/json")
                except HTTPException:
                    raise  # 404, 405, 413: answered by the error handlers below, in the same shape
                except Exception as e:
                    keyed = write.keyed if write is not None else "idempotency-key" in request.headers
                    known = store_error(e, keyed)
                    if known is None:
                        log.exception("admin request %s %s failed", request.method, request.path)
                        known = AdminError(500, "internal_error", f"this member failed on the request "
                                                                  f"({type(e).__name__}); it is logged")
                    else:
                        log.warning("%s %s: %s", request.method, request.path, known.message)
                    return _error(known)
            handler.__name__ = fn.__name__
            return app.route(rule, methods=methods)(handler)
        return wrap

    @app.get("/health")
    async def health() -> Response:
        return _ok({"status": "ok", "leader": deps.store.is_leader()})

    @route("/api/v1/status", ["GET"])
    async def status() -> Response:
        cluster, now = await cluster_info(), deps.clock()
        doc = summary.build(deps.store.snapshot(), deps.hub.observed(), views(), cluster, now)
        # The failures true now, as webhooks and the llmgw_condition gauge see them (domain/conditions.py).
        hooks = deps.notifier.health() if deps.notifier is not None else ()
        found = conditions(doc, now, timeouts=deps.reconciler.timeouts, webhooks=hooks)
        doc["conditions"] = [c.to_doc() for c in found]
        # The one failure the summary cannot know (the notifier's): `ctl status` prints it with the rest.
        doc["warnings"] += [c.words for c in found if c.kind == "webhook_failing"]
        return _ok(doc)

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
        # A retry answered from the recorded result may find the model removed since: its definition, then.
        doc = one_model(model.name) if model.name in deps.store.snapshot().models else model.to_doc()
        return _ok({"model": doc}, 201 if result["created"] else 200)

    @route("/api/v1/models/<path:name>", ["GET"])
    async def show_model(name: str) -> Response:
        state, observed = deps.store.snapshot(), deps.hub.observed()
        doc = model_doc(name, state, observed, views())
        # The memory one replica needs, as placement counts it (docs/placement.md, "Memory estimate").
        return _ok({"model": {**doc, "estimate": estimate_for(state.models[name], observed.nodes).to_doc()}})

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

    admin_nodes.register(route, deps)  # GET /api/v1/nodes, DELETE /api/v1/nodes/NAME
    admin_plan.register(route, deps, body_json)  # POST /api/v1/plan: a what-if placement
    admin_system.register(route, deps, commit)  # POST /api/v1/system/stop|start
    admin_requests.register(route, deps)  # GET /api/v1/requests[/ID] (fanned out to gateways), /api/v1/usage
    admin_keys.register(route, deps, commit, body_json)  # GET|POST /api/v1/keys, DELETE /api/v1/keys/ID
    admin_guard.register(route, deps, commit, body_json, views)  # /api/v1/guard/policies[/NAME], /api/v1/guard/judges
    admin_notify.register(route, deps)  # GET /api/v1/notify/status, POST /api/v1/notify/test
    admin_guard_ask.register(route, deps, body_json)  # POST /api/v1/guard/judges/ask: nothing of its text is kept

    # Answered by the member asked, from its own view (so it also answers while there is no leader).
    @route("/api/v1/cluster/members", ["GET"], local=True)
    async def members() -> Response:
        return _ok(await cluster_info())

    @route("/api/v1/cluster/self", ["GET"], local=True)
    async def member_self() -> Response:
        if deps.members is None:
            raise AdminError(404, "not_found", "this control plane runs no Raft group")
        return _ok(deps.members.self_doc())

    @route("/api/v1/cluster/members", ["POST"])
    async def add_member() -> Response:
        doc = await body_json()
        addr = doc.get("raft_addr") if isinstance(doc, dict) else None
        replay_kept(commands.digest({"op": "members.add", "raft_addr": addr}))
        if deps.members is None:
            raise AdminError(409, "membership_unavailable", "this control plane runs no Raft group to add to")
        result = await deps.members.add(addr)
        log.info("member %s added to the group", result["added"])
        return _ok(result, 201)

    @route("/api/v1/cluster/members/<path:member>", ["DELETE"])
    async def remove_member(member: str) -> Response:
        replay_kept(commands.digest({"op": "members.remove", "raft_addr": member}))
        if deps.members is None:
            raise AdminError(409, "membership_unavailable", "this control plane runs no Raft group to remove from")
        result = await deps.members.remove(member)
        log.info("member %s removed from the group", member)
        return _ok(result)

    console.register(app, deps, cluster_info, views)  # the web console: /, /signin, the pages (docs/console.md)
    openapi.register(app)  # GET /api/v1/openapi.json: this API's OpenAPI document (no key needed)
    admin_metrics.register(app, deps, views)  # GET /metrics: Prometheus, no key needed
    admin_errors.register(app, MAX_BODY_BYTES)  # what no route answered (404, 405, 413, 500...): JSON, never HTML

    agent_stream.register(app, deps)  # the agents' stream
    gateway_stream.register(app, deps)  # remote gateways follow the leader's table
    return app


def _raw_path() -> str:
    """The request's path and query as the client sent them (escapes kept: `a%2Fb` stays one segment)."""
    raw = request.scope.get("raw_path")
    path = raw.decode("latin-1") if isinstance(raw, bytes) else request.path
    query = request.query_string.decode("latin-1")
    return f"{path}?{query}" if query else path
