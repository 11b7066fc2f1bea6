"""Engine answers completed to OpenAI's published schemas (llmgw/gateway/normalise.py): whatever required
fields an engine leaves out, the answer validates against the pinned schemas; no value the engine gave
changes; an answer that lacks nothing is relayed byte for byte, and the byte-level check never lets one
through that lacks something."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmgw.gateway.normalise import Fill, StreamNormaliser, complete, normalise, normalise_body
from llmgw.wire.asgi import dumps
from tests.support.openai_spec import chunk_errors, errors

FILL = Fill("served-model", "req-1")
SCHEMA = {("chat", False): "CreateChatCompletionResponse", ("chat", True): "CreateChatCompletionStreamResponse",
          ("completion", False): "CreateCompletionResponse", ("completion", True): "CreateCompletionResponse",
          ("embedding", False): "CreateEmbeddingResponse"}


def check(kind: str, chunk: bool, doc: Any) -> list[str]:
    name = SCHEMA[kind, chunk]
    return chunk_errors(name, doc) if chunk else errors(name, doc)


# llama.cpp's answers as it sends them (b0-unknown, xllamacpp): no `logprobs` or `refusal`.
LLAMA_CHAT = (b'{"choices":[{"finish_reason":"length","index":0,"message":{"role":"assistant","content":"za ao"}}],'
              b'"created":1796576594,"model":"tiny","system_fingerprint":"b0-unknown","object":"chat.completion",'
              b'"usage":{"completion_tokens":4,"prompt_tokens":24,"total_tokens":28,"prompt_tokens_details":'
              b'{"cached_tokens":0}},"id":"chatcmpl-EJg3","timings":{"cache_n":0,"prompt_n":24}}')
LLAMA_LOGPROB_CHUNK = (b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":"z"},"logprobs":'
                       b'{"content":[{"id":349,"token":"z","bytes":[122],"logprob":-5.78,"top_logprobs":[{"id":349,'
                       b'"token":"z","bytes":[122],"logprob":-5.78}]}]}}],"created":1796576594,"id":"chatcmpl-d78",'
                       b'"model":"tiny","system_fingerprint":"b0-unknown","object":"chat.completion.chunk"}\n\n')


def test_llama_cpp_chat_gets_logprobs_and_refusal_and_keeps_the_rest() -> None:
    assert errors("CreateChatCompletionResponse", json.loads(LLAMA_CHAT))  # as it came: invalid
    out = json.loads(normalise_body("chat", LLAMA_CHAT, FILL))
    assert errors("CreateChatCompletionResponse", out) == []
    assert out["choices"][0]["logprobs"] is None and out["choices"][0]["message"]["refusal"] is None
    assert out["timings"] == {"cache_n": 0, "prompt_n": 24} and out["id"] == "chatcmpl-EJg3"


def test_llama_cpp_logprob_chunks_get_their_refusal_whichever_way_the_stream_is_cut() -> None:
    stream = LLAMA_LOGPROB_CHUNK * 3 + b"data: [DONE]\n\n"
    for size in (1, 5, 100, len(stream)):
        normaliser = StreamNormaliser("chat", FILL)
        out = b"".join(normaliser.feed(stream[i : i + size]) for i in range(0, len(stream), size)) + normaliser.flush()
        events = out.split(b"\n\n")
        assert events[-2:] == [b"data: [DONE]", b""] and len(events) == 5
        for event in events[:3]:
            doc = json.loads(event.removeprefix(b"data: "))
            assert check("chat", True, doc) == []
            assert doc["choices"][0]["logprobs"]["refusal"] is None


def sim_like(kind: str) -> bytes:
    docs = {"chat": {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m", "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "hi {} there", "refusal": None},
                 "logprobs": None, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}},
            "completion": {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m", "choices": [
                {"text": "hi", "index": 0, "logprobs": None, "finish_reason": "stop"}]},
            "embedding": {"object": "list", "model": "m", "data": [
                {"object": "embedding", "index": i, "embedding": [0.5, -1.25]} for i in range(3)],
                "usage": {"prompt_tokens": 4, "total_tokens": 4}}}
    return dumps(docs[kind])


@pytest.mark.parametrize("kind", ["chat", "completion", "embedding"])
def test_an_answer_that_lacks_nothing_passes_as_it_came(kind: str) -> None:
    body = sim_like(kind)
    assert normalise_body(kind, body, FILL) is body
    spaced = json.dumps(json.loads(body)).encode()  # `": "`: never vouched for by its bytes; parsed, the same
    # (an embeddings answer's keys are read parsed, whatever its spacing: less its vectors when compact)
    assert (kind == "embedding" or not complete(kind, spaced)) and normalise_body(kind, spaced, FILL) is spaced


def test_embeddings_are_vouched_for_by_their_bytes_less_the_vectors() -> None:
    body = sim_like("embedding")
    assert complete("embedding", body)
    doc = json.loads(body)
    doc["data"][1]["embedding"] = base64.b64encode(b"\0" * 8).decode()
    assert complete("embedding", dumps(doc))
    del doc["data"][2]["index"]
    assert not complete("embedding", dumps(doc))


def test_what_is_not_a_json_object_passes_unchanged() -> None:
    for body in (b"", b"[1]", b"not json", b'{"choices": ['):
        assert normalise_body("chat", body, FILL) == body
    normaliser = StreamNormaliser("chat", FILL)
    events = b'data: {"error":{"message":"x","type":"server_error","param":null,"code":null}}\n\ndata: [DONE]\n\n'
    assert normaliser.feed(events) == events


def test_the_gateway_fills_id_created_and_model_the_same_for_every_chunk() -> None:
    normaliser = StreamNormaliser("completion", Fill("served", "abc"))
    out = normaliser.feed(b'data: {"choices":[{"text":"a"}]}\n\ndata: {"choices":[{"text":"b"}]}\n\n')
    first, second = (json.loads(e.removeprefix(b"data: ")) for e in out.split(b"\n\n")[:2])
    assert first["id"] == second["id"] == "cmpl-abc" and first["created"] == second["created"]
    assert first["model"] == "served" and first["object"] == "text_completion"
    assert first["choices"][0] == {"text": "a", "index": 0, "logprobs": None, "finish_reason": None}


def test_llama_cpp_completion_logprobs_get_openais_completion_shape_beside_their_own() -> None:
    tops = [{"id": 253, "token": " on", "logprob": -5.7}, {"token": "x", "logprob": -6.0}]
    own = {"content": [{"id": 253, "token": " on", "bytes": [32, 111, 110], "logprob": -5.7, "top_logprobs": tops},
                       {"token": "p", "logprob": -5.1, "top_logprobs": []}]}
    doc = {"id": "c", "object": "text_completion", "created": 1, "model": "m",
           "choices": [{"text": " onp", "index": 0, "logprobs": copy.deepcopy(own), "finish_reason": "length"}]}
    logprobs = normalise("completion", doc, FILL)["choices"][0]["logprobs"]
    assert logprobs == {**own, "tokens": [" on", "p"], "token_logprobs": [-5.7, -5.1],
                        "top_logprobs": [{" on": -5.7, "x": -6.0}, {}]}
    assert errors("CreateCompletionResponse", doc) == []


def test_usage_is_filled_from_what_it_tells() -> None:
    doc = normalise("chat", {"choices": [], "usage": {"prompt_tokens": 3, "total_tokens": 10}}, FILL)
    assert doc["usage"] == {"prompt_tokens": 3, "total_tokens": 10, "completion_tokens": 7}
    doc = normalise("embedding", {"data": [], "usage": {"total_tokens": 5}}, FILL)
    assert doc["usage"] == {"total_tokens": 5, "prompt_tokens": 5}
    assert normalise("embedding", {"data": []}, FILL)["usage"] == {"prompt_tokens": 0, "total_tokens": 0}


def test_a_null_where_the_schema_takes_none_is_left_out() -> None:
    doc = {"id": "x", "object": "chat.completion", "created": 1, "model": "m", "system_fingerprint": None,
           "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None, "message": {
               "role": "assistant", "content": "a", "refusal": None, "annotations": None, "function_call": None,
               "tool_calls": None}}]}
    assert errors("CreateChatCompletionResponse", doc)
    out = normalise("chat", copy.deepcopy(doc), FILL)
    assert errors("CreateChatCompletionResponse", out) == [] and "system_fingerprint" not in out
    assert out["choices"][0]["message"] == {"role": "assistant", "content": "a", "refusal": None}


# --- properties: random engine answers, missing random required fields, with extra ones --------------------

TEXT = st.one_of(st.text(max_size=12), st.sampled_from(['{"refusal":null}', '"index":', "{}", '\\"id\\":', "usage"]))
INT = st.integers(min_value=0, max_value=10_000)
EXTRA_KEYS = ("timings", "stop_reason", "x_engine", "cache_n")  # names no answer schema uses
EXTRA_VALUE = st.one_of(st.none(), INT, TEXT, st.dictionaries(st.sampled_from(("cache_n", "prompt_ms")), INT))


def token_logprobs() -> st.SearchStrategy[list[dict[str, Any]]]:
    top = st.builds(lambda t, lp, b: {"token": t, "logprob": lp, "bytes": b}, TEXT, st.floats(-20, 0),
                    st.one_of(st.none(), st.lists(st.integers(0, 255), max_size=3)))
    return st.lists(st.builds(lambda e, tops: {**e, "top_logprobs": tops}, top, st.lists(top, max_size=2)),
                    max_size=2)


def usage(embedding: bool = False) -> st.SearchStrategy[dict[str, int]]:
    if embedding:
        return st.builds(lambda p: {"prompt_tokens": p, "total_tokens": p}, INT)
    return st.builds(lambda p, c: {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}, INT, INT)


def top(obj: str, choice: st.SearchStrategy[dict[str, Any]], use: bool = True) -> st.SearchStrategy[dict[str, Any]]:
    def build(id_: str, created: int, model: str, choices: list[dict[str, Any]], used: dict[str, int] | None,
              fingerprint: str | None) -> dict[str, Any]:
        doc = {"id": id_, "object": obj, "created": created, "model": model, "choices": choices}
        if used is not None:
            doc["usage"] = used
        if fingerprint is not None:
            doc["system_fingerprint"] = fingerprint
        return doc

    return st.builds(build, TEXT, INT, TEXT, st.lists(choice, max_size=3),
                     st.one_of(st.none(), usage()) if use else st.none(), st.one_of(st.none(), TEXT))


FINISH = st.sampled_from(["stop", "length", "tool_calls", "content_filter"])
ENTRIES = st.one_of(st.none(), token_logprobs())
LOGPROBS = st.one_of(st.none(), st.builds(lambda c, r: {"content": c, "refusal": r}, ENTRIES, ENTRIES))
TOOL_CALL = st.builds(lambda i, n, a: {"id": i, "type": "function", "function": {"name": n, "arguments": a}},
                      TEXT, TEXT, TEXT)
MESSAGE = st.builds(lambda c, r, t: {"role": "assistant", "content": c, "refusal": r,
                                     **({"tool_calls": t} if t else {})},
                    st.one_of(st.none(), TEXT), st.one_of(st.none(), TEXT), st.lists(TOOL_CALL, max_size=2))
CHAT = top("chat.completion", st.builds(lambda m, lp, f: {"message": m, "logprobs": lp, "finish_reason": f},
                                        MESSAGE, LOGPROBS, FINISH))
DELTA = st.builds(lambda c, t: {**({"content": c} if c is not None else {}), **({"tool_calls": t} if t else {})},
                  st.one_of(st.none(), TEXT),
                  st.lists(st.builds(lambda a: {"function": {"arguments": a}}, TEXT), max_size=2))
CHUNK = top("chat.completion.chunk", st.builds(lambda d, lp, f: {"delta": d, "logprobs": lp, "finish_reason": f},
                                               DELTA, LOGPROBS, st.one_of(st.none(), FINISH)))
# llama.cpp gives a completion's logprobs in the chat shape; OpenAI's completion shape is added beside.
OWN_LOGPROBS = st.one_of(st.none(), st.builds(lambda c: {"content": c}, token_logprobs()))
COMPLETION = top("text_completion", st.builds(lambda t, lp, f: {"text": t, "logprobs": lp, "finish_reason": f},
                                              TEXT, OWN_LOGPROBS, st.sampled_from(["stop", "length"])))
COMPLETION_CHUNK = top("text_completion", st.builds(lambda t, f: {"text": t, "logprobs": None, "finish_reason": f},
                                                    TEXT, st.one_of(st.none(), st.sampled_from(["stop", "length"]))))
EMBEDDING = st.builds(
    lambda model, vectors, used: {"object": "list", "model": model, "usage": used, "data": [
        {"object": "embedding", "index": 0, "embedding": v} for v in vectors]},
    TEXT, st.lists(st.lists(st.floats(-1, 1), max_size=4), max_size=3), usage(embedding=True))
ANSWERS = {("chat", False): CHAT, ("chat", True): CHUNK, ("completion", False): COMPLETION,
           ("completion", True): COMPLETION_CHUNK, ("embedding", False): EMBEDDING}

# The required keys the gateway fills, by the object they are in (what an engine may leave out).
FILLED = {"top": ("id", "object", "created", "model", "choices", "data", "usage"),
          "choice": ("index", "finish_reason", "message", "logprobs", "delta", "text"),
          "message": ("role", "content", "refusal"), "logprobs": ("content", "refusal"),
          "entry": ("bytes", "top_logprobs"), "call": ("id", "type", "index"), "usage": ("prompt_tokens",
          "completion_tokens", "total_tokens"), "item": ("index", "object", "embedding")}


def holes(kind: str, doc: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
    """Every (object, key) the engine could have left out."""
    found = [(doc, k) for k in FILLED["top"] if k in doc and not (kind == "embedding" and k == "usage")]
    if isinstance(doc.get("usage"), dict):
        found += [(doc["usage"], k) for k in FILLED["usage"] if k in doc["usage"]]
    for item in doc.get("data", ()):
        found += [(item, k) for k in FILLED["item"]]
    for choice in doc.get("choices", ()):
        found += [(choice, k) for k in FILLED["choice"] if k in choice]
        body = choice.get("message", choice.get("delta"))
        if "message" in choice:
            found += [(body, k) for k in FILLED["message"]]
        for call in body.get("tool_calls", ()) if isinstance(body, dict) else ():
            found += [(call, k) for k in FILLED["call"] if k in call]
            found += [(call["function"], "arguments")] if "message" in choice else []
        if isinstance(choice.get("logprobs"), dict):
            found += [(choice["logprobs"], k) for k in FILLED["logprobs"]]
            for entries in choice["logprobs"].values():
                for entry in entries or ():
                    found += [(entry, k) for k in FILLED["entry"]]
                    found += [(t, "bytes") for t in entry["top_logprobs"]]
    return found


def objects(doc: Any) -> list[dict[str, Any]]:
    if isinstance(doc, dict):
        return [doc, *(o for v in doc.values() for o in objects(v))]
    if isinstance(doc, list):
        return [o for v in doc for o in objects(v)]
    return []


@st.composite
def engine_answers(draw: st.DrawFn, kind: str, chunk: bool) -> dict[str, Any]:
    """A valid answer, less a random subset of its required fields, plus extra ones an engine may add."""
    doc: dict[str, Any] = draw(ANSWERS[kind, chunk])
    found = holes(kind, doc)
    for i in sorted(draw(st.sets(st.integers(0, max(len(found) - 1, 0)))), reverse=True):
        if i < len(found):
            obj, key = found[i]
            obj.pop(key, None)
    for obj in objects(doc):
        if draw(st.booleans()) and not ("embedding" in obj and obj.get("object") == "embedding"):
            obj[draw(st.sampled_from(EXTRA_KEYS))] = draw(EXTRA_VALUE)
    return doc


def leaves(doc: Any, path: tuple[Any, ...] = ()) -> dict[tuple[Any, ...], Any]:
    if isinstance(doc, dict) and doc:
        return {p: v for k, v in doc.items() for p, v in leaves(v, (*path, k)).items()}
    if isinstance(doc, list) and doc:
        return {p: v for i, v in enumerate(doc) for p, v in leaves(v, (*path, i)).items()}
    return {path: doc}


def at(doc: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        doc = doc[step]
    return doc


DROPPED_NULLS = {"system_fingerprint", "annotations", "function_call", "tool_calls", "usage"}
CASES = list(SCHEMA)


@pytest.mark.parametrize(("kind", "chunk"), CASES)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_normalised_answers_validate_and_keep_every_value(kind: str, chunk: bool, data: st.DataObject) -> None:
    doc = data.draw(engine_answers(kind, chunk))
    given_ = leaves(copy.deepcopy(doc))
    out = normalise(kind, copy.deepcopy(doc), FILL, chunk=chunk)
    assert check(kind, chunk, out) == []
    for path, value in given_.items():
        if value is None and path[-1] in DROPPED_NULLS and (kind != "chat" or not chunk or path[-1] != "usage"):
            continue  # a null the schema takes none for: left out
        kept = at(out, path)
        assert (type(kept) is type(value)) if value in ({}, []) else kept == value, path  # {} may gain keys
    # The byte-level check never passes an answer that lacks something; whatever it passes is relayed as is.
    body = dumps(doc)
    if complete(kind, body, chunk=chunk):
        assert check(kind, chunk, doc) == []
    if not chunk:  # an answer that lacks nothing (and has no null to leave out) comes out as it came
        same = out == doc
        assert (normalise_body(kind, body, FILL) is body) == same


@pytest.mark.parametrize("kind", ["chat", "completion"])
@settings(max_examples=100, deadline=None)
@given(data=st.data(), cut=st.one_of(st.integers(1, 64), st.integers(65, 4096)))
def test_a_stream_comes_out_whole_and_valid_however_it_was_cut(kind: str, data: st.DataObject, cut: int) -> None:
    """Cut anywhere, or read several events at once (checked together: `StreamNormaliser.feed`)."""
    answers = data.draw(st.lists(engine_answers(kind, True), min_size=1, max_size=4))
    stream = b"".join(b"data: " + dumps(a) + b"\n\n" for a in answers) + b"data: [DONE]\n\n"
    normaliser = StreamNormaliser(kind, FILL)
    out = b"".join(normaliser.feed(stream[i : i + cut]) for i in range(0, len(stream), cut)) + normaliser.flush()
    events = out.split(b"\n\n")
    assert events[-2:] == [b"data: [DONE]", b""] and len(events) == len(answers) + 2
    for event, answer in zip(events, answers, strict=False):
        doc = json.loads(event.removeprefix(b"data: "))
        assert check(kind, True, doc) == []
        assert doc == normalise(kind, copy.deepcopy(answer), FILL, chunk=True)


@pytest.mark.parametrize("lacks", ["id", "object", "created", "model", "choices"])
def test_events_read_together_are_checked_together_and_each_completed(lacks: str) -> None:
    """Several events in one read are checked at once (one count of each key for all of them): a key that one
    chunk lacks and the others have is still found missing, and only that chunk is written again."""
    whole = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
             "choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": None}]}
    short = {k: v for k, v in whole.items() if k != lacks}
    events = [b"data: " + dumps(doc) + b"\n\n" for doc in (whole, short, whole)]
    read = b"".join(events) + b"data: [DONE]\n\n"
    out = StreamNormaliser("chat", Fill("m", "r1")).feed(read)
    first, second, third, done, _ = out.split(b"\n\n")
    assert (first + b"\n\n", third + b"\n\n", done) == (events[0], events[2], b"data: [DONE]")  # as they came
    assert check("chat", True, json.loads(second.removeprefix(b"data: "))) == []
    # The last chunk's empty delta (OpenAI's, vLLM's) hides no key from the counts: nothing to add, all as is.
    last = {**whole, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    complete_read = events[0] * 2 + b"data: " + dumps(last) + b"\n\ndata: [DONE]\n\n"
    assert StreamNormaliser("chat", Fill("m", "r1")).feed(complete_read) is complete_read
    assert complete("chat", b"data: " + dumps(last), chunk=True)
    assert not complete("chat", b"data: " + dumps({**last, "x_engine": {}}), chunk=True)  # another {}: parsed


def test_a_chunk_whose_choice_lacks_its_index_is_parsed_and_completed() -> None:
    """Found by the property above: the byte check counted choices by their `"index"` keys, so a choice that had
    none (and none of the other counted keys) passed as complete."""
    chunk = {"id": "", "object": "chat.completion.chunk", "created": 0, "model": "", "choices": [{"logprobs": None}]}
    assert not complete("chat", dumps(chunk), chunk=True)
    assert check("chat", True, normalise("chat", copy.deepcopy(chunk), FILL, chunk=True)) == []


def test_an_embeddings_answer_whose_extra_field_holds_a_missing_key_is_completed() -> None:
    """Found by the property above in a full run: the byte check counted `"object":` keys, and an engine's extra
    field holding a dict with one stood in for the missing top-level `object`."""
    doc = {"model": "m", "usage": {"prompt_tokens": 1, "total_tokens": 1}, "extra": {"object": "x"},
           "data": [{"object": "embedding", "index": 0, "embedding": [0.5]}]}
    body = dumps(doc)
    assert not complete("embedding", body)
    out = json.loads(normalise_body("embedding", body, FILL))
    assert out["object"] == "list" and check("embedding", False, out) == []

