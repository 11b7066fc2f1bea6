"""The per-engine paths and bodies of `/v1/rerank`, `/v1/tokenize` and `/v1/detokenize` (gateway/engine_paths.py):
each engine's request from the client's, each engine's answer back in the gateway's one shape, refusals; by example
and as properties (Hypothesis). The simulator's side of it (engines/sim/tokens.py) at the end."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmgw.engines.sim.tokens import BOS, Vocabulary, relevance, word_id
from llmgw.errors import OpenAIError
from llmgw.gateway.engine_paths import ROUTES, answer, plan, serves

DOCS: list[Any] = ["a", {"text": "b"}, "c"]


def sent(kind: str, engine: str, body: dict[str, Any], model: str = "m") -> tuple[str, dict[str, Any]]:
    call = plan(kind, engine, model, f"/v1/{kind}", {"model": "asked", **body})
    assert call is not None
    return call.path, json.loads(call.body)


def answered(kind: str, engine: str, body: dict[str, Any], engine_doc: Any) -> dict[str, Any]:
    call = plan(kind, engine, "m", f"/v1/{kind}", {"model": "m", **body})
    assert call is not None
    out: dict[str, Any] = json.loads(answer(call, json.dumps(engine_doc).encode(), "req-1"))
    return out


def test_chat_completions_and_embeddings_pass_unchanged_on_every_engine() -> None:
    for kind in ("chat", "completion", "embedding"):
        for engine in ("sim", "llama.cpp", "vllm", "anything"):
            assert plan(kind, engine, "m", "/v1/x", {}) is None and serves(kind, engine)


def test_every_engine_serves_the_three_kinds_and_an_unknown_one_is_refused_by_name() -> None:
    assert {(e, k) for e, k in ROUTES} == {(e, k) for e in ("sim", "llama.cpp", "vllm")
                                           for k in ("rerank", "tokenize", "detokenize")}
    assert not serves("rerank", "tgi")
    with pytest.raises(OpenAIError) as caught:
        plan("rerank", "tgi", "m", "/v1/rerank", {"query": "q", "documents": ["d"]})
    assert (caught.value.status, caught.value.code, caught.value.param) == (400, "unsupported_endpoint", "model")
    assert "'m'" in caught.value.message and "tgi" in caught.value.message and "/v1/rerank" in caught.value.message


def test_rerank_requests_carry_plain_documents_and_the_served_models_name() -> None:
    for engine in ("llama.cpp", "vllm", "sim"):
        body = {"query": "q", "documents": DOCS, "top_n": 2, "return_documents": True}
        assert sent("rerank", engine, body) == ("/v1/rerank", {"model": "m", "query": "q",
                                                              "documents": ["a", "b", "c"], "top_n": 2})


def test_tokenize_requests_per_engine() -> None:
    assert sent("tokenize", "llama.cpp", {"prompt": "hi"}) == ("/tokenize", {"content": "hi", "add_special": True})
    assert sent("tokenize", "sim", {"prompt": "hi", "add_special_tokens": False}) == (
        "/tokenize", {"content": "hi", "add_special": False})
    messages = [{"role": "user", "content": "hi"}]
    assert sent("tokenize", "vllm", {"messages": messages, "prompt": None, "add_generation_prompt": False}) == (
        "/tokenize", {"model": "m", "messages": messages, "add_generation_prompt": False})
    with pytest.raises(OpenAIError) as caught:
        plan("tokenize", "llama.cpp", "m", "/v1/tokenize", {"messages": messages})
    assert (caught.value.code, caught.value.param) == ("unsupported_parameter", "messages")
    assert sent("detokenize", "llama.cpp", {"tokens": [1, 2]}) == ("/detokenize", {"tokens": [1, 2]})
    assert sent("detokenize", "vllm", {"tokens": [1, 2]}) == ("/detokenize", {"model": "m", "tokens": [1, 2]})


def test_answers_per_engine() -> None:
    llama = {"model": "x", "object": "list", "usage": {"prompt_tokens": 9, "total_tokens": 9},
             "results": [{"index": 2, "relevance_score": -1.5}, {"index": 0, "relevance_score": 3.25}]}
    assert answered("rerank", "llama.cpp", {"query": "q", "documents": DOCS, "return_documents": True}, llama) == {
        "id": "rerank-req-1", "model": "m", "usage": {"prompt_tokens": 9, "total_tokens": 9},
        "results": [{"index": 0, "relevance_score": 3.25, "document": {"text": "a"}},
                    {"index": 2, "relevance_score": -1.5, "document": {"text": "c"}}]}
    vllm = {"id": "x", "model": "x", "usage": {"total_tokens": 5}, "results": [
        {"index": i, "document": {"text": "?"}, "relevance_score": s} for i, s in enumerate((0.5, 0.5, 0.9))]}
    doc = answered("rerank", "vllm", {"query": "q", "documents": DOCS, "top_n": 2}, vllm)
    assert doc["results"] == [{"index": 2, "relevance_score": 0.9}, {"index": 0, "relevance_score": 0.5}]
    assert doc["usage"] == {"prompt_tokens": 5, "total_tokens": 5}
    assert answered("rerank", "vllm", {"query": "q", "documents": DOCS}, {"results": []})["usage"] == {}
    assert answered("tokenize", "llama.cpp", {"prompt": "p"}, {"tokens": [1, {"id": 7, "piece": "x"}]}) == {
        "tokens": [1, 7], "count": 2}
    assert answered("tokenize", "vllm", {"prompt": "p"}, {"tokens": [4], "count": 1, "max_model_len": 8,
                                                         "token_strs": None}) == {"tokens": [4], "count": 1,
                                                                                  "max_model_len": 8}
    assert answered("detokenize", "llama.cpp", {"tokens": [4]}, {"content": "hey"}) == {"prompt": "hey"}
    assert answered("detokenize", "vllm", {"tokens": [4]}, {"prompt": "hey"}) == {"prompt": "hey"}


@pytest.mark.parametrize(("kind", "body", "engine_doc"), [
    ("rerank", {"query": "q", "documents": DOCS}, {"results": [{"index": 3, "relevance_score": 1}]}),
    ("rerank", {"query": "q", "documents": DOCS}, {"results": [{"index": 0, "relevance_score": "high"}]}),
    ("rerank", {"query": "q", "documents": DOCS}, {"results": [{"index": 0, "relevance_score": float("nan")}]}),
    ("rerank", {"query": "q", "documents": DOCS}, {"data": []}),
    ("rerank", {"query": "q", "documents": DOCS}, ["not", "an", "object"]),
    ("tokenize", {"prompt": "p"}, {"tokens": [-1]}),
    ("tokenize", {"prompt": "p"}, {"ids": [1]}),
    ("detokenize", {"tokens": [1]}, {"text": "x"}),
])
def test_an_answer_in_a_shape_the_engine_does_not_answer_in_is_an_upstream_error(
        kind: str, body: dict[str, Any], engine_doc: Any) -> None:
    with pytest.raises(OpenAIError) as caught:
        answered(kind, "llama.cpp", body, engine_doc)
    assert (caught.value.status, caught.value.code) == (502, "upstream_error")


_scores = st.one_of(st.integers(-1000, 1000), st.floats(-1e6, 1e6, allow_nan=False))


@given(st.lists(_scores, min_size=1, max_size=12), st.none() | st.integers(1, 15), st.booleans(), st.randoms())
def test_a_rerank_answer_is_every_scored_document_once_best_first_at_most_top_n(
        scores: list[float], top_n: int | None, documents: bool, rnd: Any) -> None:
    texts = [f"doc {i}" for i in range(len(scores))]
    results = [{"index": i, "relevance_score": s} for i, s in enumerate(scores)]
    rnd.shuffle(results)  # engines differ in their order
    body = {"query": "q", "documents": texts, "top_n": top_n, "return_documents": documents}
    out = answered("rerank", "vllm", body, {"results": results})["results"]
    assert len(out) == min(len(scores), top_n or len(scores))
    assert [r["relevance_score"] for r in out] == sorted((float(s) for s in scores), reverse=True)[:len(out)]
    assert len({r["index"] for r in out}) == len(out)
    for r in out:
        assert r["relevance_score"] == scores[r["index"]]
        assert ("document" in r) == documents and (not documents or r["document"] == {"text": texts[r["index"]]})


# --- the simulator's tokens and scores ---------------------------------------------------------------------------


@given(st.lists(st.text(st.characters(blacklist_categories=("Cs", "Zs", "Zl", "Zp", "Cc")), min_size=1), max_size=8))
def test_sim_words_round_trip_through_their_ids(words: list[str]) -> None:
    vocabulary = Vocabulary()
    text = " ".join(words)
    ids = vocabulary.tokenize(text, add_special=True)
    assert ids[0] == BOS and len(ids) == len(text.split()) + 1
    assert all(256 <= t < 2**31 for t in ids[1:])
    assert vocabulary.detokenize(ids) == " ".join(text.split())
    assert Vocabulary().tokenize(text, add_special=False) == ids[1:]  # stable ids in any process


def test_sim_unknown_ids_and_scores() -> None:
    assert Vocabulary().detokenize([BOS, 12345, word_id("x")]) == f"<unk:12345> <unk:{word_id('x')}>"
    assert relevance("Giant panda", "the giant PANDA bear") == 1.0
    assert relevance("giant panda bear", "a panda") == pytest.approx(1 / 3, abs=1e-6)
    assert relevance("", "anything") == relevance("q", "") == 0.0
