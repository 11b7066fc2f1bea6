"""HTTP/1.1 on the wire (llmgw/wire/http1.py): what the readers make of bytes however they are split, what they
refuse, and the bytes the writers produce (checked by h11, an independent strict implementation)."""

from __future__ import annotations

import itertools

import h11
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.wire.http1 import (
    BODY,
    END,
    HEAD,
    LAST_CHUNK,
    BadRequest,
    Head,
    RequestReader,
    ResponseReader,
    chunk,
    request_bytes,
    response_head,
)

POST = (b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer sk-1\r\nContent-Length: 11\r\n\r\n{\"a\": \"b\"}\n")
GET = b"GET /v1/models HTTP/1.1\r\nhost: gw\r\n\r\n"
CHUNKED = (b"POST /v1/completions HTTP/1.1\r\nhost: gw\r\ntransfer-encoding: chunked\r\n\r\n"
           b"4\r\n{\"a\"\r\n3\r\n: 1\r\n1\r\n}\r\n0\r\n\r\n")


def events(reader: RequestReader) -> list[tuple[int, object]]:
    out = list(reader.events)
    reader.events.clear()
    return out


def requests_of(stream: bytes, cuts: list[int]) -> list[tuple[bytes, bytes, list[tuple[bytes, bytes]], bytes]]:
    """Feed `stream` cut at `cuts`; each request as (method, target, headers, whole body)."""
    reader = RequestReader(64 * 1024)
    edges = [0, *sorted(set(c for c in cuts if 0 < c < len(stream))), len(stream)]
    for a, b in zip(edges, edges[1:]):
        reader.feed(stream[a:b])
    found: list[tuple[bytes, bytes, list[tuple[bytes, bytes]], bytes]] = []
    body: list[bytes] = []
    head: Head | None = None
    for kind, value in events(reader):
        if kind == HEAD:
            assert isinstance(value, Head)
            head, body = value, []
        elif kind == BODY:
            body.append(value)  # type: ignore[arg-type]
        else:
            assert kind == END and head is not None
            found.append((head.method, head.target, head.headers, b"".join(body)))
    return found


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, len(POST + GET + CHUNKED)), max_size=12))
def test_pipelined_requests_read_the_same_however_the_bytes_are_split(cuts: list[int]) -> None:
    found = requests_of(POST + GET + CHUNKED, cuts)
    assert [(m, t, b) for m, t, _, b in found] == [
        (b"POST", b"/v1/chat/completions?x=1", b'{"a": "b"}\n'),
        (b"GET", b"/v1/models", b""),
        (b"POST", b"/v1/completions", b'{"a": 1}'),
    ]
    # Header names come lower-case (the apps look them up so), values as sent.
    assert (b"authorization", b"Bearer sk-1") in found[0][2]


def test_a_head_says_keep_alive_version_and_100_continue() -> None:
    reader = RequestReader(1024)
    reader.feed(b"POST /x HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n")
    ((kind, head),) = events(reader)
    assert kind == HEAD and isinstance(head, Head)
    assert (head.version, head.keep_alive, head.expects_continue) == ("1.0", False, True)
    reader = RequestReader(1024)
    reader.feed(b"GET /x HTTP/1.1\r\nConnection: close\r\n\r\n")
    head = events(reader)[0][1]
    assert isinstance(head, Head) and not head.keep_alive and not head.expects_continue


@pytest.mark.parametrize(("wire", "status"), [
    (b"NOT HTTP AT ALL\r\n\r\n", 400),
    (b"GET /x HTTP/1.1\r\nbad header line\r\n\r\n", 400),
    (b"POST /x HTTP/1.1\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\nab", 400),  # request smuggling
    (b"POST /x HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n", 400),
    (b"GET /x HTTP/1.1\r\nconnection: upgrade\r\nupgrade: h2c\r\n\r\n", 400),
])
def test_what_is_not_http_is_refused_with_the_status_to_answer(wire: bytes, status: int) -> None:
    with pytest.raises(BadRequest) as refused:
        RequestReader(1024).feed(wire)
    assert refused.value.status == status


def test_a_head_over_the_limit_is_431_even_when_it_comes_in_pieces() -> None:
    reader = RequestReader(1024)
    reader.feed(b"GET /x HTTP/1.1\r\nx-a: " + b"a" * 600)
    with pytest.raises(BadRequest) as refused:
        reader.feed(b"a" * 600)
    assert refused.value.status == 431
    # Under the limit, whole: served, and the count starts again with the next request.
    reader = RequestReader(1024)
    for _ in range(3):
        reader.feed(b"GET /x HTTP/1.1\r\nx-a: " + b"a" * 900 + b"\r\n\r\n")
    assert [k for k, _ in events(reader)] == [HEAD, END] * 3


def head_of(size: int) -> bytes:
    """A GET whose head (request line, headers, the blank line) is exactly `size` bytes."""
    start, end = b"GET /x HTTP/1.1\r\nx-a: ", b"\r\n\r\n"
    return start + b"a" * (size - len(start) - len(end)) + end


def fed(reader: RequestReader, wire: bytes, cuts: list[int]) -> None:
    edges = [0, *sorted(set(c for c in cuts if 0 < c < len(wire))), len(wire)]
    for a, b in zip(edges, edges[1:]):
        reader.feed(wire[a:b])


def test_a_70000_byte_head_is_431_under_the_64_kib_limit() -> None:
    # The report: a 70,000-byte head was served. Its last read completed it, and only reads that left a
    # head incomplete were counted.
    for reads in ([70_000], [65_536, 70_000 - 65_536], [30_000, 40_000]):
        reader = RequestReader(64 * 1024)
        with pytest.raises(BadRequest) as refused:
            fed(reader, head_of(70_000), list(itertools.accumulate(reads))[:-1])
        assert refused.value.status == 431
        assert not reader.events  # no head of it reaches the app


