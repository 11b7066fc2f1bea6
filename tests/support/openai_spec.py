"""A pinned part of OpenAI's published OpenAPI document (github.com/openai/openai-openapi, MIT), and answers
checked against its schemas.

`tests/fixtures/openai/schemas.json` holds the schemas the gateway's endpoints answer and take, with every
schema they refer to; `python -m tests.support.openai_spec FULL.json` makes it again from a newer copy of the
whole document (then read what changed: a new request field is one the gateway must take or refuse by name).
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any

import jsonschema_rs

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "openai" / "schemas.json"

# The schemas kept: each endpoint's request and answer, the stream's chunks and events, the error body.
ROOTS = (
    "CreateChatCompletionRequest", "CreateChatCompletionResponse", "CreateChatCompletionStreamResponse",
    "CreateCompletionRequest", "CreateCompletionResponse",
    "CreateEmbeddingRequest", "CreateEmbeddingResponse",
    "CreateResponse", "Response", "ResponseStreamEvent",
    "ListModelsResponse", "Model", "ErrorResponse",
)


def _refs(node: Any, into: set[str]) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                into.add(value.rsplit("/", 1)[-1])
            else:
                _refs(value, into)
    elif isinstance(node, list):
        for value in node:
            _refs(value, into)


def extract(document: dict[str, Any], roots: tuple[str, ...] = ROOTS) -> dict[str, Any]:
    """The schemas named by `roots` and every one they reach, from the whole document."""
    schemas = document["components"]["schemas"]
    kept: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in kept:
            continue
        kept.add(name)
        found: set[str] = set()
        _refs(schemas[name], found)
        todo.extend(found - kept)
    return {"info": {"title": document["info"]["title"], "version": document["info"]["version"]},
            "components": {"schemas": {name: schemas[name] for name in sorted(kept)}}}


@functools.cache
def _document() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(FIXTURE.read_text())
    return doc


def nullable(node: Any) -> Any:
    """`node` with OpenAPI 3.0's `nullable: true` said in JSON Schema's words (a JSON Schema validator ignores
    the keyword, and would refuse the nulls the document allows): null added to its type and enum, or the
    schema made one of itself and null."""
    if isinstance(node, list):
        return [nullable(v) for v in node]
    if not isinstance(node, dict):
        return node
    node = {k: nullable(v) for k, v in node.items()}
    if node.pop("nullable", False) is not True:
        return node
    if isinstance(node.get("type"), str):
        node["type"] = [node["type"], "null"]
        if isinstance(node.get("enum"), list) and None not in node["enum"]:
            node["enum"] = [*node["enum"], None]
        return node
    return {"anyOf": [node, {"type": "null"}]}


@functools.cache
def validator(name: str) -> Any:
    """A validator of one schema of the pinned document (its references resolved within it; `nullable` read)."""
    doc = nullable(_document())
    return jsonschema_rs.Draft202012Validator({"$ref": f"#/components/schemas/{name}", **doc})


def errors(name: str, instance: Any) -> list[str]:
    """What `instance` breaks of schema `name` (empty when valid), each with where."""
    return [f"{'/'.join(map(str, e.instance_path)) or '(top)'}: {e.message}"[:400]
            for e in validator(name).iter_errors(instance)]


def request_fields(name: str) -> set[str]:
    """The top-level properties of a request schema (its `allOf` parts included)."""
    schemas = _document()["components"]["schemas"]
    fields: set[str] = set()

    def walk(node: dict[str, Any]) -> None:
        if "$ref" in node:
            walk(schemas[node["$ref"].rsplit("/", 1)[-1]])
        fields.update(node.get("properties", {}))
        for part in node.get("allOf", ()):
            walk(part)

    walk(schemas[name])
    return fields


if __name__ == "__main__":
    whole = json.loads(Path(sys.argv[1]).read_text())
    FIXTURE.write_text(json.dumps(extract(whole), separators=(",", ":"), sort_keys=True) + "\n")
    print(f"wrote {FIXTURE} ({FIXTURE.stat().st_size} bytes)")
