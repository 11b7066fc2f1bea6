"""What the gateway reads from an engine's answer: usage tokens (whole, or a stream's final chunk)
and an engine's own error in OpenAI's shape, words and status kept."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmgw.gateway.answers import ENGINE_ERROR, HiddenUsage, StreamUsage, asking_usage, engine_error, usage_of


def test_usage_of_a_whole_answer() -> None:
    body = json.dumps({"choices": [{"message": {"content": 'say "usage": {"prompt_tokens": 99}'}}],
                       "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}}).encode()
    assert usage_of(body) == (12, 5)


def test_usage_key_inside_the_text_is_not_the_usage() -> None:
    # usage first, then a text that quotes a usage object: the key, not the text, is read.
    body = (b'{"usage": {"prompt_tokens": 3, "completion_tokens": 4}, "choices": [{"text": '
            b'"\\"usage\\": {\\"prompt_tokens\\": 99}"}]}')
    assert usage_of(body) == (3, 4)


def test_embeddings_have_no_completion_tokens_and_say_so_by_their_total() -> None:
    body = b'{"data": [{"embedding": [0.1, 0.2]}], "usage": {"prompt_tokens": 7, "total_tokens": 7}}'
    assert usage_of(body) == (7, 0)


@pytest.mark.parametrize(
    "body",
    [b'{"choices": []}', b'{"usage": null}', b'{"usage": {"prompt_tokens": "3"}}', b'{"usage": {',
     b'{"usage": {"prompt_tokens": -1, "completion_tokens": true}}', b"", b"\xff\xfe"],
)
def test_unknown_usage_is_none_never_zero(body: bytes) -> None:
    assert usage_of(body) == (None, None)


def test_stream_usage_comes_from_the_final_chunk_however_it_was_cut() -> None:
    frames = [b'data: {"choices":[{"delta":{"content":"a"}}],"usage":null}\n\n'] * 50 + [
        b'data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":50,"total_tokens":59},'
        b'"timings":{"predicted_ms":12.5}}\n\n',
        b"data: [DONE]\n\n",
    ]
    stream = b"".join(frames)
    for size in (1, 7, 64, len(stream)):
        usage = StreamUsage()
        for i in range(0, len(stream), size):
            usage.feed(stream[i : i + size])
        assert usage.tokens() == (9, 50)


def test_a_stream_without_a_usage_chunk_has_unknown_tokens() -> None:
    usage = StreamUsage()
    usage.feed(b'data: {"choices":[{"delta":{"content":"a"}}]}\n\ndata: [DONE]\n\n')
    assert usage.tokens() == (None, None)


@pytest.mark.parametrize(
    ("status", "body", "code", "message", "param"),
    [
        (400, b'{"error":{"code":400,"message":"context too long","type":"exceed_context_size_error"}}',
         ENGINE_ERROR, "context too long", None),
        (400, b'{"code":400,"message":"bad grammar"}', ENGINE_ERROR, "bad grammar", None),
        (400, b'{"object":"error","message":"bad n","type":"BadRequestError","param":"n","code":400}',
         ENGINE_ERROR, "bad n", "n"),
        (400, b'{"error":{"message":"m","type":"invalid_request_error","param":"n","code":"invalid_value"}}',
         "invalid_value", "m", "n"),
        (422, b'{"detail":"field required"}', ENGINE_ERROR, "field required", None),
        (404, b'{"error":"model not found"}', ENGINE_ERROR, "model not found", None),
        (500, b"Internal Server Error", ENGINE_ERROR, "replica r1 answered 500: Internal Server Error", None),
        (502, b"", ENGINE_ERROR, "replica r1 answered 502", None),
        (400, b'{"error":{"code":400}}', ENGINE_ERROR, "replica r1 answered 400", None),
        (400, b"[" * 100_000, ENGINE_ERROR, "replica r1 answered 400: [[[", None),
    ],
)
def test_engine_errors_in_openai_shape(status: int, body: bytes, code: str, message: str, param: str | None) -> None:
    error = engine_error(status, body, "replica r1")
    assert (error.status, error.code, error.param) == (status, code, param)
    assert error.message.startswith(message)
    assert set(error.doc()["error"]) == {"message", "type", "param", "code"}


def test_a_stream_asks_for_usage_and_keeps_the_body_when_the_client_did() -> None:
    raw = b'{"model":"m","stream":true,"stream_options":{"include_usage":true}}'
    assert asking_usage(json.loads(raw), raw) == (raw, False)
    raw = b'{"model":"m","stream":true,"stream_options":{"include_obfuscation":false}}'
    sent, hide = asking_usage(json.loads(raw), raw)
    assert hide and json.loads(sent)["stream_options"] == {"include_obfuscation": False, "include_usage": True}


def test_a_stream_that_names_no_options_gets_them_added_to_its_bytes() -> None:
    # Not encoded again (a stream's request is on its way to the first chunk): the client's bytes, spaces and all.
    raw = b'{"model": "m", "stream": true, "messages": [{"role": "user", "content": "caf\xc3\xa9"}]}\n'
    sent, hide = asking_usage(json.loads(raw), raw)
    assert hide and sent == raw.rstrip()[:-1] + b',"stream_options":{"include_usage":true}}'
    assert json.loads(sent) == {**json.loads(raw), "stream_options": {"include_usage": True}}
    for other in ('{"model":"m","stream":true}'.encode("utf-16"), b'\xef\xbb\xbf{"model":"m","stream":true}',
                  b'{"model":"m","stream":true,"stream_options":null}'):  # not UTF-8 bytes, or options to replace
        sent, hide = asking_usage(json.loads(other), other)
        assert hide and json.loads(sent) == {"model": "m", "stream": True, "stream_options": {"include_usage": True}}


def test_hidden_usage_drops_only_the_usage_chunk_and_holds_split_events() -> None:
    text = b'data: {"choices":[{"delta":{"content":"usage"}}],"usage":null}\n\n'
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}\n\n'
    stream = text + usage + b"data: [DONE]\n\n"
    hider = HiddenUsage()
    out = b"".join(hider.feed(stream[i:i + 7]) for i in range(0, len(stream), 7)) + hider.flush()
    assert out == text.replace(b',"usage":null', b"") + b"data: [DONE]\n\n", \
        "a text chunk naming usage stays (less its null usage); the usage-only chunk goes"


def test_a_client_that_did_not_ask_for_usage_gets_no_usage_field_at_all() -> None:
    """vLLM, asked for usage, adds `"usage": null` to every chunk; OpenAI sends no such field unasked."""
    hider = HiddenUsage()
    chunk = (b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"say \\"usage\\":null"}}],"usage":null}\n\n'
             b'data: {"id":"c", "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 2}}\n\n'
             b'data: [DONE]\n\n')
    out = hider.feed(chunk) + hider.flush()
    assert out == (b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"say \\"usage\\":null"}}]}\n\n'
                   b'data: [DONE]\n\n')
    assert json.loads(out.split(b"\n\n")[0][6:])["choices"][0]["delta"]["content"] == 'say "usage":null'


_WORD = st.text(st.sampled_from('ab "usage":null,{}\\'), max_size=12)
_EVENT = st.one_of(
    st.builds(lambda w, null: {"choices": [{"index": 0, "delta": {"content": w}}], **({"usage": None} if null else {})},
              _WORD, st.booleans()),
    st.builds(lambda n: {"choices": [], "usage": {"prompt_tokens": n, "completion_tokens": n}}, st.integers(0, 9)),
)


@given(events=st.lists(_EVENT, max_size=6), cuts=st.lists(st.integers(1, 400), min_size=1, max_size=8))
def test_hidden_usage_gives_each_event_as_read_one_by_one_however_the_stream_is_read(
        events: list[dict[str, object]], cuts: list[int]) -> None:
    """Several events in one read are filtered at once (one pass for the null usages): the same events come out
    as from the stream read event by event, each without its null usage, the usage-only ones left out."""
    frames = [b"data: " + json.dumps(e, separators=(",", ":")).encode() + b"\n\n" for e in events]
    stream = b"".join(frames) + b"data: [DONE]\n\n"
    expected = b"".join(f.replace(b',"usage":null', b"") for f, e in zip(frames, events, strict=True)
                        if e["choices"]) + b"data: [DONE]\n\n"
    hider, out, at, k = HiddenUsage(), [], 0, 0
    while at < len(stream):
        size = cuts[k % len(cuts)]
        out.append(hider.feed(stream[at : at + size]))
        at, k = at + size, k + 1
    assert b"".join(out) + hider.flush() == expected
