"""`llmgw gateway --workers N`, the parts without processes: the parent's port reservation (SO_REUSEPORT,
never listening), the restart backoff, and each worker's command line, name and state dir."""

from __future__ import annotations

import errno
import socket
from dataclasses import replace
from pathlib import Path

import pytest
import trio
import trio.testing

from llmgw.cli import _ports
from llmgw.domain.timeouts import TIMEOUTS
from llmgw.gateway import workers
from llmgw.wire.logquery import gateway_tag
from llmgw.startup import CannotStart
from llmgw.wire.front import listen_socket


async def _connect(port: int) -> trio.SocketStream:
    return await trio.open_tcp_stream("127.0.0.1", port)


async def test_the_reserved_port_takes_no_connection_but_two_workers_listen_on_it() -> None:
    with await workers.reserve_port("127.0.0.1", 0) as reserved:
        port = reserved.getsockname()[1]
        assert port != 0
        # Bound, not listening: the kernel refuses a client rather than queueing it on the reservation.
        with pytest.raises(OSError):
            await _connect(port)
        # Nobody else takes the port meanwhile.
        with socket.socket() as other, pytest.raises(OSError) as info:
            other.bind(("127.0.0.1", port))
        assert info.value.errno == errno.EADDRINUSE
        # Two workers' listeners join the reservation; every connection lands on one of them.
        with await listen_socket("127.0.0.1", port, reuse_port=True) as a, \
                await listen_socket("127.0.0.1", port, reuse_port=True) as b:
            # What a second `--workers` gateway on this port runs first: it is told the port is taken.
            with pytest.raises(CannotStart, match=f"127.0.0.1:{port} is already in use"):
                _ports.check_free("gateway", "127.0.0.1", port, "--listen")
            listeners = [trio.SocketListener(a), trio.SocketListener(b)]
            accepted = [0, 0]

            async def accept(i: int) -> None:
                while True:
                    stream = await listeners[i].accept()
                    accepted[i] += 1
                    await stream.aclose()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(accept, 0)
                nursery.start_soon(accept, 1)
                for _ in range(40):
                    stream = await _connect(port)
                    await stream.aclose()
                with trio.fail_after(5):
                    while sum(accepted) < 40:
                        await trio.sleep(0.01)
                nursery.cancel_scope.cancel()
            assert sum(accepted) == 40
            assert min(accepted) > 0, accepted  # 2^-39 to fail by chance: the kernel spreads them
        # Both workers gone, the reservation still holds the port and still takes nothing.
        with pytest.raises(OSError):
            await _connect(port)
        with socket.socket() as other, pytest.raises(OSError):
            other.bind(("127.0.0.1", port))
    # The parent gone, the port is free again (its closed connections' TIME_WAIT aside, as any restart sees it).
    _ports.check_free("gateway", "127.0.0.1", port, "--listen")


def test_a_worker_that_keeps_dying_soon_waits_longer_and_a_long_life_starts_over() -> None:
    t = replace(TIMEOUTS, gateway_worker_restart_min_s=0.5, gateway_worker_restart_max_s=4.0,
                gateway_worker_stable_s=10.0)
    restarts = workers.Restarts(t)
    assert [restarts.after_death(1.0) for _ in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert restarts.quick_deaths == 6
    assert restarts.after_death(60.0) == 0.5  # it served a while: a fresh failure, not a crash loop
    assert restarts.quick_deaths == 0
    assert restarts.after_death(0.0) == 0.5 and restarts.after_death(0.0) == 1.0


def test_each_worker_has_its_own_name_tag_and_state_dir_and_no_key_on_its_command_line(tmp_path: Path) -> None:
    command = workers.gateway_command(["http://10.0.0.1:8081", "http://10.0.0.2:8081"], "gw", tmp_path / "gw",
                                      log_json=True, log_level="debug")
    argv = command(2, "127.0.0.1:8080")
    assert argv[1:4] == ["-m", "llmgw", "gateway"]
    flags = {argv[i]: argv[i + 1] for i in range(4, len(argv) - 1) if argv[i].startswith("--")}
    assert flags["--listen"] == "127.0.0.1:8080"
    assert flags["--name"] == "gw-w2"
    assert flags["--state-dir"] == str((tmp_path / "gw").resolve() / "workers" / "w2")
    assert flags["--log-level"] == "debug" and "--log-json" in argv
    assert argv.count("--control") == 2 and "--key" not in argv
    assert flags["--worker-of"].isdigit()
    # Request ids name the worker that holds the record; its log lines say which worker wrote them.
    assert gateway_tag(workers.worker_name("gw", 1)) != gateway_tag(workers.worker_name("gw", 2))
    assert workers.worker_role("edge-3-w2") == "gateway-w2"
    assert workers.describe_exit(-9) == "killed by SIGKILL" and workers.describe_exit(3) == "exited with status 3"


async def test_a_worker_stops_when_its_parent_is_gone() -> None:
    # Not our parent's pid: as if the parent died and this process was adopted by init.
    with trio.CancelScope() as scope:
        await workers._watch_parent(-1, 1.0, scope)
        await trio.sleep_forever()
    assert scope.cancelled_caught
