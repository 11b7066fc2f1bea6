"""The admin API's OpenAPI 3.1 document, served at `GET /api/v1/openapi.json`: every route of the table
(`api/table.py`), its parameters, bodies, answers and the error shape, as the code accepts and answers them.

Built from the same constants the routes check (model enums, key limits, settings, request-log filters),
so a bound that changes there changes here; tests/unit/test_openapi.py holds it to the route table and the app.
"""

from __future__ import annotations

import json
import re
from functools import cache
from typing import Any

from llmgw import __version__
from llmgw.control.api.route import IDEMPOTENCY_KEY_MAX_CHARS
from llmgw.domain import conditions, guard, model, summary_pages as status_pages, usage
from llmgw.domain.judges import STATUSES
from llmgw.domain.trust import MACHINE_ROLES
from llmgw.domain.keys import KEY_ROLES, LIMIT_MAX, NAME_MAX_CHARS, SCOPE_MAX_MODELS
from llmgw.domain.priority import CLASSES
from llmgw.domain.settings import SETTINGS

__all__ = ["NO_KEY_PATHS", "PATH", "WEBSOCKET_PATHS", "document", "rule_path", "text"]

PATH = "/api/v1/openapi.json"
# The operations that take no key: probes, this document, a machine's join (its token is its credential)
# and the CA's certificates (what a joining machine pins).
NO_KEY_PATHS = ("/health", "/metrics", PATH, "/api/v1/trust/join", "/api/v1/trust/ca")
# The streams' routes: a plain GET (no WebSocket upgrade) is answered 400, so they are listed as such.
WEBSOCKET_PATHS = frozenset({"/api/v1/agent/stream", "/api/v1/gateway/stream"})
# Routes outside the table for the cluster's machines only, by their certificate (never a key): the mirror's files.
MACHINE_PATHS = frozenset({"/mirror/blobs/{sha256}"})

Schema = dict[str, Any]


@cache
def text() -> bytes:
    return json.dumps(document()).encode()


def rule_path(rule: str) -> str:
    """A werkzeug rule as an OpenAPI path: `/api/v1/models/<path:name>` -> `/api/v1/models/{name}`."""
    return re.sub(r"<(?:[a-z_]+:)?([A-Za-z_][A-Za-z0-9_]*)>", r"{\1}", rule)


# --- schema helpers ----------------------------------------------------------------------------


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _obj(props: dict[str, Schema], required: tuple[str, ...] | None = None, *, closed: bool = False) -> Schema:
    """An object with these properties; all required unless `required` says which. `closed`: no others
    (request bodies the code refuses unknown keys of); answers stay open, so adding a field breaks no client."""
    doc: Schema = {"type": "object", "properties": props, "required": list(props if required is None else required)}
    if closed:
        doc["additionalProperties"] = False
    return doc


def _arr(items: Schema, **extra: Any) -> Schema:
    return {"type": "array", "items": items, **extra}


def _null(schema: Schema) -> Schema:
    """`schema` or null (unknown, never, no limit)."""
    return {"anyOf": [schema, {"type": "null"}]}


_STR: Schema = {"type": "string"}
_INT: Schema = {"type": "integer"}
_NUM: Schema = {"type": "number"}
_BOOL: Schema = {"type": "boolean"}
_FLAG: Schema = {"type": "string", "enum": ["1", "0", "true", "false", "yes", "no"]}
_ANY: Schema = {}  # any JSON value
_OBJ: Schema = {"type": "object"}


def _int(low: int, high: int) -> Schema:
    return {"type": "integer", "minimum": low, "maximum": high}


# --- components --------------------------------------------------------------------------------

