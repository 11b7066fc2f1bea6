"""The streams' one door (`protocol.loads`) against nesting: a message nested deeper than
`MAX_NESTING` is refused with a `ProtocolError` before it is decoded (100,000 `[` once escaped as a
RecursionError), and the depth scan agrees with the real depth of any JSON value, brackets and
quotes inside strings included. The agent answers such a message from control with `rejected` and reads the next (the leader's
end of both streams: tests/integration/test_stream_nesting.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.agent import service
from llmgw.domain.observed import NodeInfo
from llmgw.wire import protocol
from llmgw.wire.protocol import MAX_NESTING, ProtocolError, loads, nested_deeper

DEEP = "[" * 100_000


def depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    return 0


def test_a_deeply_nested_message_is_refused_before_it_is_decoded() -> None:
    for text in (DEEP, DEEP.encode(), '{"type":"x","a":' + "[" * 65 + "]" * 65 + "}", '{"type":"x","a":' + "{\"k\":" * 70):
        with pytest.raises(ProtocolError, match=f"nested deeper than {MAX_NESTING} levels"):
            loads(text)
    at_limit = '{"type":"x","a":' + "[" * (MAX_NESTING - 1) + "]" * (MAX_NESTING - 1) + "}"
    assert depth(loads(at_limit)) == MAX_NESTING


def test_brackets_in_strings_do_not_count_and_open_strings_stay_linear() -> None:
    assert loads(json.dumps({"type": "x", "s": "[" * 10_000 + '\\"{{' * 1000}))["type"] == "x"
    for text in ('"' + '\\"' * 200_000, '"' * 200_000, '"abc\\'):  # not JSON: refused as such, quickly
        assert not nested_deeper(text, MAX_NESTING)
        with pytest.raises(ProtocolError, match="not JSON"):
            loads(text)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab,:\n\u00e9'),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(alphabet='[]{}"\\k'), inner, max_size=3),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(json_values, st.integers(min_value=0, max_value=12), st.booleans())
def test_the_scan_agrees_with_the_real_depth(value: Any, limit: int, ascii_only: bool) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only, indent=None if limit % 2 else 1)
    assert nested_deeper(text, limit) == (depth(value) > limit)


def test_the_agent_rejects_a_deep_message_from_control_and_reads_the_next() -> None:
    link = service._Link(NodeInfo("n1"))
    assert service._read(DEEP, link) is None
    assert [(d["type"], d["reason"]) for d in link.outbox] == [("rejected", "nested deeper than 64 levels")]
    assert service._read(protocol.dumps({"type": "heartbeat"}), link) is not None
