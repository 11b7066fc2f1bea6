"""HTTP/1.1 on the wire for the gateway's two sides: requests parsed for the front end, answers parsed for
the upstream client (both with httptools, llhttp's C parser), and the bytes each side writes.

Why not h11 here: h11 validates every header with regular expressions and runs a state machine per event;
measured, it cost ~48 µs per request on each side, a fifth of the gateway's CPU (docs/performance.md).
httptools parses a request in ~3 µs. What h11 did for us is done here in the open: the head's size limit,
keep-alive, `Expect: 100-continue`, chunked bodies both ways, HTTP/1.0 peers, and refusing what is not
valid HTTP/1.1 (`BadRequest`, with the status to answer).
"""

from __future__ import annotations

from collections import deque
from http import HTTPStatus

import httptools

__all__ = [
    "LAST_CHUNK",
    "BadRequest",
    "Head",
    "RequestReader",
    "ResponseReader",
    "chunk",
    "request_bytes",
    "response_head",
]

LAST_CHUNK = b"0\r\n\r\n"
_REASONS = {status.value: status.phrase.encode() for status in HTTPStatus}


class BadRequest(Exception):
    """Bytes that are not a valid HTTP/1.1 message; `status` is what to answer (400, 431...)."""

    def __init__(self, status: int, words: str) -> None:
        super().__init__(words)
        self.status = status


class Head:
    """A request's line and headers (names lower-case, values as sent)."""

    __slots__ = ("method", "target", "version", "headers", "keep_alive", "expects_continue")

    def __init__(self, method: bytes, target: bytes, version: str, headers: list[tuple[bytes, bytes]],
                 keep_alive: bool, expects_continue: bool) -> None:
        self.method = method
        self.target = target
        self.version = version
        self.headers = headers
        self.keep_alive = keep_alive
        self.expects_continue = expects_continue


# Events a reader queues: a head, a piece of body, or the end of a message.
HEAD, BODY, END = 0, 1, 2


class RequestReader:
    """Feeds bytes from a client to llhttp and queues what they meant, request after request (pipelined
    ones included): `(HEAD, Head)`, `(BODY, bytes)`, `(END, None)`. `feed` raises BadRequest.

    The head limit counts every byte of a head, request line included, however the reads split it: bytes
    that may hold a head (between messages, or in one) are fed at most up to the limit, and a head still
    incomplete there is refused (431) before it is whole. A head that begins after a pipelined request's
    end, in the same read, is counted from that read's first byte (more, never less, than its size)."""

    __slots__ = ("events", "max_head", "_parser", "_url", "_headers", "_in_head", "_in_body", "_heads",
                 "_head_bytes", "_continue")

    def __init__(self, max_head: int) -> None:
        self.events: deque[tuple[int, object]] = deque()
        self.max_head = max_head
        self._parser = httptools.HttpRequestParser(self)
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._in_head = False
        self._in_body = False  # between a head's end and its message's end
        self._heads = 0  # heads completed, ever
        self._head_bytes = 0  # of the head in progress: bytes fed since it began
        self._continue = False

    def feed(self, data: bytes) -> None:
        # Past the head's room, feed only the room: the rest is fed once a head has ended in it.
        while not self._in_body and len(data) > (room := self.max_head - self._head_bytes):
            heads = self._heads
            if room > 0:
                self._parse(data[:room])
            if self._heads == heads:
                raise BadRequest(431, f"the request head is larger than {self.max_head} bytes")
            data = data[room:]
        self._parse(data)

    def _parse(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            raise BadRequest(400, "protocol upgrades are not supported here") from None
        except httptools.HttpParserError as error:
            raise BadRequest(400, f"not a valid HTTP/1.1 request: {error}") from None
        if self._in_head:  # (a head that began in `data` counts all of it: `on_message_begin` zeroed the count)
            self._head_bytes += len(data)

    @property
    def in_head(self) -> bool:
        """A head has begun and is not complete (for the head's time limit)."""
        return self._in_head

    # --- llhttp's callbacks ---------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._in_head = True
        self._head_bytes = 0
        self._url = b""
        self._headers = []
        self._continue = False

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self._continue = True
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._in_body = True
        self._heads += 1
        self._head_bytes = 0
        parser = self._parser
        self.events.append((HEAD, Head(parser.get_method(), self._url, parser.get_http_version(), self._headers,
                                       parser.should_keep_alive(), self._continue)))

    def on_body(self, body: bytes) -> None:
        self.events.append((BODY, body))

    def on_message_complete(self) -> None:
        self._in_body = False
        self.events.append((END, None))


class ResponseReader:
    """Feeds bytes from an engine to llhttp, for one answer at a time: `status`, `headers` once the head
    is in, body pieces queued in `body`, `complete` at its end. `feed` raises BadRequest (400: invalid)."""

    __slots__ = ("status", "headers", "body", "complete", "keep_alive", "until_close", "_parser", "_headers")

    def __init__(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self.reset()

    def reset(self) -> None:
        """Ready for the next answer on the same connection."""
        self.status = 0  # 0 until a final (not 1xx) head is in
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: deque[bytes] = deque()
        self.complete = False
        self.keep_alive = False
        self.until_close = False  # no length, no chunks: the body ends when the engine closes
        self._headers: list[tuple[bytes, bytes]] = []

    def feed(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as error:
            raise BadRequest(400, f"not a valid HTTP/1.1 answer: {error}") from None

    def on_message_begin(self) -> None:
        self._headers = []

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if status >= 200:  # a 1xx is followed by the real answer
            self.status = status
            self.headers = self._headers
            self.keep_alive = self._parser.should_keep_alive()
            names = {name for name, _ in self._headers}
            self.until_close = b"content-length" not in names and b"transfer-encoding" not in names

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        if self.status:
            self.complete = True


def _check(value: bytes) -> bytes:
    if b"\r" in value or b"\n" in value:
        raise ValueError(f"a header may not hold a line break: {value[:40]!r}")
    return value


def _header_lines(headers: list[tuple[bytes, bytes]]) -> bytes:
    """`name: value` CR LF for each header; a line break (CR or LF) in a name or a value is refused. Each line
    has the one CR and the one LF that end it, so two counts over the lines say whether any header holds one
    (four scans and two calls a header cost more: these lines are on every answer's way out)."""
    lines = b"".join([name + b": " + value + b"\r\n" for name, value in headers])
    if lines.count(b"\n") != len(headers) or lines.count(b"\r") != len(headers):
        for name, value in headers:
            _check(name)
            _check(value)
    return lines


def response_head(status: int, headers: list[tuple[bytes, bytes]], version: bytes = b"1.1") -> bytes:
    """`HTTP/1.1 200 OK` and the headers, ready to send (a line break in a name or value is refused)."""
    status_line = b"HTTP/%s %d %s\r\n" % (version, status, _REASONS.get(status, b"Unknown"))
    return status_line + _header_lines(headers) + b"\r\n"


def chunk(data: bytes) -> bytes:
    """One piece of a chunked body."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def request_bytes(method: bytes, target: bytes, headers: list[tuple[bytes, bytes]], body: bytes) -> bytes:
    """A whole request with a content-length body, ready to send."""
    return b"".join((method, b" ", _check(target), b" HTTP/1.1\r\n", _header_lines(headers),
                     b"content-length: %d\r\n\r\n" % len(body), body))