_MODEL_NAME = {"type": "string", "pattern": r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"}
_REPLICAS_MAX = model.MAX_REPLICAS
_LIMIT = _null(_int(1, model.MAX_LIMIT))
# A per-model upstream wait: seconds above 0, at most a day (None: the gateway's default).
_WAIT = _null({"type": "number", "exclusiveMinimum": 0, "maximum": model.LONGEST_WAIT})


def _definition() -> Schema:
    """A model definition as `ModelDef.from_doc` takes it: `name`, `source` required, and `engine` but for a LoRA
    adapter (`base` set), which takes its base's engine and role."""
    size = _int(1, 64)
    return _obj({
        "name": _MODEL_NAME,
        "engine": {"type": "string", "enum": list(model.ENGINES)},
        "role": {"type": "string", "enum": list(model.ROLES)},
        # sim://NAME (engine sim), an absolute path, mirror://NAME, hf://ORG/REPO or pkg://PACKAGE/FILE.
        "source": {"type": "string", "minLength": 1, "maxLength": 1024},
        "mode": {"type": "string", "enum": list(model.MODES)},
        "replicas": _obj({"min": _int(0, _REPLICAS_MAX), "max": _int(1, _REPLICAS_MAX)}, (), closed=True),
        "idle_timeout_s": {"type": "number", "exclusiveMinimum": 0},
        "activation_window_s": {"type": "number", "exclusiveMinimum": 0},
        "args": _arr(_STR),
        "profile": _obj({"gpus": size, "tp": size, "pp": size, "nodes": size,
                         "classes": _arr({"type": "string", "minLength": 1}),
                         "memory_gib": {"type": "number", "minimum": 0}, "cpu": _BOOL}, (), closed=True),
        "limits": _obj({"max_tokens": _LIMIT, "max_n": _LIMIT,
                        "concurrency_per_replica": _null(_int(1, model.MAX_SLOTS))}, (), closed=True),
        "timeouts": _obj({name: _WAIT for name in ("connect_s", "first_byte_s", "chunk_s")}, (), closed=True),
        # Defined models of the same role, tried in order when this one refuses at once; and more public names.
        "fallbacks": {**_arr(_MODEL_NAME), "maxItems": model.MAX_FALLBACKS, "uniqueItems": True},
        "aliases": {**_arr(_MODEL_NAME), "maxItems": model.MAX_ALIASES, "uniqueItems": True},
        # null or absent: prefix for chat and guard models, off for embedding models.
        "routing": _obj({"affinity": _null({"type": "string", "enum": list(model.AFFINITIES)}),
                         "prefix_chars": _int(1, model.MAX_PREFIX_CHARS)}, (), closed=True),
        # A LoRA adapter of this defined model: `source` is the adapter file's absolute path.
        "base": _MODEL_NAME,
        # Schedule rules (domain/schedule.py): from each match of the `start` cron (cluster.time_zone) until the
        # `end` cron or `duration_s` later, replicas between min and max.
        "schedules": {**_arr(_rule(_CRON, _int(0, _REPLICAS_MAX), closed=True)), "maxItems": model.MAX_SCHEDULES},
        # Fast wake: an idle on-demand vllm (or sim) model sleeps at this level instead of stopping; 0: off.
        "sleep_level": {"type": "integer", "enum": list(model.SLEEP_LEVELS)},
    }, ("name", "source"), closed=True)


_CRON = {"type": "string", "minLength": 9, "maxLength": 200}  # 5 fields: "0 8 * * mon-fri"


def _rule(cron: Schema, count: Schema, *, closed: bool = False) -> Schema:
    """A schedule rule: `start` and `min`, `max` required; `end` (a cron) or `duration_s` (60 s to 366 days)."""
    return _obj({"start": cron, "end": cron, "duration_s": {"type": "number", "minimum": 60, "maximum": 366 * 86400},
                 "min": count, "max": count}, ("start", "min", "max"), closed=closed)


def _stored_definition() -> Schema:
    """A definition as the API shows it: every field, defaults filled; but `fallbacks`, `aliases` and
    `routing`, shown only when set (a definition without them is the one an older member reads)."""
    size = _int(1, 64)
    shown = ("name", "engine", "role", "source", "mode", "replicas", "idle_timeout_s", "activation_window_s", "args",
             "profile", "limits", "timeouts")
    return _obj({
        "name": _STR, "engine": _STR, "role": _STR, "source": _STR, "mode": _STR,
        "replicas": _obj({"min": _INT, "max": _INT}), "idle_timeout_s": _NUM, "activation_window_s": _NUM,
        "args": _arr(_STR),
        "profile": _obj({"gpus": size, "tp": size, "pp": size, "nodes": size, "classes": _arr(_STR),
                         "memory_gib": _NUM, "cpu": _BOOL}),
        # concurrency_per_replica: only when set (an older llmgw refuses the key).
        "limits": _obj({"max_tokens": _null(_INT), "max_n": _null(_INT), "concurrency_per_replica": _INT},
                       ("max_tokens", "max_n")),
        "timeouts": _obj({name: _null(_NUM) for name in ("connect_s", "first_byte_s", "chunk_s")}),
        "fallbacks": _arr(_STR), "aliases": _arr(_STR),
        "routing": _obj({"affinity": _null(_STR), "prefix_chars": _INT}),
        "base": _STR,  # a LoRA adapter's base model: only on adapters
        "schedules": _arr(_rule(_STR, _INT)),  # only when set
        "sleep_level": _INT,  # fast wake: only when set (1 or 2)
    }, shown)


def _estimate() -> Schema:
    return _obj({"bytes": _null(_INT), "source": _STR, "detail": _STR, "devices": _INT,
                 "per_device": _null(_NUM), "complete": _BOOL}, ("bytes", "source", "detail"))


def _activation() -> Schema:
    """A starting model's progress (llmgw/domain/activation.py; the gateway's 503 model_activating has it too)."""
    return _obj({"phase": {"type": "string", "enum": ["placing", "fetching", "starting", "loading", "waking"]},
                 "since": _null(_NUM), "bytes_done": _null(_INT), "bytes_total": _null(_INT),
                 "expected_s": _null(_NUM), "eta_s": _null(_NUM), "elapsed_s": _null(_NUM), "words": _STR},
                ("phase",))


def _model() -> Schema:
    status = _obj({"desired": _null(_INT), "ready": _null(_INT), "starting": _null(_INT), "state": _STR,
                   "reason": _STR, "parked": _BOOL, "failures_in_row": _INT, "last_error": _STR,
                   "flaps": _INT, "flap_ready_s": _NUM, "replicas": _arr(_OBJ), "activation": _null(_activation()), "window_s": _null(_NUM),
                   # A LoRA adapter's state per replica of its base (loaded, loading, "failed: why"); a base's adapters.
                   "adapter_on": {"type": "object", "additionalProperties": _STR}, "adapters": _arr(_STR),
                   "breakers": _arr(_obj({"replica_id": _STR, "gateway": _STR, "reason": _STR, "since": _NUM,
                                          "half_open": _BOOL})),
                   # Only on a model with schedule rules: which rules now (`rule`: its index, null: none) and when
                   # that changes next (unix seconds), with the bounds in force and a line of words.
                   "schedule": _obj({"rule": _null(_INT), "min": _INT, "max": _INT, "since": _null(_NUM),
                                     "until": _null(_NUM), "next_change": _null(_NUM), "time_zone": _STR,
                                     "words": _STR}, ("rule", "min", "max", "next_change", "words"))},
                  ("desired", "ready", "starting", "state", "reason", "parked", "failures_in_row", "last_error",
                   "replicas"))
    return {"allOf": [_ref("StoredDefinition"), _obj({"status": status})]}


def _key() -> Schema:
    return _obj({
        "id": {"type": "string", "pattern": "^key_[A-Za-z0-9]+$"}, "name": _STR,
        "role": {"type": "string", "enum": list(KEY_ROLES)}, "created_at": _null(_NUM), "models": _arr(_STR),
        "expires_at": _null(_NUM), "expired": _BOOL, "requests_per_min": _null(_INT),
        "tokens_per_min": _null(_INT), "priority": {"type": "string", "enum": list(CLASSES)},
    })


def _key_create() -> Schema:
    limit = _null(_int(1, LIMIT_MAX))
    return _obj({
        "name": {"type": "string", "minLength": 1, "maxLength": NAME_MAX_CHARS},
        "role": {"type": "string", "enum": list(KEY_ROLES)},
        # Scope, expiry and limits: client keys only (an admin key with one is refused, 400 invalid_key).
        "models": _arr({"type": "string", "minLength": 1}, maxItems=SCOPE_MAX_MODELS),
        "expires_at": _null({"type": "number", "exclusiveMinimum": 0}),
        "requests_per_min": limit, "tokens_per_min": limit,
        # Its requests' class when a replica's slots are full (absent: default); a request may ask lower.
        "priority": {"type": "string", "enum": list(CLASSES)},
    }, ("name",), closed=True)


def _member() -> Schema:
    return _obj({"id": _STR, "admin_url": _null(_STR), "version": _null(_STR), "role": _null(_STR),
                 "state": _STR, "reason": _STR, "leader": _null(_STR), "term": _null(_INT),
                 "commit_index": _null(_INT), "applied_index": _null(_INT), "revision": _null(_INT),
                 "lag": _null(_INT), "last_contact": _null(_NUM), "last_contact_age_s": _null(_NUM),
                 "state_hash": _null(_STR), "store_level": _null(_INT)}, ("id", "state"))


def _policy(*, stored: bool = False) -> Schema:
    """A guard policy as `GuardPolicy.from_doc` takes it (`judge` required; `name` may come from the path),
    or as stored (every field)."""
    models = _arr(_MODEL_NAME, minItems=1, maxItems=guard.MAX_MODELS)
    props: dict[str, Schema] = {
        "name": _MODEL_NAME, "judge": _MODEL_NAME, "check": {"type": "string", "enum": list(guard.CHECKS)},
        "models": _arr(_STR) if stored else {"anyOf": [models, {"type": "array", "items": {"const": "*"},
                                                                  "minItems": 1, "maxItems": 1}]},
        "categories": _arr({"type": "string", "enum": list(guard.CATEGORIES)}),
        "on_error": {"type": "string", "enum": list(guard.ON_ERROR)},
        "budget_s": {"type": "number", "exclusiveMinimum": 0, "maximum": guard.LONGEST_BUDGET},
    }
    return _obj(props) if stored else _obj(props, ("judge",), closed=True)


def _judge() -> Schema:
    return _obj({"model": _STR, "policies": _arr(_STR), "defined": _BOOL, "role": _null(_STR), "judge": _BOOL,
                 "desired": _null(_INT), "ready": _null(_INT), "starting": _null(_INT), "state": _null(_STR),
                 "last_failure": _null(_STR), "last_failure_at": _null(_NUM), "last_failure_age_s": _null(_NUM),
                 "status": {"type": "string", "enum": list(STATUSES)}, "problem": _STR},
                ("model", "policies", "defined", "status", "problem"))


def _components() -> Schema:
    counts = {name: _INT for name in usage.COUNTS}
    error = _obj({"error": _obj({"code": {"type": "string", "minLength": 1},
                                 "message": {"type": "string", "minLength": 1}}, closed=True)}, closed=True)
    return {
        "Error": error,
        # A failure true now (domain/conditions.py): GET /api/v1/status, /api/v1/notify/status, webhook events.
        "Condition": _obj({"kind": {"type": "string", "enum": sorted(conditions.KINDS)}, "subject": _STR,
                           "severity": {"type": "string", "enum": list(conditions.SEVERITIES)}, "words": _STR}),
        "Definition": _definition(),
        "StoredDefinition": _stored_definition(),
        "Estimate": _estimate(),
        "Model": _model(),
        "ModelWithEstimate": {"allOf": [_ref("Model"), _obj({"estimate": _ref("Estimate")})]},
        "Key": _key(),
        "KeyCreate": _key_create(),
        "KeyCreated": {"allOf": [_ref("Key"), _obj({"key": {"type": "string", "pattern": "^sk-"},
                                                    "warnings": _arr(_STR)})]},
        "Member": _member(),
        "Members": _obj({"self": _STR, "leader": _null(_STR), "version": _STR, "members": _arr(_ref("Member"))}),
        "UsageRow": _obj(counts, tuple(counts)),
        "GuardPolicyIn": _policy(),
        "GuardPolicy": _policy(stored=True),
        "Judge": _judge(),
    }


# --- operations --------------------------------------------------------------------------------

_ERRORS = {
    "400": "refused: the body, a parameter or the Idempotency-Key cannot be read or is not valid",
    "401": "no admin key, a client key, or an unknown key (`unauthorized`)",
    "404": "no such model, key, node, setting, member, request or guard policy, or a path that routes nowhere",
    "403": "a join token that cannot be used (`invalid_join_token`): unknown, used or expired",
    "409": "the cluster's state forbids it now (the message says what to do); `no_tls`: this control plane serves "
           "plain HTTP on loopback and issues no certificates; `upgrade_pending`: a write of a newer release than "
           "some control plane runs (the message names them)",
    "416": "a byte range past the end of a mirror file (`range_not_satisfiable`; Content-Range says its size)",
    "413": "a body over 1 MiB (`request_too_large`); a release file over 1 GiB (`release_too_large`)",
    "422": "this Idempotency-Key was used for a different request (`idempotency_key_reused`); a release file whose "
           "sha256 is not the one named (`sha256_mismatch`)",
    "502": "the engine asked did not answer, or failed (`judge_failed`)",
    "503": "not committed, or not answered: `not_leader`, `no_leader`, `leader_unreachable`, `commit_unknown`,"
           " `store_unavailable`, `gateway_unavailable`",
}


def _json(schema: Schema) -> Schema:
    return {"content": {"application/json": {"schema": schema}}}


def _path_param(name: str, schema: Schema, words: str) -> Schema:
    return {"name": name, "in": "path", "required": True, "schema": schema, "description": words}


def _query(name: str, schema: Schema, words: str) -> Schema:
    return {"name": name, "in": "query", "required": False, "schema": schema, "description": words}


_IDEMPOTENCY = {
    "name": "Idempotency-Key", "in": "header", "required": False,
    "description": "a write retried with the same key is applied once and answered as the first time",
    "schema": {"type": "string", "minLength": 1, "maxLength": IDEMPOTENCY_KEY_MAX_CHARS, "pattern": "^[ -~]+$"},
}


def _op(summary: str, ok: Schema, *, status: str = "200", also: dict[str, Schema] | None = None,
        errors: tuple[str, ...] = (), params: tuple[Schema, ...] = (), body: Schema | None = None,
        write: bool = False, body_required: bool = True, example: Any = None, binary: bool = False) -> Schema:
    """One admin operation: the admin key, every route's 401 and 503, a write's Idempotency-Key (400, 422) and
    its 409 `upgrade_pending` (a command of a store level the group does not write yet), a body's 400 and 413,
    and the `errors` it has of its own."""
    codes = {"401", "503", *errors}
    if any(p.get("in") == "path" for p in params):
        codes.add("404")  # a path segment the router does not take (a newline, say) routes nowhere: not_found
    if write:
        codes |= {"400", "409", "422"}
    if body is not None:
        codes |= {"400", "413"}
    answer = {"content": {"application/octet-stream": {"schema": ok}}} if binary else _json(ok)
    responses: Schema = {status: {"description": "done", **answer}, **(also or {})}
    for code in sorted(codes):
        responses[code] = {"$ref": f"#/components/responses/E{code}"}
    op: Schema = {"summary": summary, "responses": responses}
    parameters = [*params, *([_IDEMPOTENCY] if write else [])]
    if parameters:
        op["parameters"] = parameters
    if body is not None:
        op["requestBody"] = {"required": body_required, **_json(body)}
        if example is not None:
            op["requestBody"]["content"]["application/json"]["example"] = example
    return op


_DEMO = {"name": "demo", "engine": "sim", "source": "sim://demo", "mode": "on-demand"}


_UPGRADE: Schema = {"oneOf": [
    {"type": "object", "properties": {"sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"}},
     "required": ["sha256"], "additionalProperties": False},
    {"type": "object", "properties": {"rollback": {"const": True}}, "required": ["rollback"],
     "additionalProperties": False}]}


