"""What a judge reads: the conversation a `/v1` request carries (chat messages as `User`/`Agent` turns; a
completion's prompt as one User turn; a rerank's query and documents, a tokenize's prompt or messages, as a
prompt) and the answer's text, from a whole body or from a held stream's events.

Pure functions of already-checked request bodies (`gateway/checks.py`) and of engines' answers, which may
be anything: an answer that is not JSON gives the text it can, never an exception.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from llmgw.guard.prompt import AGENT, USER, Turn

__all__ = ["PROMPT_ONLY", "UNJUDGED", "answer_text", "conversation", "stream_text"]

# Requests whose answer no model wrote (scores, token ids): their prompt is judged, their answer is not.
PROMPT_ONLY = frozenset({"rerank", "tokenize", "detokenize"})
# Requests with no text to judge: a detokenize's token ids (its answer is the text those ids already are).
UNJUDGED = frozenset({"detokenize"})


def _content(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # parts: only text parts carry words a judge can read
        return "\n".join(p["text"] for p in content
                         if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str))
    return ""


def _calls(calls: Any) -> str:
    """Tool calls' arguments: a model's answer may say in them what it would not say in its text."""
    if not isinstance(calls, list):
        return ""
    out = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict) and isinstance(function.get("arguments"), str):
            out.append(f"{function.get('name', '')}({function['arguments']})")
    return "\n".join(out)


def conversation(kind: str, body: Mapping[str, Any]) -> list[Turn]:
    """The request's turns: an assistant's messages are the Agent's, every other role's the User's
    (system and tool messages reach the model as much as the user's). `kind`: "chat", "completion", "rerank"
    (the query, then each document: one User turn) or "tokenize" (its prompt, or its messages as a chat's)."""
    if kind == "rerank":
        docs = [d if isinstance(d, str) else d.get("text") if isinstance(d, dict) else None
                for d in body.get("documents") or ()]
        query = body.get("query")
        return [(USER, "\n\n".join(t for t in (query, *docs) if isinstance(t, str)))]
    if kind == "tokenize" and body.get("messages") is None:
        kind = "completion"  # its prompt, as a completion's
    elif kind == "tokenize":
        kind = "chat"
    if kind != "chat":
        prompt = body.get("prompt")
        texts = [prompt] if isinstance(prompt, str) else [p for p in prompt or () if isinstance(p, str)]
        return [(USER, "\n".join(texts))]
    turns: list[Turn] = []
    for message in body.get("messages") or ():
        if not isinstance(message, dict):
            continue
        agent = message.get("role") == "assistant"
        text = _content(message.get("content"))
        if agent and (calls := _calls(message.get("tool_calls"))):
            text = f"{text}\n{calls}" if text else calls
        turns.append((AGENT if agent else USER, text))
    return turns or [(USER, "")]


def _choice_text(choice: Mapping[str, Any]) -> str:
    if "message" in choice and isinstance(choice["message"], dict):
        message = choice["message"]
        parts = [_content(message.get("content")), _calls(message.get("tool_calls"))]
        return "\n".join(p for p in parts if p)
    text = choice.get("text")
    return text if isinstance(text, str) else ""


def answer_text(body: bytes) -> str:
    """The text of a whole answer (every choice, one after the other)."""
    try:
        doc = json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace")  # not JSON: judge what came
    choices = doc.get("choices") if isinstance(doc, dict) else None
    if not isinstance(choices, list):
        return ""
    return "\n\n".join(t for c in choices if isinstance(c, dict) and (t := _choice_text(c)))


def stream_text(events: bytes) -> str:
    """The text of a streamed answer from its server-sent events: each choice's deltas put together."""
    per_choice: dict[int, list[str]] = {}
    for line in events.split(b"\n"):
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            continue
        try:
            doc = json.loads(data)
        except ValueError:
            continue
        choices = doc.get("choices") if isinstance(doc, dict) else None
        for choice in choices if isinstance(choices, list) else ():
            if not isinstance(choice, dict):
                continue
            index = choice["index"] if isinstance(choice.get("index"), int) else 0
            delta = choice.get("delta")
            if isinstance(delta, dict):
                piece = _content(delta.get("content"))
                for call in delta.get("tool_calls") or ():
                    function = call.get("function") if isinstance(call, dict) else None
                    if isinstance(function, dict) and isinstance(function.get("arguments"), str):
                        piece += function["arguments"]
            else:
                text = choice.get("text")
                piece = text if isinstance(text, str) else ""
            per_choice.setdefault(index, []).append(piece)
    return "\n\n".join(t for _, parts in sorted(per_choice.items()) if (t := "".join(parts)))
