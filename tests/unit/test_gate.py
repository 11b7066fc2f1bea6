"""The door of a listener (llmgw/wire/gate.py): at a limit the oldest idle connection makes room (at an
address's limit, that address's own), with none idle the new one is refused; counted, logged at most once
per interval. Over fake sockets: which one was closed is what the tests read."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pytest

from llmgw.domain.limits import Caps
from llmgw.wire.gate import ConnectionGate, Slot, address_of


@dataclass
class FakeSocket:
    peer: tuple[str, int]
    closed: bool = False

    def getpeername(self) -> tuple[str, int]:
        return self.peer

    def close(self) -> None:
        self.closed = True


@dataclass
class FakeStream:
    socket: FakeSocket


@dataclass
class Door:
    gate: ConnectionGate
    now: list[float] = field(default_factory=lambda: [0.0])
    port: int = 1000

    def connect(self, host: str) -> tuple[FakeSocket, Slot | None]:
        self.port += 1
        sock = FakeSocket((host, self.port))
        return sock, self.gate.admit(FakeStream(sock))


def door(connections: int, per_address: int, log_every_s: float = 60.0) -> Door:
    now = [0.0]
    return Door(ConnectionGate("gateway", Caps(connections, per_address), log_every_s=log_every_s,
                               clock=lambda: now[0]), now)


def test_at_the_listener_limit_the_oldest_idle_connection_makes_room() -> None:
    d = door(3, 3)
    (a, _), (b, slot_b), (c, _) = d.connect("10.0.0.1"), d.connect("10.0.0.2"), d.connect("10.0.0.3")
    assert slot_b is not None
    d.gate.wake(slot_b)  # b is serving a request: never closed to make room
    e, slot_e = d.connect("10.0.0.4")
    assert slot_e is not None and a.closed and not (b.closed or c.closed or e.closed)
    _, slot_f = d.connect("10.0.0.5")
    assert slot_f is not None and c.closed and not b.closed
    stats = d.gate.statistics()
    assert (stats.open, stats.evicted, stats.refused_listener_full) == (3, 2, 0)


def test_with_none_idle_a_new_connection_is_refused_and_counted() -> None:
    d = door(2, 2)
    slots = [d.connect(f"10.0.0.{n}") for n in (1, 2)]
    for sock, slot in slots:
        assert slot is not None
        d.gate.wake(slot)
    sock, slot = d.connect("10.0.0.3")
    assert slot is None  # the caller closes it
    assert not any(s.closed for s, _ in slots)
    stats = d.gate.statistics()
    assert (stats.open, stats.refused_listener_full, stats.refused_address_full, stats.evicted) == (2, 1, 0, 0)
    # One of them ends: room again.
    d.gate.release(slots[0][1])  # type: ignore[arg-type]
    assert d.connect("10.0.0.3")[1] is not None


def test_one_address_holds_at_most_its_share_and_makes_room_from_its_own() -> None:
    d = door(10, 2)
    other, _ = d.connect("10.0.0.9")  # the oldest idle connection of all, from another address
    x1, _ = d.connect("10.0.0.1")
    x2, slot_x2 = d.connect("10.0.0.1")
    x3, slot_x3 = d.connect("10.0.0.1")
    assert x1.closed and not other.closed and slot_x3 is not None
    assert slot_x2 is not None
    d.gate.wake(slot_x2)
    d.gate.wake(slot_x3)
    _, refused = d.connect("10.0.0.1")  # its two are busy: refused, though the listener has room
    assert refused is None and not other.closed
    assert d.connect("10.0.0.2")[1] is not None  # another address is not affected
    stats = d.gate.statistics()
    assert (stats.refused_address_full, stats.refused_listener_full, stats.evicted) == (1, 0, 1)


def test_a_flood_from_one_address_leaves_the_rest_of_the_listener_to_others() -> None:
    d = door(8, 4)
    flood = [d.connect("10.0.0.66") for _ in range(1000)]
    assert sum(not sock.closed for sock, _ in flood) == 4
    operators = [d.connect("10.0.0.1") for _ in range(4)]
    assert all(slot is not None and not sock.closed for sock, slot in operators)
    assert d.gate.statistics().open == 8


def test_release_is_idempotent_and_a_released_slot_is_not_closed_again() -> None:
    d = door(1, 1)
    sock, slot = d.connect("10.0.0.1")
    assert slot is not None
    d.gate.release(slot)
    d.gate.release(slot)
    d.gate.rest(slot)  # (a server's late word on a closed connection changes nothing)
    assert d.gate.statistics().open == 0 and d.gate.idle_slots() == []
    assert d.connect("10.0.0.1")[1] is not None and not sock.closed


def test_a_peer_address_is_counted_by_its_ip_an_ipv6_one_by_its_64() -> None:
    assert address_of(("10.1.2.3", 5)) == "10.1.2.3"
    assert address_of(("2001:db8::1", 5, 0, 0)) == address_of(("2001:db8::ffff:1", 6, 0, 0)) == "2001:db8::/64"
    assert address_of(("2001:db8:0:1::1", 5, 0, 0)) != address_of(("2001:db8::1", 5, 0, 0))
    assert address_of(("::ffff:10.1.2.3", 5, 0, 0)) == "10.1.2.3"
    assert address_of(None) == address_of("") == ""


def test_the_limit_is_logged_at_most_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    d = door(2, 2, log_every_s=60.0)
    with caplog.at_level(logging.WARNING, logger="llmgw.gate"):
        for _ in range(100):
            d.connect("10.0.0.1")
        assert len(caplog.records) == 1
        assert "1 idle connection(s) closed to make room, 0 new one(s) refused" in caplog.records[0].getMessage()
        d.now[0] = 59.0
        d.connect("10.0.0.1")
        assert len(caplog.records) == 1
        d.now[0] = 60.0
        d.connect("10.0.0.1")
        assert len(caplog.records) == 2
        line = caplog.records[1].getMessage()
    assert "in the last 60 s: 99 idle connection(s) closed to make room" in line
    assert line.startswith("gateway at its connection limit (2 connections, 2 per address)")
