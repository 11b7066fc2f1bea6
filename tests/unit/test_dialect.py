"""The frame of the APIs served by translation (llmgw/gateway/dialect.py): which paths, and the engine's
server-sent events split however the reads fall."""

from __future__ import annotations

from hypothesis import given, strategies as st

from llmgw.gateway.app import DIALECTS
from llmgw.gateway.checks import DIALECT_PATHS, ENDPOINTS
from llmgw.gateway.dialect import _Events


def test_every_dialect_is_at_a_path_the_metrics_and_docs_know() -> None:
    for path, dialect in DIALECTS.items():
        assert path == dialect.path and path in DIALECT_PATHS and path in ENDPOINTS


EVENTS = [b'{"a":1}', b'{"b":"x\\n"}', b"[DONE]"]
STREAM = b"".join(b"data: " + e + b"\n\n" for e in EVENTS)


@given(st.lists(st.integers(0, len(STREAM)), max_size=8), st.booleans())
def test_events_are_whole_however_the_stream_is_cut(cuts: list[int], crlf: bool) -> None:
    stream = STREAM.replace(b"\n", b"\r\n") if crlf else STREAM
    bounds = sorted({0, len(stream), *(min(c, len(stream)) for c in cuts)})
    events = _Events()
    seen = [data for a, b in zip(bounds, bounds[1:]) for data in events.feed(stream[a:b])]
    assert seen == EVENTS
