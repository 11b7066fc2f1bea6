"""The agent ↔ control stream: JSON messages over one WebSocket per agent.

Up (agent → control): hello, inventory, replicas (the full list, on every
change), heartbeat. Down (control → agent): welcome, start_replica,
stop_replica, refused. Each message is an object with a "type".

The gateway ↔ control stream (a gateway follows the leader's table) is below
`GATEWAY_STREAM_PATH`: up hello (with the URL its request log answers at, whether it can restart in
place, its pid, its program's start time and its release file's sha256), demand (with, when they changed, its
open circuit breakers under "breakers": a key an older leader passes over), usage (a batch of rollups),
judge_failure (a judge model did not answer a check), rejected (`message_type` upgrade_gateway: why it refused
an upgrade), heartbeat; down welcome, table (the full table, on connect and on every change), usage_ack,
heartbeat, refused, rejected (a message the leader could not read; the stream goes on), restart_gateway (an
operator asked it to restart in place: `llmgw ctl gateways restart`), upgrade_gateway (`{"sha256": S}` or
`{"rollback": true}`: fetch release S from the leader and restart in place into it, or into the file it ran
before: `llmgw ctl upgrade`).

`loads` is the one door for both streams, both ways: whatever the peer sent, it returns an object
with a "type" or raises `ProtocolError` (too large, nested deeper than `MAX_NESTING`, not JSON).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from itertools import accumulate
from types import MappingProxyType
from collections.abc import Callable
from typing import Any, Mapping, TypeVar

from llmgw.domain.activation import Progress
from llmgw.domain.frozen import freeze, thaw
from llmgw.domain.guard import GuardPolicy
from llmgw.domain.model import DefinitionError, ModelDef
from llmgw.domain.priority import DEFAULT, class_problem
from llmgw.domain.observed import MAX_ADAPTERS, ROUTE_STATES, Endpoint, ModelRoute
from llmgw.domain.state import ApiKey, ClusterState

PROTOCOL_VERSION = 1
STREAM_PATH = "/api/v1/agent/stream"
# A control plane's model mirror files, by sha256, for the cluster's machines (control/api/mirror_blobs.py).
MIRROR_BLOBS_PATH = "/mirror/blobs/"
MAX_MESSAGE_BYTES = 4 << 20
# Our messages nest a dozen levels at most; json.loads recurses once per level, so a message nested
# deeper than this is refused before it is decoded (100,000 `[` would end in a RecursionError).
MAX_NESTING = 64


class ProtocolError(ValueError):
    pass


def dumps(message: dict[str, Any]) -> str:
    return json.dumps(message, separators=(",", ":"))


def loads(text: str | bytes) -> dict[str, Any]:
    """A message from the peer, checked: size, nesting, JSON, an object with a 'type'. Raises only
    `ProtocolError`, whatever the peer sent."""
    if len(text) > MAX_MESSAGE_BYTES:
        raise ProtocolError("message too large")
    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
    except ValueError as e:
        raise ProtocolError(f"not JSON: {e}") from None
    if nested_deeper(text, MAX_NESTING):
        raise ProtocolError(f"nested deeper than {MAX_NESTING} levels")
    try:
        message = json.loads(text)
    except ValueError as e:
        raise ProtocolError(f"not JSON: {e}") from None
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise ProtocolError("a message is an object with a 'type'")
    return message


_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.S)  # one that is not closed runs to the end
_NOT_BRACKETS = re.compile(r"[^\[\]{}]+")
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def nested_deeper(text: str, limit: int) -> bool:
    """Whether JSON `text` opens more than `limit` arrays and objects inside each other (brackets in
    strings not counted). Linear in the text, and in C but for the brackets: no recursion."""
    brackets = _NOT_BRACKETS.sub("", _STRING.sub("", text)).encode("ascii")
    return next(filter(limit.__lt__, accumulate(map(_STEP.__getitem__, brackets))), None) is not None


# --- the gateway ↔ control stream --------------------------------------------------
#
# Level-triggered: every "table" is the whole table (no diffs), numbered by the
# leader's `version` (it restarts with each leader). Keys travel as hashes only.

GATEWAY_STREAM_PATH = "/api/v1/gateway/stream"
GATEWAY_PROTOCOL_VERSION = 1


def route_doc(route: ModelRoute) -> dict[str, Any]:
    """A route on the wire; `activation` and `window_s` only when set (an older gateway reads no more than
    it knows, and a route without them is the same bytes as before them)."""
    doc: dict[str, Any] = {"model": route.model, "role": route.role, "state": route.state, "reason": route.reason,
                           "endpoints": [{"replica_id": e.replica_id, "url": e.url, "node": e.node,
                                          **({"loras": e.loras} if e.loras else {}),
                                          **({"tool_calls": e.tool_calls} if e.tool_calls is not None else {})}
                                         for e in route.endpoints]}
    if route.activation is not None:
        doc["activation"] = route.activation.to_doc()
    if route.window_s:
        doc["window_s"] = route.window_s
    if route.base:
        doc["base"] = route.base
    if route.lora_id is not None:
        doc["lora_id"] = route.lora_id
    if route.off_until is not None:
        doc["off_until"] = route.off_until
    return doc


def route_from_doc(doc: Mapping[str, Any]) -> ModelRoute:
    state = str(doc["state"])
    if state not in ROUTE_STATES:
        raise ProtocolError(f"unknown route state {state!r}")
    endpoints = tuple(Endpoint(str(e["replica_id"]), str(e["url"]), str(e.get("node", "")),
                               n if type(n := e.get("loras", 0)) is int and 0 <= n <= MAX_ADAPTERS else 0,
                               t if type(t := e.get("tool_calls")) is bool else None)
                      for e in doc.get("endpoints", ()))
    progress = doc.get("activation")
    window: Any = doc.get("window_s")
    off: Any = doc.get("off_until")
    return ModelRoute(str(doc["model"]), str(doc.get("role", "")), state, endpoints, str(doc.get("reason", "")),
                      activation=Progress.from_doc(progress) if isinstance(progress, Mapping) else None,
                      window_s=float(window) if type(window) in (int, float) and 0 < window < 1e9 else 0.0,
                      base=str(doc.get("base", "")),
                      lora_id=lora if type(lora := doc.get("lora_id")) is int and 0 <= lora < 1 << 16 else None,
                      off_until=float(off) if type(off) in (int, float) and 0 <= off < 1e11 else None)


def table_message(version: int, leader: str, state: ClusterState,
                  routes: Mapping[str, ModelRoute] | None) -> dict[str, Any]:
    """The table a gateway follows. `routes` None: the leader has not planned yet, so the
    gateway keeps the routes it has (unknown is not "no endpoints")."""
    return {
        "type": "table",
        "version": version,
        "leader": leader,
        "revision": state.revision,
        "models": [m.to_doc() for _, m in sorted(state.models.items())],
        "keys": [key_doc(k) for _, k in sorted(state.keys.items())],
        "settings": thaw(state.settings),
        "guard_policies": [p.to_doc() for _, p in sorted(state.guard_policies.items())],
        "routes": None if routes is None else [route_doc(r) for _, r in sorted(routes.items())],
    }


def key_doc(k: ApiKey) -> dict[str, Any]:
    """A key as a gateway needs it: hash, id, role, scope, expiry, limits, priority (never the key)."""
    return {"hash": k.key_hash, "id": k.id, "name": k.name, "role": k.role, "models": list(k.models),
            "expires_at": k.expires_at, "requests_per_min": k.requests_per_min, "tokens_per_min": k.tokens_per_min,
            "priority": k.priority}


def key_from_doc(k: Mapping[str, Any]) -> ApiKey:
    """The fields after `role` are optional: an older leader sends none (no scope, no limits)."""
    def number(name: str, kind: type) -> Any:
        value = k.get(name)
        return None if value is None else kind(value)

    return ApiKey(str(k["hash"]), str(k.get("name", "")), str(k["role"]), 0.0, key_id=str(k.get("id", "")),
                  models=tuple(str(m) for m in k.get("models") or ()), expires_at=number("expires_at", float),
                  requests_per_min=number("requests_per_min", int), tokens_per_min=number("tokens_per_min", int),
                  priority=_priority(k.get("priority")))


def _priority(value: Any) -> str:
    """A key's class as the leader sent it; absent (an older leader) or unknown here (a newer one's): default."""
    return value if isinstance(value, str) and class_problem(value) is None else DEFAULT


def judge_failure_message(model: str, words: str) -> dict[str, Any]:
    """Gateway → leader: judge `model` failed to answer a check (down, past its budget, an answer that
    did not parse); `words` say how. The leader stamps it with its own clock when it arrives."""
    return {"type": "judge_failure", "model": model, "words": words}


def read_judge_failure(message: Mapping[str, Any]) -> tuple[str, str]:
    """(model, words) of a judge_failure message; ProtocolError when it is not one."""
    model, words = message.get("model"), message.get("words")
    if not isinstance(model, str) or not model or len(model) > 128 or not isinstance(words, str):
        raise ProtocolError("a judge_failure names a model (1-128 characters) and says what happened (words)")
    return model, words


@dataclass(frozen=True)
class GatewayTable:
    """A "table" message, read: the state a gateway answers from (keys, models, settings;
    no placements) and the routes (None: keep the current ones)."""

    version: int
    leader: str
    state: ClusterState
    routes: dict[str, ModelRoute] | None
    skipped: tuple[str, ...] = ()  # "model: why" for each model this gateway could not read


_T = TypeVar("_T", ModelDef, GuardPolicy)


def _readable(docs: Any, parse: Callable[[Any], _T], what: str, skipped: list[str]) -> dict[str, _T]:
    """Each document `parse` accepts, by name; one it refuses is named in `skipped` and left out."""
    found: dict[str, _T] = {}
    for doc in docs:
        try:
            item = parse(doc)
        except DefinitionError as e:  # (a guard policy's PolicyError too)
            skipped.append(f"{what}{doc.get('name', '?') if isinstance(doc, dict) else '?'}: {e}")
            continue
        found[item.name] = item
    return found


def read_table(message: Mapping[str, Any]) -> GatewayTable:
    """Raises `ProtocolError` for a table that cannot be read at all; a model that does not
    validate here (an older gateway) is skipped and named in `skipped`, the rest still apply."""
    try:
        skipped: list[str] = []
        models = _readable(message["models"], ModelDef.from_doc, "", skipped)
        keys = {str(k["hash"]): key_from_doc(k) for k in message["keys"]}
        # Absent: an older leader (no policies).
        policies = _readable(message.get("guard_policies") or (), GuardPolicy.from_doc, "guard policy ", skipped)
        settings = message["settings"]
        if not isinstance(settings, dict):
            raise ProtocolError("the table's settings are not an object")
        raw_routes = message["routes"]
        routes = None if raw_routes is None else {r.model: r for r in map(route_from_doc, raw_routes)}
        state = ClusterState(revision=int(message["revision"]), models=MappingProxyType(models),
                             settings=freeze(settings), keys=MappingProxyType(keys),
                             guard_policies=MappingProxyType(policies))
        return GatewayTable(int(message["version"]), str(message.get("leader", "")), state, routes, tuple(skipped))
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ProtocolError(f"unreadable table: {type(e).__name__}: {e}") from None
