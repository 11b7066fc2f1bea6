"""What a `/v1` request must be before it reaches an engine: its path and method, its key's
place in the headers, the fields each endpoint needs, and which model roles serve it.
Pure checks; every refusal is an `OpenAIError` with the field it is about."""

from __future__ import annotations

from typing import Any

from llmgw.errors import OpenAIError

# Path -> kind of request; kind -> the model roles that may serve it.
POST_PATHS = {"/v1/chat/completions": "chat", "/v1/completions": "completion", "/v1/embeddings": "embedding"}
ROLES_FOR = {"chat": ("chat", "guard"), "completion": ("chat", "guard"), "embedding": ("embedding",)}


def allow(method: str, allowed: str) -> None:
    if method != allowed:
        words = f"method {method} is not allowed here; use {allowed}"
        raise OpenAIError(405, "method_not_allowed", words, headers=[(b"allow", allowed.encode())])


def bearer(headers: list[tuple[bytes, bytes]]) -> str | None:
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" else None
    return None


def check_request(kind: str, body: dict[str, Any]) -> tuple[str, bool]:
    """The model name and whether to stream; raises on what an engine should never see."""
    name = body.get("model")
    if name is None:
        raise OpenAIError(400, "missing_required_parameter", "'model' is required", param="model")
    if not isinstance(name, str) or not name:
        raise OpenAIError(400, "invalid_type", "'model' must be a non-empty string", param="model")
    if kind == "chat":
        messages = body.get("messages")
        if messages is None:
            raise OpenAIError(400, "missing_required_parameter", "'messages' is required", param="messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise OpenAIError(400, "invalid_type", "'messages' must be a non-empty array of objects", param="messages")
    elif kind == "completion":
        string_or_list(body, "prompt")
    else:
        string_or_list(body, "input")
    stream = body.get("stream")
    if stream is None:
        return name, False
    if not isinstance(stream, bool):
        raise OpenAIError(400, "invalid_type", "'stream' must be true or false", param="stream")
    return name, stream


def string_or_list(body: dict[str, Any], key: str) -> None:
    value = body.get(key)
    if value is None:
        raise OpenAIError(400, "missing_required_parameter", f"'{key}' is required", param=key)
    if not isinstance(value, (str, list)):
        raise OpenAIError(400, "invalid_type", f"'{key}' must be a string or an array", param=key)


def role_words(name: str, role: str, path: str) -> str:
    if role == "embedding":
        return f"model {name!r} is an embedding model; use /v1/embeddings"
    return f"model {name!r} is a {role} model and does not serve {path}"


def model_doc(name: str) -> dict[str, Any]:
    # The catalog keeps no creation time; 0 keeps the field an integer as SDKs expect.
    return {"id": name, "object": "model", "created": 0, "owned_by": "llmgw"}
