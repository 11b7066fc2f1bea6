"""What the simulator reads from a request: the checks of each endpoint's fields, the text
it answers to, and `embed`, its deterministic embedding. Pure functions; refusals are `OpenAIError`s."""

from __future__ import annotations

import hashlib
import math
import struct
from typing import Any

from llmgw.domain.guard import CATEGORIES
from llmgw.errors import OpenAIError
from llmgw.guard import prompt as guard_prompt

DEFAULT_MAX_TOKENS = 64


def embed(text: str, dim: int) -> list[float]:
    """A deterministic unit vector of `dim` floats derived from sha256(text)."""
    seed = hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()
    raw = b"".join(hashlib.sha256(seed + block.to_bytes(4, "big")).digest() for block in range((dim + 7) // 8))
    values = [(u / 2**31) - 1.0 for u in struct.unpack(f">{dim}I", raw[: 4 * dim])]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [v / norm for v in values]


# -- request parsing ------------------------------------------------------------


def check_optional(body: dict[str, Any], name: str, kind: type[Any]) -> Any:
    value = body.get(name)
    # bool is an int in Python; a JSON true is not a count.
    if value is not None and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
        raise OpenAIError(400, "invalid_type", f"'{name}' must be of type {_json_type(kind)}", param=name)
    return value


def _json_type(kind: type[Any]) -> str:
    return {str: "string", bool: "boolean", int: "integer", dict: "object", list: "array"}.get(kind, kind.__name__)


def max_tokens(body: dict[str, Any]) -> int:
    for name in ("max_completion_tokens", "max_tokens"):
        value = check_optional(body, name, int)
        if value is not None:
            if value < 1:
                raise OpenAIError(400, "invalid_value", f"'{name}' must be at least 1", param=name)
            return int(value)
    return DEFAULT_MAX_TOKENS


def check_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if messages is None:
        raise OpenAIError(400, "missing_required_parameter", "'messages' is required", param="messages")
    if not isinstance(messages, list) or not messages:
        raise OpenAIError(400, "invalid_type", "'messages' must be a non-empty array", param="messages")
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise OpenAIError(400, "invalid_type", f"'{where}' must be an object", param=where)
        if not isinstance(message.get("role"), str):
            raise OpenAIError(400, "invalid_type", f"'{where}.role' must be a string", param=f"{where}.role")
        content = message.get("content")
        if content is not None and not isinstance(content, str) and not _is_text_parts(content):
            words = f"'{where}.content' must be a string or an array of text parts"
            raise OpenAIError(400, "invalid_type", words, param=f"{where}.content")
    return messages


def _is_text_parts(content: Any) -> bool:
    return isinstance(content, list) and all(
        isinstance(part, dict) and (part.get("type") != "text" or isinstance(part.get("text"), str))
        for part in content
    )


def content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p["text"] for p in content if p.get("type") == "text")
    return ""


def focus_text(messages: list[dict[str, Any]], *, through_end: bool) -> str:
    """The last user message; with `through_end` also what follows it (a judged response)."""
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
    if last_user is None:
        return ""
    chosen = messages[last_user:] if through_end else messages[last_user : last_user + 1]
    return " ".join(content_text(m.get("content")) for m in chosen)


def judged_text(text: str) -> str:
    """What a judge reads of `text`: the last turn of the role a Llama Guard prompt asks about (the
    conversation read back), or all of it when it is not such a prompt."""
    read = guard_prompt.read(text)
    if read is None:
        return text
    role, turns = read
    return next((t for who, t in reversed(turns) if who == role), "")


def parse_unsafe(item: str) -> tuple[str, str]:
    """`WORD=CODE` of `--unsafe`: a non-empty word and a hazard code S1..S14. ValueError says what is wrong."""
    word, eq, code = item.rpartition("=")
    if not eq or not word.strip() or code not in CATEGORIES:
        raise ValueError(f"--unsafe {item!r}: give WORD=CODE with a hazard code S1..S14, e.g. --unsafe bomb=S9")
    return word.strip(), code


def check_prompt(body: dict[str, Any]) -> list[str]:
    """A completion's `prompt`: its texts."""
    return _texts(body, "prompt")


def check_input(body: dict[str, Any]) -> list[str]:
    """An embedding request's `input`: its texts."""
    return _texts(body, "input")


def _texts(body: dict[str, Any], param: str) -> list[str]:
    """`body[param]` as a list of texts: a string, a non-empty array of strings, of token ids or of arrays of
    token ids (the spec's four forms; ids read as their numbers' words, one word a token); a 400 in OpenAI's
    words if not."""
    value = body.get(param)
    if value is None:
        raise OpenAIError(400, "missing_required_parameter", f"'{param}' is required", param=param)
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value:
        if all(isinstance(v, str) for v in value):
            return value
        if _ids(value):
            return [" ".join(map(str, value))]
        if all(isinstance(v, list) and v and _ids(v) for v in value):
            return [" ".join(map(str, v)) for v in value]
    message = (f"'{param}' must be a string, a non-empty array of strings, an array of token ids or an array of "
               f"non-empty arrays of token ids")
    raise OpenAIError(400, "invalid_type", message, param=param)


def _ids(value: list[Any]) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)


def count_words(text: str) -> int:
    return len(text.split())


# -- server and process ---------------------------------------------------------
