"""A listener of `llmgw up` that cannot bind names its port and the flag that picks another."""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterator

import pytest
import trio

from llmgw.cli import _ports
from llmgw.startup import CannotStart


@pytest.fixture
def taken() -> Iterator[int]:
    """A port with a live listener on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


async def test_a_busy_port_is_named_with_its_flag(taken: int) -> None:
    with pytest.raises(CannotStart) as caught:
        with _ports.naming("gateway", "127.0.0.1", taken, "--gateway-port"):
            await trio.open_tcp_listeners(taken, host="127.0.0.1")
    assert str(caught.value) == (f"the gateway port 127.0.0.1:{taken} is already in use (another llmgw up?); "
                                 "pick another with --gateway-port")
    assert isinstance(caught.value.__cause__, OSError) and caught.value.__cause__.errno == errno.EADDRINUSE


def test_a_bind_error_inside_nurseries_is_named_too() -> None:
    nested = ExceptionGroup("outer", [ExceptionGroup("inner", [OSError(errno.EADDRINUSE, "Address already in use")])])
    with pytest.raises(CannotStart) as caught:
        with _ports.naming("admin API", "::1", 8081, "--admin-port"):
            raise nested
    assert str(caught.value) == ("the admin API port [::1]:8081 is already in use (another llmgw up?); "
                                 "pick another with --admin-port")


@pytest.mark.parametrize("error", [PermissionError(errno.EACCES, "Permission denied", "/state/raft/journal.bin"),
                                   FileNotFoundError(errno.ENOENT, "No such file", "/state/x"),
                                   ValueError("not an OSError")])
def test_other_errors_pass_unchanged(error: Exception) -> None:
    with pytest.raises(BaseException) as caught:
        with _ports.naming("admin API", "127.0.0.1", 8081, "--admin-port"):
            raise error
    leaf = caught.value
    while isinstance(leaf, BaseExceptionGroup):
        leaf = leaf.exceptions[0]
    assert leaf is error


def test_a_missing_address_points_at_host() -> None:
    message = _ports.why("gateway", "10.255.255.1", 8080, "--gateway-port",
                         OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address"))
    assert message == ("the gateway port 10.255.255.1:8080 cannot be bound: no network interface here has the "
                       "address 10.255.255.1; check --host")
    denied = _ports.why("gateway", "127.0.0.1", 80, "--gateway-port", OSError(errno.EACCES, "Permission denied"))
    assert denied == "the gateway port 127.0.0.1:80 cannot be bound (Permission denied); pick another with --gateway-port"


def test_check_free_before_a_listener_that_would_retry_forever(taken: int) -> None:
    with pytest.raises(CannotStart, match=rf"the Raft port 127\.0\.0\.1:{taken} is already in use .* --raft-port"):
        _ports.check_free("Raft", "127.0.0.1", taken, "--raft-port")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    _ports.check_free("Raft", "127.0.0.1", free, "--raft-port")  # no error, and the port is let go
    with socket.socket() as again:
        again.bind(("127.0.0.1", free))