@settings(max_examples=300, deadline=None)
@given(over=st.integers(1, 300), cuts=st.lists(st.integers(0, 1400), max_size=6))
def test_the_head_limit_counts_every_byte_of_the_head_however_it_is_split(over: int, cuts: list[int]) -> None:
    reader = RequestReader(1024)
    with pytest.raises(BadRequest) as refused:
        fed(reader, head_of(1024 + over) + POST, cuts)
    assert refused.value.status == 431
    # A head of exactly the limit is served, with a body and a request after it in the same reads.
    reader = RequestReader(1024)
    fed(reader, head_of(1024) + POST, cuts)
    assert [k for k, _ in events(reader) if k != BODY] == [HEAD, END, HEAD, END]


def answer_of(wire: bytes, cuts: list[int]) -> ResponseReader:
    reader = ResponseReader()
    edges = [0, *sorted(set(c for c in cuts if 0 < c < len(wire))), len(wire)]
    for a, b in zip(edges, edges[1:]):
        reader.feed(wire[a:b])
    return reader


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 400), max_size=10))
def test_an_answer_reads_the_same_however_the_bytes_are_split(cuts: list[int]) -> None:
    wire = (b"HTTP/1.1 100 Continue\r\n\r\n"
            + response_head(200, [(b"content-type", b"text/event-stream"), (b"transfer-encoding", b"chunked")])
            + chunk(b"data: 1\n\n") + chunk(b"data: [DONE]\n\n") + LAST_CHUNK)
    reader = answer_of(wire, cuts)
    assert reader.status == 200 and reader.complete and reader.keep_alive and not reader.until_close
    assert b"".join(reader.body) == b"data: 1\n\ndata: [DONE]\n\n"
    assert (b"content-type", b"text/event-stream") in reader.headers


def test_an_answer_without_length_or_chunks_ends_at_the_close() -> None:
    reader = answer_of(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n{}", [])
    assert reader.status == 200 and reader.until_close and not reader.complete
    sized = answer_of(b"HTTP/1.1 404 Not Found\r\nconnection: close\r\ncontent-length: 2\r\n\r\n{}", [])
    assert sized.complete and not sized.until_close and not sized.keep_alive and list(sized.body) == [b"{}"]
    with pytest.raises(BadRequest):
        ResponseReader().feed(b"garbage\r\n\r\n")


def test_one_reader_reads_answer_after_answer_on_a_kept_connection() -> None:
    reader = ResponseReader()
    for n in range(3):
        reader.feed(response_head(200, [(b"content-length", b"1")]) + str(n).encode())
        assert reader.complete and list(reader.body) == [str(n).encode()]
        reader.reset()


def test_the_writers_bytes_are_valid_http_to_a_strict_peer() -> None:
    server = h11.Connection(h11.SERVER)
    server.receive_data(request_bytes(b"POST", b"/v1/x", [(b"host", b"e"), (b"x-request-id", b"r1")], b"{}"))
    request = server.next_event()
    assert isinstance(request, h11.Request) and request.target == b"/v1/x"
    assert isinstance(server.next_event(), h11.Data) and isinstance(server.next_event(), h11.EndOfMessage)
    client = h11.Connection(h11.CLIENT)
    client.send(h11.Request(method="POST", target="/", headers=[("host", "gw"), ("content-length", "0")]))
    client.send(h11.EndOfMessage())
    client.receive_data(response_head(201, [(b"transfer-encoding", b"chunked")]) + chunk(b"ab") + LAST_CHUNK)
    response = client.next_event()
    assert isinstance(response, h11.Response) and response.status_code == 201 and response.reason == b"Created"
    data = client.next_event()
    assert isinstance(data, h11.Data) and data.data == b"ab"
    assert isinstance(client.next_event(), h11.EndOfMessage)


@pytest.mark.parametrize("bad", [b"a\r\nx-evil: 1", b"a\nb", b"a\rb", b"\r", b"\n"])
def test_a_line_break_in_a_header_is_never_written(bad: bytes) -> None:
    with pytest.raises(ValueError):
        response_head(200, [(b"x-request-id", bad)])
    with pytest.raises(ValueError):
        request_bytes(b"POST", b"/x", [(b"x-request-id", bad)], b"")
    with pytest.raises(ValueError):
        response_head(200, [(b"x-ok", b"1"), (bad, b"v")])  # in a name too, after a good header
    with pytest.raises(ValueError):
        request_bytes(b"POST", b"/x" + bad, [(b"host", b"e")], b"")


HEADER_BYTES = st.binary(max_size=8) | st.sampled_from([b"a\r\nb", b"\r", b"\n", b"x-request-id", b"text/plain"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(HEADER_BYTES, HEADER_BYTES), max_size=6))
def test_header_lines_are_written_as_given_or_refused_when_one_holds_a_line_break(
        headers: list[tuple[bytes, bytes]]) -> None:
    # The heads are checked with two counts over their lines, not each header on its own: the same verdict.
    broken = any(b"\r" in part or b"\n" in part for header in headers for part in header)
    lines = b"".join(name + b": " + value + b"\r\n" for name, value in headers)
    if broken:
        with pytest.raises(ValueError):
            response_head(200, headers)
        with pytest.raises(ValueError):
            request_bytes(b"POST", b"/x", headers, b"{}")
    else:
        assert response_head(204, headers) == b"HTTP/1.1 204 No Content\r\n" + lines + b"\r\n"
        assert request_bytes(b"POST", b"/x", headers, b"{}") == (b"POST /x HTTP/1.1\r\n" + lines
                                                                 + b"content-length: 2\r\n\r\n{}")