def _paths() -> Schema:
    name = _path_param("name", _MODEL_NAME, "a model's name")
    sha256 = _path_param("sha256", {"type": "string", "pattern": "^[0-9a-f]{64}$"}, "a release file's sha256")
    setting = _path_param("key", {"type": "string", "enum": sorted(SETTINGS)}, "a setting's key (the known ones)")
    member = _path_param("member", {"type": "string", "minLength": 1}, "a member's Raft address, HOST:PORT")
    key_id = _path_param("key_id", {"type": "string", "pattern": "^key_[A-Za-z0-9]{1,64}$"}, "a key's public id")
    node = _path_param("name", {"type": "string", "minLength": 1}, "a node's name")
    gateway = _path_param("name", {"type": "string", "minLength": 1},
                          "a gateway's name, as `GET /api/v1/gateways` lists it")
    request_id = _path_param("request_id", {"type": "string", "pattern": "^req-[a-z0-9]{1,24}-[0-9a-f]{16}$"},
                             "a request id, as `x-request-id` gave it (it names its gateway)")
    unix = {"type": "number"}
    filters = (
        _query("model", _STR, "only this model's requests (empty: any)"),
        _query("key", _STR, "only this client key's, by its id (empty: the requests that had no valid key)"),
        _query("status", {"type": "string", "pattern": r"^[1-5](\d\d|xx)$"}, "a status (429) or a class (4xx)"),
        _query("since", unix, "unix seconds, inclusive"),
        _query("until", unix, "unix seconds, exclusive"),
        _query("priority", {"type": "string", "enum": list(CLASSES)}, "only this priority class's requests"),
        _query("limit", _int(1, 1000), "records per page (default 50)"),
        _query("cursor", _STR, "`next_cursor` of the page before"),
    )
    switch = _obj({"stopped": _BOOL, "changed": _BOOL, "models": _INT, "replicas_placed": _INT,
                   "gpus_placed": _INT})
    websocket = {"101": {"description": "switched to a WebSocket (an agent's or a gateway's stream)"},
                 "400": {"$ref": "#/components/responses/E400"}}
    page = _obj({
        "requests": _arr(_OBJ), "next_cursor": _null(_STR),
        "gateways": _obj({"asked": _arr(_STR), "answered": _arr(_STR),
                          "unavailable": _arr(_obj({"gateway": _STR, "reason": _STR})), "dropped": _OBJ}),
    })
    return {
        "/health": {"get": {"summary": "liveness (no key)", "security": [], "responses": {
            "200": {"description": "this member serves", **_json(_obj({"status": _STR, "leader": _BOOL}))}}}},
        "/metrics": {"get": {"summary": "Prometheus metrics, the text exposition (no key; docs/observability.md)",
                             "security": [], "responses": {"200": {"description": "the control plane's families",
                                                                   "content": {"text/plain": {"schema": _STR}}}}}},
        PATH: {"get": {"summary": "this document (no key)", "security": [], "responses": {
            "200": {"description": "the OpenAPI document", **_json(_OBJ)}}}},
        "/api/v1/status": {"get": _op(
            "the cluster summary (`ctl status`): the aggregates and a page of each list that grows with the fleet "
            "(`pages`; `full=1`: every row, no `pages`)", _obj({
                "cluster": _OBJ, "nodes": _arr(_OBJ), "node_counts": _OBJ, "capacity": _arr(_OBJ),
                "fabrics": _arr(_OBJ), "weights": _arr(_OBJ), "models": _arr(_OBJ), "totals": _OBJ,
                "idle": _arr(_OBJ), "warnings": _arr(_ANY), "notify": _ANY, "conditions": _arr(_ref("Condition")),
                "pages": _obj({name: _obj({"offset": _INT, "limit": _INT, "total": _INT,
                                           **({"short": _BOOL} if name == "models" else {})})
                               for name in status_pages.DEFAULT_ROWS})},
                ("cluster", "nodes", "node_counts", "capacity", "fabrics", "weights", "models", "totals", "idle",
                 "warnings", "notify", "conditions")),  # `pages`: absent with full=1
            errors=("400",), params=(
                _query("full", _FLAG, "1: the whole document, every row of every list (no other parameter with it)"),
                *(p for name, rows in status_pages.DEFAULT_ROWS.items() for p in (
                    _query(name, _int(0, status_pages.MAX_ROWS), f"rows of `{name}` in the page (default {rows})"),
                    _query(f"{name}_offset", _int(0, status_pages.MAX_ROWS), f"the first row of `{name}` listed"))),
                _query("short", _FLAG, "1: only the models short of what they should have now (`satisfied` not true)"),
            ))},
        **_notify_paths(),
        "/api/v1/plan": {"post": _op("where one more replica would land now; changes nothing", _obj({
            "model": _STR, "revision": _INT, "nodes": _INT, "fits": _BOOL, "choice": _null(_OBJ), "reason": _STR,
            "groups": _arr(_OBJ), "refusals": _arr(_OBJ), "estimate": _ref("Estimate"),
            "existing": _obj({"defined": _BOOL, "same_definition": _BOOL, "replicas": _INT})}),
            params=(_IDEMPOTENCY,), body=_ref("Definition"), example=_DEMO)},  # checked, as on every POST
        "/api/v1/models": {
            "get": _op("every model, with its status", _obj({"models": _arr(_ref("Model"))})),
            "post": _op("define or replace a model", _obj({"model": _ref("Model")}), status="201",
                        also={"200": {"description": "replaced", **_json(_obj({"model": _ref("Model")}))}},
                        body=_ref("Definition"), write=True, example=_DEMO),
        },
        "/api/v1/models/{name}": {
            "get": _op("one model, with its memory estimate", _obj({"model": _ref("ModelWithEstimate")}),
                       errors=("404",), params=(name,)),
            "delete": _op("remove a model; its replicas are stopped", _obj({"removed": _STR}),
                          errors=("404",), params=(name,), write=True),
        },
        "/api/v1/models/{name}/retry": {"post": _op("un-park a model", _obj({"retried": _STR}), errors=("404",),
                                                    params=(name,), write=True)},
        "/api/v1/settings": {"get": _op("every setting", _obj({"settings": {
            "type": "object", "additionalProperties": _obj({"value": _ANY, "default": _ANY, "help": _STR,
                                                            "set": _BOOL})}}))},
        "/api/v1/settings/{key}": {
            "get": _op("one setting", _obj({"key": _STR, "value": _ANY, "default": _ANY, "set": _BOOL}),
                       errors=("404",), params=(setting,)),
            "put": _op("change a setting live (400 invalid_setting: wrong type or value; 409 upgrade_pending: "
                       "nodes.require_approval below store level 3)",
                       _obj({"key": _STR, "value": _ANY}), errors=("404", "409"), params=(setting,), body=_ANY,
                       write=True),
        },
        "/api/v1/nodes": {"get": _op("every node the leader knows", _obj({"nodes": _arr(_obj(
            {"node": _STR, "state": _STR, "approval": _STR, "cordon": _STR, "drain": _null(_OBJ),
             "gpus": _null(_arr(_OBJ)), "replicas": _null(_arr(_STR)), "connected_at": _null(_NUM)}))}))},
        "/api/v1/nodes/{name}": {"get": _op(
            "one node as the list has it, with the replicas placed there and what its agent says of each "
            "(`placed` false: one its agent runs that no placement puts there)",
            _obj({"node": _OBJ, "agent_reported": _BOOL, "placements": _arr(_obj(
                {"replica_id": _STR, "model": _STR, "gpus": _null(_arr(_INT)), "placed": _BOOL, "asleep": _BOOL,
                 "state": _null(_STR), "phase": _null(_STR), "error": _null(_STR), "since": _null(_NUM)}))}),
            params=(node,)),
            "delete": _op("forget a lost node; the placements the state still holds there go in the same command "
                          "(`removed_placements`), so no later leader finds it again",
                          _obj({"forgotten": _STR, "removed_placements": _arr(_STR)}), errors=("404", "409"),
                          params=(node,), write=True)},
        "/api/v1/nodes/{name}/approve": {"post": _op(
            "approve a node (while nodes.require_approval is on, a new node is pending: nothing is placed on it "
            "until approved); remembered in the cluster state. Approving twice is no error (`already`)",
            _obj({"approved": _STR, "already": _BOOL, "approved_at": _null(_NUM)}), errors=("404",), params=(node,),
            write=True)},
        **{f"/api/v1/nodes/{{name}}/{verb}": {"post": _op(
            what + "; kept in the cluster state. Asking for what holds already is no error (`changed` false)",
            _obj({"node": _STR, "cordon": _STR, "changed": _BOOL, "drain": _null(_obj(
                {"left": _INT, "moving": _null(_STR), "blocked": _null(_STR), "words": _STR}))}),
            errors=("404", "409"), params=(node,), write=True)} for verb, what in (
            ("cordon", "cordon a node for maintenance: nothing new is placed on it, what runs there stays"),
            ("drain", "drain a node: cordon it, and move its replicas elsewhere one at a time (each replacement "
                      "ready before the old one leaves the routes; the old one stops drain_stop_grace_s later)"),
            ("uncordon", "uncordon a node: ends a cordon or a drain (replicas already moved stay where they are)"))},
        "/api/v1/nodes/{name}/restart": {"post": _op(
            "ask a connected node's agent to restart in place (engines keep serving, adopted)",
            _obj({"restarting": _STR, "connected_at": _null(_NUM)}), errors=("404", "409", "503"), params=(node,),
            write=True)},
        "/api/v1/gateways": {"get": _op(
            "every gateway the leader has seen on its stream, connected or not; then the one inside its own process "
            "(`llmgw up`: `in_process` true)", _obj({
                "gateways": _arr(_obj({"name": _STR, "address": _STR, "connected": _BOOL, "connected_at": _NUM,
                                       "last_contact": _NUM, "query_url": _null(_STR), "restartable": _BOOL,
                                       "pid": _null(_INT), "started_at": _null(_NUM), "release_sha256": _null(_STR),
                                       "upgrade_refused": _null(_STR), "in_process": _BOOL}))}))},
        "/api/v1/gateways/{name}/restart": {"post": _op(
            "ask a connected gateway to restart in place (it drains; its listening socket passes to the program "
            "that runs next: no client refused)",
            _obj({"restarting": _STR, "connected_at": _NUM, "started_at": _null(_NUM), "pid": _null(_INT)}),
            errors=("404", "409", "503"), params=(gateway,), write=True)},
        "/api/v1/gateways/{name}/upgrade": {"post": _op(
            "ask a connected gateway to fetch a release from the leader and restart in place into it (`sha256`), "
            "or into the file it ran before (`rollback`); it drains and hands its listening socket over, as for a "
            "restart. Its refusal shows as its `upgrade_refused` in the list of gateways",
            _obj({"upgrading": _STR, "connected_at": _NUM, "started_at": _null(_NUM), "pid": _null(_INT),
                  "from": _null(_STR), "to": _null(_STR), "rollback": _BOOL}),
            errors=("404", "409", "503"), params=(gateway,), body=_UPGRADE, write=True, example={"rollback": True})},
        "/api/v1/system/stop": {"post": _op("stop serving (`serving.stopped` = true)", switch, write=True)},
        "/api/v1/system/start": {"post": _op("serve again (`serving.stopped` = false)", switch, write=True)},
        "/api/v1/keys": {
            "get": _op("every key by its public id, oldest first", _obj({"keys": _arr(_ref("Key"))})),
            "post": _op("a new key; its secret is in this answer only", _ref("KeyCreated"), status="201",
                        errors=("409",), body=_ref("KeyCreate"), write=True,
                        example={"name": "team-a", "models": ["demo"], "requests_per_min": 600}),
        },
        "/api/v1/keys/{key_id}": {"delete": _op("revoke a key", _obj({"revoked": _STR}), errors=("404", "409"),
                                                params=(key_id,), write=True)},
        "/api/v1/requests": {"get": _op("the newest request records of every gateway, merged", page,
                                        errors=("400",), params=filters)},
        "/api/v1/requests/{request_id}": {"get": _op("one request's record, from the gateway its id names",
                                                     _obj({"request": _OBJ, "gateway": _STR}), errors=("404",),
                                                     params=(request_id,))},
        "/api/v1/usage": {"get": _op("hourly usage rollups", _obj({
            "since": _NUM, "until": _NUM, "by": _STR, "usage": _arr(_OBJ), "totals": _ref("UsageRow")}),
            errors=("400",), params=(
                _query("since", unix, "unix seconds (default: a day ago)"),
                _query("until", unix, "unix seconds (default: an hour from now)"),
                _query("key", _STR, "one client key's id"), _query("model", _STR, "one model"),
                _query("by", {"type": "string", "enum": ["total", "hour", "day"]}, "the period of each row")))},
        **_guard_paths(),
        **_trust_paths(),
        **_mirror_paths(),
        "/api/v1/cluster/members": {
            "get": _op("the control planes, as the member asked sees them", _ref("Members")),
            "post": _op("add a running member (`--join`)", _obj({"added": _STR, "members": _arr(_STR)}),
                        status="201", errors=("409",), body=_obj({"raft_addr": {"type": "string",
                                                                                "pattern": "^.+:[0-9]{1,5}$"}}),
                        write=True),
        },
        "/api/v1/cluster/members/{member}": {"delete": _op("remove a member (not the leader)", _obj(
            {"removed": _STR, "members": _arr(_STR)}), errors=("404", "409"), params=(member,), write=True)},
        "/api/v1/cluster/self": {"get": _op("this member alone", _obj({
            "raft_addr": _STR, "role": _STR, "ready": _BOOL, "revision": _INT, "group": _arr(_STR), "pid": _INT,
            "started_at": _NUM, "raft_links": {"type": "object", "additionalProperties": _STR},
            "store_level": _INT, "group_store_level": _INT, "release_sha256": _null(_STR),
            "release_reason": _null(_STR)}), errors=("404",))},
        "/api/v1/cluster/self/restart": {"post": _op(
            "restart this member in place (a leader hands over first); answered by the member asked, never "
            "forwarded", _obj({"restarting": _STR, "pid": _INT}), errors=("409",), write=True)},
        "/api/v1/cluster/self/upgrade": {"post": _op(
            "restart this member in place into a release uploaded to it (`sha256`), or into the file it ran before "
            "(`rollback`); a leader hands over first; answered by the member asked, never forwarded",
            _obj({"upgrading": _null(_STR), "pid": _INT, "from": _null(_STR), "to": _STR, "unchanged": _BOOL}),
            errors=("404", "409"), body=_UPGRADE, write=True, example={"sha256": "0" * 64})},
        "/api/v1/nodes/{name}/upgrade": {"post": _op(
            "ask a connected node's agent to fetch a release from the leader and restart into it (`sha256`), or "
            "into the file it ran before (`rollback`); its engines keep serving",
            _obj({"upgrading": _STR, "connected_at": _null(_NUM), "to": _null(_STR), "rollback": _BOOL}),
            errors=("404", "409", "503"), params=(node,), body=_UPGRADE, write=True, example={"rollback": True})},
        "/api/v1/releases/{sha256}": {
            "put": _op("upload a release file (a zipapp, up to 1 GiB) to this member, kept only if its sha256 is the "
                       "path's (422 `sha256_mismatch`); answered by the member asked, never forwarded",
                       _obj({"sha256": _STR, "size": _INT, "member": _STR, "path": _STR}), params=(sha256,),
                       errors=("409", "413", "422"), write=True) | {"requestBody": {
                           "required": True, "content": {"application/octet-stream": {"schema": {
                               "type": "string", "format": "binary"}}}}},
            "get": _op("a release file this member holds, by sha256: for the cluster's machines (mutual TLS: their "
                       "certificate from the cluster's CA stands for the key) or an admin key",
                       {"type": "string", "format": "binary"}, params=(sha256,), errors=("400", "403"),
                       binary=True),
        },
        "/mirror/blobs/{sha256}": {"get": _op(
            "a model mirror file this member holds, by sha256 (docs/mirror.md): for agents and control planes only, "
            "by their certificate from the cluster's CA (never a key); one byte range at most (`Range: bytes=A-B`: "
            "206 with Content-Range; 416 past the end); 503 `mirror_busy`: fetch from another member",
            {"type": "string", "format": "binary"}, binary=True, errors=("400", "403", "416"),
            params=(_path_param("sha256", {"type": "string", "pattern": "^[0-9a-f]{64}$"}, "a mirror file's sha256"),
                    {"name": "Range", "in": "header", "required": False, "schema": _STR,
                     "description": "one byte range, `bytes=A-B`, `bytes=A-` or `bytes=-N`"}),
            also={"206": {"description": "the range asked", "content": {"application/octet-stream": {
                "schema": {"type": "string", "format": "binary"}}}}}) | {"security": []}},
        "/api/v1/agent/stream": {"get": {"summary": "the agents' stream (WebSocket; admin key)",
                                         "responses": websocket}},
        "/api/v1/gateway/stream": {"get": {"summary": "the remote gateways' stream (WebSocket; admin key)",
                                           "responses": websocket}},
    }


