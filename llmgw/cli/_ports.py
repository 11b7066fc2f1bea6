"""The listeners of `llmgw up` that cannot bind: each says which port, and which flag picks
another, instead of a bare `[Errno 98] Address already in use`."""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterator
from contextlib import contextmanager

from llmgw.errors import first_error
from llmgw.net import url_host
from llmgw.startup import CannotStart

# What bind() says when the address is the problem. EACCES counts only without a
# file name: a file that cannot be opened says EACCES too.
_BIND_ERRNOS = {errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES}


def is_bind_error(error: BaseException) -> bool:
    return isinstance(error, OSError) and error.errno in _BIND_ERRNOS and error.filename is None


def why(what: str, host: str, port: int, flag: str, error: OSError) -> str:
    """`the gateway port 127.0.0.1:8080 is already in use (...); pick another with --gateway-port`."""
    where = f"{url_host(host)}:{port}"
    if error.errno == errno.EADDRINUSE:
        return f"the {what} port {where} is already in use (another llmgw up?); pick another with {flag}"
    if error.errno == errno.EADDRNOTAVAIL:
        return f"the {what} port {where} cannot be bound: no network interface here has the address {host}; check --host"
    return f"the {what} port {where} cannot be bound ({error.strerror}); pick another with {flag}"


@contextmanager
def naming(what: str, host: str, port: int, flag: str) -> Iterator[None]:
    """A bind error raised inside (bare or in an exception group) becomes CannotStart with words;
    every other error passes unchanged."""
    try:
        yield
    except* OSError as group:
        bind_errors = group.subgroup(is_bind_error)
        if bind_errors is None:
            raise
        first = first_error(bind_errors)
        assert isinstance(first, OSError)
        raise CannotStart(why(what, host, port, flag, first)) from first


def check_free(what: str, host: str, port: int, flag: str) -> None:
    """Bind `port` once and let it go, for a listener that would not say it cannot (pysyncobj
    retries a busy Raft port forever). As that listener does, with SO_REUSEADDR: a port in
    TIME_WAIT after a restart is free."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise CannotStart(why(what, host, port, flag, e)) from e
