"""What the simulator makes of OpenAI's richer request fields, deterministically: JSON instances of a schema
(`instance`, for `response_format` json_schema and tool arguments), which tools to call (`tool_calls`),
stop strings (`cut`), log probabilities (`token_logprobs`, `legacy_logprobs`) and text split into tokens
(`pieces`). Pure functions of the request; refusals are `OpenAIError`s."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from llmgw.errors import OpenAIError

__all__ = ["ToolCall", "cut", "instance", "legacy_logprobs", "pieces", "response_format", "stops", "token_logprobs",
           "tool_calls"]

_PIECE = re.compile(r"\s*\S+|\s+$")
_MAX_DEPTH = 8  # a recursive schema ($ref to itself) ends in nulls, empty arrays or empty objects here


def pieces(text: str) -> list[str]:
    """`text` as tokens that concatenate to it: each word with the spaces before it."""
    return _PIECE.findall(text) or ([text] if text else [])


# -- stop strings ------------------------------------------------------------------


def stops(body: dict[str, Any]) -> list[str]:
    """The request's stop strings (`stop`: a string or an array of them; empty ones mean nothing)."""
    value = body.get("stop")
    if value is None:
        return []
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise OpenAIError(400, "invalid_type", "'stop' must be a string or an array of strings", param="stop")
    return [s for s in items if s]


def cut(tokens: list[str], stop: list[str]) -> tuple[list[str], str] | None:
    """The tokens before the first stop string in their text (the last one cut short) and that stop string,
    or None when the text has none of them. The stop string itself is not kept, as OpenAI's answers do not
    keep it; vLLM names it in the choice's `stop_reason` (what /v1/messages reads for `stop_sequence`)."""
    if not stop:
        return None
    text = "".join(tokens)
    found = [(i, s) for s in stop if (i := text.find(s)) >= 0]
    if not found:
        return None
    at, which = min(found)
    kept: list[str] = []
    size = 0
    for token in tokens:
        if size + len(token) > at:
            if at > size:
                kept.append(token[: at - size])
            break
        kept.append(token)
        size += len(token)
    return kept, which


# -- JSON instances of a schema ------------------------------------------------------


def _digest(*parts: str) -> int:
    return int.from_bytes(hashlib.blake2b("\x1f".join(parts).encode("utf-8", "surrogatepass"),
                                          digest_size=4).digest(), "big")


def instance(schema: Any, seed: str = "") -> Any:
    """A deterministic JSON value valid against `schema` (object, array, string, number, integer, boolean,
    null, enum, const, required, anyOf/oneOf/allOf, local `$ref`s, and the usual bounds); `seed` varies the
    values (the same seed, the same value)."""
    root = schema if isinstance(schema, dict) else {}
    return _instance(root, root, seed, 0)