def _notify_paths() -> Schema:
    """The notifier's routes (ops/notify.py); webhooks by id (scheme, host, hash), never their URLs."""
    delivery = _obj({"event": _STR, "kind": _STR, "subject": _STR, "queued_at": _NUM, "outcome": _STR,
                     "attempts": _INT, "status": _null(_INT), "error": _STR, "finished_at": _null(_NUM)})
    hook = _obj({"id": _STR, "format": _STR, "failing": _BOOL, "failures_in_row": _INT, "last_error": _STR,
                 "queued": _INT, "dropped": _INT, "delivered": _INT, "failed": _INT, "attempts": _INT,
                 "last_ok_at": _null(_NUM), "last_failure_at": _null(_NUM), "deliveries": _arr(delivery)})
    active = {"allOf": [_ref("Condition"), _obj({"since": _NUM, "clearing_since": _null(_NUM)})]}
    tested = {"allOf": [delivery, _obj({"id": _STR, "format": _STR})]}
    return {
        "/api/v1/notify/status": {"get": _op("the webhooks' deliveries and the conditions active now", _obj({
            "configured": _INT, "hint": _STR, "running": _BOOL, "checked_at": _null(_NUM), "leading_since": _null(_NUM),
            "settling_until": _null(_NUM), "webhooks": _arr(hook),
            "active": _arr(active), "recorded": _BOOL, "record_error": _STR}))},
        "/api/v1/notify/test": {"post": _op("a test event to every webhook, one try each (409 no_webhooks)",
                                            _obj({"delivered": _INT, "webhooks": _arr(tested)}), errors=("409",),
                                            write=True)},
    }


def _guard_paths() -> Schema:
    name = _path_param("name", _MODEL_NAME, "a guard policy's name")
    on = {"enabled": _BOOL, "notice": _STR}  # `guard.enabled`, and the words when guards are off
    policy_doc = _obj({**on, "policy": _ref("GuardPolicy")})
    set_doc = _obj({**on, "policy": _ref("GuardPolicy"), "created": _BOOL, "changed": _BOOL, "warnings": _arr(_STR)})
    ask_doc = _obj({"judge": _STR, "replica": _STR, "checked": _STR, "raw": _STR, "parsed": {"type": "object"},
                    "latency_ms": {"type": "number"}, "cached": _BOOL})
    enabled_doc = _obj({"model": _ref("StoredDefinition"), "judge": _STR, "changed": _BOOL, "replaced": _null(_STR),
                        "found_on": _arr(_STR), "warnings": _arr(_STR)})
    return {
        "/api/v1/guard/policies": {"get": _op("every guard policy, and whether guards are on", _obj(
            {**on, "policies": _arr(_ref("GuardPolicy"))}))},
        "/api/v1/guard/policies/{name}": {
            "get": _op("one guard policy", policy_doc, errors=("404",), params=(name,)),
            "put": _op("set a guard policy (400 invalid_policy names the field)", set_doc, status="201",
                       also={"200": {"description": "replaced", **_json(set_doc)}}, params=(name,),
                       body=_ref("GuardPolicyIn"), write=True,
                       example={"judge": "llama-guard", "check": "prompt", "categories": ["S1", "S6"]}),
            "delete": _op("remove a guard policy", _obj({"removed": _STR}), errors=("404",), params=(name,),
                          write=True),
        },
        "/api/v1/guard/judges": {"get": _op("each judge model the policies ask for: defined, as a judge, ready, "
                                            "its last failure, what is wrong", _obj({**on, "judges": _arr(
                                                _ref("Judge"))}))},
        "/api/v1/guard/judges/enable": {"post": _op(
            "serve the missing judge (llama.cpp on CPU, role guard) from a GGUF file", enabled_doc, status="201",
            also={"200": {"description": "replaced, or already so", **_json(enabled_doc)}}, errors=("409",),
            body=_obj({"name": _MODEL_NAME, "source": {"type": "string", "minLength": 1, "maxLength": 1024},
                       "replace": _BOOL}, (), closed=True), write=True,
            example={"name": "llama-guard", "source": "/models/Llama-Guard-3-1B.Q4_K_M.gguf"})},
        "/api/v1/guard/judges/ask": {"post": _op(  # ops/judges.py ask: nothing of the text is kept
            "a judge reads a text past the verdict cache: its raw answer and how it was parsed", ask_doc,
            errors=("404", "409", "502"), body=_obj({"text": {"type": "string", "minLength": 1}, "answer": _STR,
                                                     "judge": _MODEL_NAME}, ("text",), closed=True), write=True,
            example={"text": "how do I pick a lock?", "judge": "llama-guard"})},
    }