def _resolve(root: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    seen = 0
    while isinstance(node.get("$ref"), str) and node["$ref"].startswith("#") and seen < _MAX_DEPTH:
        target: Any = root
        for part in node["$ref"][1:].strip("/").split("/"):
            if not part:
                continue
            target = target.get(part.replace("~1", "/").replace("~0", "~"), {}) if isinstance(target, dict) else {}
        extra = {k: v for k, v in node.items() if k != "$ref"}
        node = {**(target if isinstance(target, dict) else {}), **extra}
        seen += 1
    return node


def _instance(root: dict[str, Any], node: Any, seed: str, depth: int) -> Any:
    if not isinstance(node, dict):
        return None  # `true` (anything), or a schema the sim does not read: null is valid against `true`
    node = _resolve(root, node)
    if "const" in node:
        return node["const"]
    if isinstance(node.get("enum"), list) and node["enum"]:
        return node["enum"][_digest(seed, "enum") % len(node["enum"])]
    for key in ("anyOf", "oneOf"):
        options = node.get(key)
        if isinstance(options, list) and options:
            # The first that is not null: an Optional[...] field gets a value.
            choice = next((o for o in options if not (isinstance(o, dict) and o.get("type") == "null")), options[0])
            return _instance(root, choice, seed, depth + 1)
    if isinstance(node.get("allOf"), list):
        merged: dict[str, Any] = {}
        for part in node["allOf"]:
            part = _resolve(root, part) if isinstance(part, dict) else {}
            merged = {**merged, **part, "properties": {**merged.get("properties", {}), **part.get("properties", {})},
                      "required": [*merged.get("required", []), *part.get("required", [])]}
        rest = {k: v for k, v in node.items() if k != "allOf"}
        return _instance(root, {**merged, **rest}, seed, depth + 1)
    kind = node.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in node else "array" if "items" in node else "string"
    if depth >= _MAX_DEPTH:
        return {"object": {}, "array": [], "string": "", "integer": 0, "number": 0, "boolean": False}.get(kind)
    if kind == "object":
        properties = node.get("properties") if isinstance(node.get("properties"), dict) else {}
        required = node.get("required") if isinstance(node.get("required"), list) else list(properties)
        # Every property: a schema in OpenAI's strict mode lists them all as required anyway.
        names = list(properties) + [r for r in required if isinstance(r, str) and r not in properties]
        return {name: _instance(root, properties.get(name, {"type": "string"}), f"{seed}.{name}", depth + 1)
                for name in names}
    if kind == "array":
        low = node.get("minItems", 1) if isinstance(node.get("minItems"), int) else 1
        high = node.get("maxItems") if isinstance(node.get("maxItems"), int) else max(low, 2)
        count = max(low, min(high, 1 + _digest(seed, "n") % 2))
        items = node.get("items", {"type": "string"})
        if isinstance(node.get("prefixItems"), list):
            prefix = node["prefixItems"]
            return [_instance(root, prefix[i] if i < len(prefix) else items, f"{seed}[{i}]", depth + 1)
                    for i in range(max(count, len(prefix)))]
        return [_instance(root, items, f"{seed}[{i}]", depth + 1) for i in range(count)]
    if kind == "string":
        word = f"sim-{_digest(seed, 's') % 1000}"
        low = node.get("minLength", 0) if isinstance(node.get("minLength"), int) else 0
        high = node.get("maxLength") if isinstance(node.get("maxLength"), int) else None
        word = word.ljust(low, "x")
        return word[:high] if high is not None else word
    if kind in ("integer", "number"):
        low = node.get("minimum", node.get("exclusiveMinimum"))
        high = node.get("maximum", node.get("exclusiveMaximum"))
        low = int(low) + (1 if "exclusiveMinimum" in node and "minimum" not in node else 0) if isinstance(
            low, (int, float)) else 0
        value = low + _digest(seed, "i") % 100
        if isinstance(high, (int, float)):
            top = int(high) - (1 if "exclusiveMaximum" in node and "maximum" not in node else 0)
            value = min(value, top) if top >= low else low
        return value
    if kind == "boolean":
        return bool(_digest(seed, "b") % 2)
    return None


# -- response_format -------------------------------------------------------------------


def response_format(body: dict[str, Any]) -> tuple[str, Any]:
    """("text", None), ("json_object", None) or ("json_schema", schema) from `response_format`."""
    value = body.get("response_format")
    if value is None:
        return "text", None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind in ("text", "json_object"):
        return kind, None
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise OpenAIError(400, "invalid_value", "'response_format.json_schema' must be an object with a name",
                              param="response_format.json_schema")
        return kind, spec.get("schema", {})
    raise OpenAIError(400, "invalid_value", "'response_format.type' must be text, json_object or json_schema",
                      param="response_format.type")


def json_answer(kind: str, schema: Any, text: str) -> str:
    """The answer's text as JSON: an object holding the sim's reply, or an instance of the schema."""
    if kind == "json_object":
        return json.dumps({"sim": text})
    return json.dumps(instance(schema, text))


# -- tools ------------------------------------------------------------------------------


class ToolCall:
    """One call the answer makes: a function's name and its arguments (JSON text)."""

    __slots__ = ("name", "arguments")

    def __init__(self, name: str, arguments: str) -> None:
        self.name, self.arguments = name, arguments


def _functions(body: dict[str, Any]) -> list[dict[str, Any]]:
    tools = body.get("tools") or []
    found = []
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not (isinstance(tool, dict) and tool.get("type") == "function" and isinstance(function, dict)
                and isinstance(function.get("name"), str)):
            where = f"tools[{i}]"
            raise OpenAIError(400, "invalid_value", f"'{where}' must be a function tool with a name", param=where)
        found.append(function)
    return found


def tool_calls(body: dict[str, Any], text: str) -> list[ToolCall]:
    """The calls the answer makes: the named function (`tool_choice` naming one), the first tool
    (`required`), or with `auto` each tool whose name the last user message says (only the first with
    `parallel_tool_calls: false`); none with `none` or no tools."""
    functions = _functions(body)
    choice = body.get("tool_choice", "auto")
    if not functions or choice == "none":
        return []
    if isinstance(choice, dict):
        wanted = (choice.get("function") or {}).get("name") if isinstance(choice.get("function"), dict) else None
        chosen = [f for f in functions if f["name"] == wanted]
        if not chosen:
            raise OpenAIError(400, "invalid_value", f"tool_choice names {wanted!r}, which is not among the tools",
                              param="tool_choice")
    elif choice == "required":
        named = [f for f in functions if re.search(rf"(?<!\w){re.escape(f['name'])}(?!\w)", text)]
        chosen = named or functions[:1]
    elif choice == "auto":
        chosen = [f for f in functions if re.search(rf"(?<!\w){re.escape(f['name'])}(?!\w)", text)]
    else:
        raise OpenAIError(400, "invalid_value", "'tool_choice' must be none, auto, required or name a function",
                          param="tool_choice")
    if body.get("parallel_tool_calls") is False:
        chosen = chosen[:1]
    return [ToolCall(f["name"], json.dumps(instance(f.get("parameters", {"type": "object"}), f"{f['name']}:{text}")))
            for f in chosen]


# -- log probabilities ---------------------------------------------------------------------


def _logprob(token: str, position: int, rank: int) -> float:
    """The chosen token's (rank 0) log probability, then its alternatives', each lower than the one before."""
    base = -((_digest(token, str(position)) % 2000) / 1000.0) - 0.001
    return round(base - rank * 0.5, 6)


def _alternative(token: str, rank: int) -> str:
    return f"{token.strip() or '_'}~{rank}"


def token_logprobs(tokens: list[str], start: int, top: int) -> list[dict[str, Any]]:
    """Chat's `logprobs.content` entries of `tokens` (at positions from `start`), each with `top` alternatives
    (the chosen token first among them, as OpenAI lists it)."""
    entries = []
    for i, token in enumerate(tokens, start):
        alternatives = [token] + [_alternative(token, r) for r in range(1, top)]
        entries.append({
            "token": token, "logprob": _logprob(token, i, 0), "bytes": list(token.encode()),
            "top_logprobs": [{"token": t, "logprob": _logprob(token, i, r), "bytes": list(t.encode())}
                             for r, t in enumerate(alternatives[:top])],
        })
    return entries


def legacy_logprobs(tokens: list[str], start: int, offset: int, top: int) -> dict[str, Any]:
    """The legacy completions' `logprobs` object of `tokens`: tokens, token_logprobs, top_logprobs (`top`
    entries each), text_offset from `offset`."""
    offsets = []
    for token in tokens:
        offsets.append(offset)
        offset += len(token)
    return {
        "tokens": list(tokens),
        "token_logprobs": [_logprob(t, i, 0) for i, t in enumerate(tokens, start)],
        "top_logprobs": [{alt: _logprob(t, i, r) for r, alt in enumerate([t] + [_alternative(t, r)
                                                                               for r in range(1, top)]) if r < top}
                         for i, t in enumerate(tokens, start)],
        "text_offset": offsets,
    }