def _mirror_paths() -> Schema:
    """The model mirror (ops/mirror.py, docs/mirror.md): the catalog, resumable uploads, blobs between members."""
    from llmgw.domain.mirror import KINDS, NAME_MAX_CHARS

    mname = {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._:-]*$", "maxLength": NAME_MAX_CHARS}
    name = _path_param("name", mname, "a mirror file's name (`mirror://NAME` in a model's source)")
    upload_id = _path_param("upload_id", {"type": "string", "pattern": "^[0-9a-f]{32}$"}, "an upload's id")
    sha256 = _path_param("sha256", {"type": "string", "pattern": "^[0-9a-f]{64}$"}, "a blob's sha256")
    file = _obj({"name": _STR, "sha256": _STR, "size": _INT, "kind": {"type": "string", "enum": list(KINDS)},
                 "metadata": _OBJ, "added_at": _NUM, "pinned": _BOOL, "used_by": _arr(_STR), "collectable": _BOOL,
                 "members": _obj({"holding": _arr(_STR), "missing": _arr(_STR)})})
    upload = _obj({"id": _STR, "name": _STR, "size": _INT, "sha256": _null(_STR), "offset": _INT,
                   "started_at": _NUM})
    offset = _obj({"id": _STR, "offset": _INT, "size": _INT})
    serve = _obj({"name": _STR, "file": _STR, "judge": _BOOL, "definition": _ref("Definition"),
                  "estimate": _ref("Estimate"), "profile_reason": _STR,
                  "plan": _obj({"fits": _BOOL, "reason": _STR, "choice": _null(_OBJ), "groups": _arr(_OBJ)}),
                  "warnings": _arr(_STR), "committed": _BOOL, "model": _ref("Model")},
                 ("name", "file", "judge", "definition", "estimate", "plan", "committed"))
    return {
        "/api/v1/mirror": {"get": _op("the mirror's files (size, sha256, kind, header facts, what uses each, pinned, "
                                      "which control planes hold or lack it), the budget and the uploads in progress",
                                      _obj({"files": _arr(file), "budget_bytes": _INT, "stored_bytes": _INT,
                                            "uploads": _arr(upload), "members": _arr(_STR)}))},
        "/api/v1/mirror/held": {"get": _op(
            "the mirror's blobs on the disk of the member asked (answered by it, never forwarded): sha256 -> size, "
            "its pulls from the leader in progress (bytes so far) and their last failures",
            _obj({"member": _STR, "blobs": {"type": "object", "additionalProperties": _INT},
                  "pulling": {"type": "object", "additionalProperties": _INT},
                  "errors": {"type": "object", "additionalProperties": _STR}}))},
        "/api/v1/mirror/{name}": {
            "get": _op("one mirror file", _obj({"file": file}), errors=("404",), params=(name,)),
            "delete": _op("remove a mirror file (409 `mirror_file_in_use` names who uses it); a blob no name refers "
                          "to is deleted", _obj({"removed": _STR, "collected": _arr(_STR)}), errors=("404",),
                          params=(name,), write=True),
        },
        "/api/v1/mirror/{name}/pin": {"post": _op(
            "pin a mirror file (kept whether or not anything uses it) or unpin it",
            _obj({"name": _STR, "pinned": _BOOL, "changed": _BOOL}), errors=("404",), params=(name,),
            body=_obj({"pinned": _BOOL}, closed=True), write=True, example={"pinned": True})},
        "/api/v1/mirror/{name}/serve": {"post": _op(
            "a model definition made from the file's metadata (engine, role, a profile that fits, "
            "`source: mirror://NAME`), its memory estimate and where it would land now; `commit: true` stores it "
            "(201 when new; refused as a model put is: 400 `invalid_model`). A Llama Guard file is defined as the "
            "judge the guard policies ask for (`judge: true`); a LoRA adapter is refused",
            serve, status="200", also={"201": {"description": "stored, new", **_json(serve)}},
            errors=("404",), params=(name,),
            body=_obj({"commit": _BOOL, "name": _MODEL_NAME, "mode": _STR, "replicas": _OBJ, "profile": _OBJ,
                       "args": _arr(_STR), "limits": _OBJ, "aliases": _arr(_STR), "fallbacks": _arr(_STR),
                       "routing": _OBJ, "timeouts": _OBJ, "role": _STR, "engine": _STR}, (), closed=True),
            write=True, example={"commit": False})},
        "/api/v1/mirror/uploads": {"post": _op(
            "start (or find again) a resumable upload to the leader: its id and the offset it holds; refused at its "
            "start when the file would pass `mirror.budget_gib` (409 `mirror_budget_exceeded`)",
            _obj({"id": _STR, "offset": _INT, "size": _INT, "name": _STR}),
            body=_obj({"name": mname, "size": {"type": "integer", "minimum": 1},
                       "sha256": _null({"type": "string", "pattern": "^[0-9a-f]{64}$"})}, ("name", "size"),
                      closed=True),
            write=True, example={"name": "smollm2", "size": 1048576})},
        "/api/v1/mirror/uploads/{upload_id}": {
            "get": _op("an upload in progress: the offset it holds", upload, errors=("404",), params=(upload_id,)),
            "put": _op("append a piece at the offset its `Content-Range: bytes START-END/TOTAL` names (409 "
                       "`upload_offset_mismatch` with the `offset` held, so the client continues there)", offset,
                       errors=("404",), params=(upload_id,), write=True) | {"requestBody": {
                           "required": True, "content": {"application/octet-stream": {"schema": {
                               "type": "string", "format": "binary"}}}}},
            "delete": _op("drop an upload in progress", _obj({"dropped": _STR}), errors=("404",),
                          params=(upload_id,), write=True),
        },
        "/api/v1/mirror/uploads/{upload_id}/commit": {"post": _op(
            "hash, validate and keep the complete upload, and add its name to the catalog (400 `invalid_file` with "
            "the reason: the file is deleted; 422 `sha256_mismatch`; 409 `upload_incomplete` with the offset)",
            _obj({"file": file, "added": _BOOL}), status="201",
            also={"200": {"description": "already so", **_json(_obj({"file": file, "added": _BOOL}))}},
            errors=("404",), params=(upload_id,), write=True)},
    }


def _no_key(op: Schema) -> Schema:
    """An operation anyone may call: no admin key asked, so no 401 for a missing one."""
    return {**op, "security": [], "responses": {k: v for k, v in op["responses"].items() if k != "401"}}


def _trust_paths() -> Schema:
    """Trust between machines (ops/trust.py): join tokens, joins, machines' certificates, the CA."""
    role = {"type": "string", "enum": list(MACHINE_ROLES)}
    token = _obj({"id": _STR, "role": _STR, "name": _null(_STR), "created_at": _NUM, "expires_at": _NUM,
                  "expired": _BOOL, "used_at": _null(_NUM), "used_by": _null(_STR)})
    made = _obj({"id": _STR, "token": _STR, "role": _STR, "name": _null(_STR), "expires_at": _NUM, "ca_hash": _STR})
    machine = _obj({"role": _STR, "name": _STR, "serial": _STR, "not_after": _NUM, "expires_in_s": _NUM,
                    "issued_at": _null(_NUM), "revoked": _BOOL})
    authority = _obj({"id": _STR, "active": _BOOL, "not_after": _NUM, "added_at": _NUM, "subject": _STR})
    ca_doc = _obj({"ca_hash": _null(_STR), "root_held_here": _BOOL, "authorities": _arr(authority),
                   "bundle": _null(_STR)})
    joined = _obj({"role": _STR, "name": _STR, "serial": _STR, "not_after": _NUM, "certificate": _STR, "ca": _STR})
    token_id = _path_param("token_id", {"type": "string", "pattern": "^tok_[A-Za-z0-9]{1,40}$"}, "a join token's id")
    machine_role = _path_param("role", role, "the machine's role")
    machine_name = _path_param("name", {"type": "string", "minLength": 1}, "the machine's name")
    return {
        "/api/v1/trust/tokens": {
            "get": _op("the join tokens that can still be used (never the tokens themselves)",
                       _obj({"tokens": _arr(token)})),
            "post": _op("a join token for one machine of a role, shown once, with the CA hash to pin", made,
                        status="201", errors=("409",), body=_obj({"role": role, "name": _STR, "ttl_s": _NUM}, ("role",), closed=True),
                        write=True, example={"role": "agent", "ttl_s": 3600}),
        },
        "/api/v1/trust/tokens/{token_id}": {"delete": _op("remove a join token", _obj({"id": _STR, "removed": _BOOL}),
                                                          errors=("404",), params=(token_id,), write=True)},
        "/api/v1/trust/join": {"post": _no_key(_op(
            "a machine's join: its token and certificate request for a certificate (no key: the token is the "
            "credential)", joined, status="201", errors=("403", "409"),
            body=_obj({"token": _STR, "role": role, "name": _STR, "csr": _STR, "hosts": _arr(_STR)},
                      ("token", "role", "name", "csr"), closed=True)))},
        "/api/v1/trust/machines": {"get": _op("every machine's certificate, and the revoked ones",
                                              _obj({"machines": _arr(machine)}))},
        "/api/v1/trust/machines/{role}/{name}/revoke": {"post": _op(
            "revoke every certificate of a machine: its streams end, every member refuses it",
            _obj({"role": _STR, "name": _STR, "revoked": _arr(_STR)}), errors=("404",),
            params=(machine_role, machine_name), write=True)},
        "/api/v1/trust/ca": {"get": _no_key(_op("the cluster's CA: its authorities, the bundle machines trust, and "
                                                "the hash a joining machine pins (no key)", ca_doc))},
        "/api/v1/trust/ca/rotate": {"post": _op(
            "a new intermediate from the root (on the member that holds it); the old ones stay trusted until they "
            "expire", ca_doc, status="201", errors=("409",), write=True)},
    }


@cache
def document() -> dict[str, Any]:
    """The whole OpenAPI document (built once; callers must not change it)."""
    return {
        "openapi": "3.1.0",
        "info": {"title": "llmgw admin API", "version": __version__,
                 "description": "The control plane's admin API (docs/api.md). JSON in and out; every refusal is "
                                "`{\"error\": {\"code\", \"message\"}}`, never an HTML page."},
        "servers": [{"url": "/"}],
        "security": [{"admin_key": []}],
        "paths": _paths(),
        "components": {
            "securitySchemes": {"admin_key": {"type": "http", "scheme": "bearer",
                                              "description": "an admin key (never a client key)"}},
            "schemas": _components(),
            "responses": {f"E{code}": {"description": words, **_json(_ref("Error"))}
                          for code, words in _ERRORS.items()},
        },
    }
