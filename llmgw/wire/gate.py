"""The door of a listener (the admin API's, the gateway's): how many client connections it holds, in all and
per peer address, within the process's open-files limit; which idle one makes room; what it refuses.

At a limit (the listener's, or the new connection's address's) the oldest idle connection (at the address
limit, that address's own) is closed to make room; with none idle the new one is closed at once. Either is
counted (`statistics()`, the role's metrics) and logged at most once per `listener_limit_log_s`. So a flood
of idle connections costs its sender its own oldest ones, one address never holds more than half of a
listener, and an operator's GET /api/v1/status still gets in (issue 20). Idle: waiting for a request (a
fresh connection included); only the server marks a connection busy or idle (`wake`, `rest`).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import resource
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio

from llmgw.domain.limits import LIMITS, Caps, Limits, Listener, connection_caps
from llmgw.domain.timeouts import TIMEOUTS

__all__ = ["ConnectionGate", "GateStats", "Slot", "accept_loop", "configured_limits", "listener_gate",
           "raise_fd_limit"]

_log = logging.getLogger("llmgw.gate")

LIMITS_ENV = "LLMGW_LIMITS"
_NAMES: dict[Listener, str] = {"admin": "admin API", "gateway": "gateway"}
_UNLIMITED = Caps(1 << 62, 1 << 62)


def raise_fd_limit() -> int:
    """Raise this process's soft open-files limit to the hard one and return it: each gateway request in
    flight holds two sockets (client and engine), and the usual soft limit of 1,024 would refuse
    connections at ~500 concurrent. (Python's own code and pysyncobj wait with poll/epoll, never select.)"""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as error:
            _log.warning("cannot raise the open-files limit from %d: %s", soft, error)
    return soft if soft != resource.RLIM_INFINITY and soft > 0 else 1 << 20


def configured_limits(environ: dict[str, str] | None = None) -> Limits:
    """The limits table with `LLMGW_LIMITS` (`name=count,...`) applied; ValueError says what is wrong."""
    spec = (os.environ if environ is None else environ).get(LIMITS_ENV, "")
    try:
        return LIMITS.overridden(spec) if spec else LIMITS
    except ValueError as error:
        raise ValueError(f"{LIMITS_ENV}: {error}") from None


def address_of(peer: Any) -> str:
    """The key a peer's connections are counted under: its IP address, an IPv6 one by its /64 (one
    machine's share of addresses), an IPv4-mapped IPv6 one as IPv4; "" for a peer without one."""
    if not isinstance(peer, tuple) or not peer or not isinstance(peer[0], str):
        return ""
    host = peer[0]
    if ":" not in host:
        return host
    try:
        ip = ipaddress.IPv6Address(host.partition("%")[0])
    except ValueError:
        return host
    if ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ipaddress.IPv6Network((int(ip) >> 64 << 64, 64)))


class _Address:
    __slots__ = ("key", "open", "idle")

    def __init__(self, key: str) -> None:
        self.key = key
        self.open = 0
        self.idle: dict[Slot, None] = {}  # oldest first


class Slot:
    """One admitted connection. `peer` is its (host, port); `scope` the cancel scope its server waits for
    a request in, if any (cancelled to close it where it has no socket: tests over memory streams)."""

    __slots__ = ("address", "peer", "socket", "scope", "open", "idle", "idle_since")

    def __init__(self, address: _Address, peer: tuple[str, int] | None, sock: Any) -> None:
        self.address = address
        self.peer = peer
        self.socket = sock
        self.scope: trio.CancelScope | None = None
        self.open = True
        self.idle = False
        self.idle_since = 0.0  # trio time its server began waiting for a request (while `scope` is set)

    def close(self) -> None:
        """Close now: the socket (its descriptor is free at once, a task reading it wakes), or the scope."""
        if self.socket is not None:
            self.socket.close()
        if self.scope is not None:
            self.scope.cancel()


@dataclass(frozen=True)
class GateStats:
    """What one listener holds and has refused, for its role's metrics."""

    listener: Listener
    open: int
    limit: int
    per_address: int
    refused_listener_full: int
    refused_address_full: int
    evicted: int


class ConnectionGate:
    """Counts a listener's connections against its caps; see the module's docstring."""

    def __init__(self, listener: Listener, caps: Caps = _UNLIMITED, *,
                 log_every_s: float = TIMEOUTS.listener_limit_log_s, limits: Limits = LIMITS,
                 open_files: int = 0, clock: Callable[[], float] = time.monotonic) -> None:
        self.listener = listener
        self.name = _NAMES[listener]
        self.caps = caps
        self.limits = limits  # what `caps` came from, with `open_files` (0: not read)
        self.open_files = open_files
        self.open = 0
        self.refused = {"listener_full": 0, "address_full": 0}
        self.evicted = 0
        self._idle: dict[Slot, None] = {}  # oldest first
        self._addresses: dict[str, _Address] = {}
        self.log_every_s = log_every_s
        self._clock = clock
        self._next_log = -float("inf")
        self._logged = (0, 0)  # (refused, evicted) at the last log line

    # --- the accept side ------------------------------------------------------------------------

    def admit(self, stream: Any) -> Slot | None:
        """A slot for a connection just accepted (`stream.socket` its socket, if it has one), after closing
        an idle one to make room if need be; None: refused (the caller closes the stream)."""
        sock = getattr(stream, "socket", None)
        try:
            name = sock.getpeername() if sock is not None else None
            peer = (name[0], name[1]) if isinstance(name, tuple) else None
        except OSError:  # gone already
            peer = None
        key = address_of(peer)
        address = self._addresses.get(key)
        if address is None:
            address = self._addresses[key] = _Address(key)
        if address.open >= self.caps.per_address:
            if not address.idle:
                self._refuse("address_full", address)
                return None
            self._evict(next(iter(address.idle)))
        if self.open >= self.caps.connections:
            if not self._idle:
                self._refuse("listener_full", address)
                return None
            self._evict(next(iter(self._idle)))
        self._addresses[key] = address  # (again: making room may have closed its last other connection)
        slot = Slot(address, peer, sock)
        self.open += 1
        address.open += 1
        self.rest(slot)  # idle until its first request begins
        return slot

    def _refuse(self, reason: str, address: _Address) -> None:
        self.refused[reason] += 1
        if not address.open:
            del self._addresses[address.key]
        self._note(address)

    def _evict(self, slot: Slot) -> None:
        self.evicted += 1
        address = slot.address
        self.release(slot)
        slot.close()
        self._note(address)

    def _note(self, address: _Address) -> None:
        now = self._clock()
        if now < self._next_log:
            return
        refused, evicted = sum(self.refused.values()), self.evicted
        since = "" if self._next_log == -float("inf") else f" in the last {self.log_every_s:g} s"
        self._next_log = now + self.log_every_s
        was_refused, was_evicted = self._logged
        self._logged = (refused, evicted)
        _log.warning("%s at its connection limit (%d connections, %d per address%s)%s: %d idle connection(s) "
                     "closed to make room, %d new one(s) refused; address %s holds %d; see docs/operations.md "
                     "(Limits)", self.name, self.caps.connections, self.caps.per_address,
                     f"; open-files limit {self.open_files}" if self.open_files else "", since,
                     evicted - was_evicted, refused - was_refused, address.key or "(none)", address.open)

    # --- the server's side: a connection's life ---------------------------------------------------

    def rest(self, slot: Slot) -> None:
        """The connection waits for a request: the first to close when room is needed."""
        if slot.open and not slot.idle:
            slot.idle = True
            self._idle[slot] = None
            slot.address.idle[slot] = None

    def wake(self, slot: Slot) -> None:
        """A request began on the connection: it is not closed to make room."""
        if slot.idle:
            slot.idle = False
            del self._idle[slot]
            del slot.address.idle[slot]

    def release(self, slot: Slot) -> None:
        """The connection is closed (or closing: its descriptor is free or about to be). Idempotent."""
        if not slot.open:
            return
        self.wake(slot)
        slot.open = False
        self.open -= 1
        address = slot.address
        address.open -= 1
        if not address.open:
            del self._addresses[address.key]

    def idle_slots(self) -> list[Slot]:
        return list(self._idle)

    def statistics(self) -> GateStats:
        return GateStats(self.listener, self.open, self.caps.connections, self.caps.per_address,
                         self.refused["listener_full"], self.refused["address_full"], self.evicted)


# This process's gates (those still referenced): a listener beside the other kind gets a smaller share.
_GATES: weakref.WeakSet[ConnectionGate] = weakref.WeakSet()


def listener_gate(listener: Listener, *, log_every_s: float, limits: Limits | None = None,
                  open_files: int | None = None) -> ConnectionGate:
    """The gate of one of this process's listeners: its caps from `limits` (default: the table with
    LLMGW_LIMITS applied), the open-files limit (default: this process's, raised to the hard one), and
    whether the other kind of listener runs in this process too (`llmgw up`: the one already made
    has its caps lowered now, before it holds more than a few connections)."""
    limits = limits if limits is not None else configured_limits()
    open_files = open_files if open_files is not None else raise_fd_limit()
    gate = ConnectionGate(listener, _UNLIMITED, log_every_s=log_every_s, limits=limits, open_files=open_files)
    _GATES.add(gate)
    beside = len({g.listener for g in _GATES}) > 1
    for g in list(_GATES):
        caps = connection_caps(g.limits, g.listener, g.open_files, beside)
        if g is gate or caps != g.caps:
            g.caps = caps
            _log.info("%s: at most %d client connections, %d per address (open-files limit %d, %d kept for "
                      "the process's own work%s)", g.name, caps.connections, caps.per_address, g.open_files,
                      g.limits.descriptors_reserved, "; beside the other listener" if beside else "")
    return gate


async def accept_loop(listener: trio.SocketListener, gate: ConnectionGate, nursery: trio.Nursery,
                      handler: Callable[[trio.SocketStream, Slot], Any], retry_s: float) -> None:
    """Accept connections on `listener` for ever, each through `gate`, then `handler(stream, slot)` in
    `nursery`. A failed accept (out of descriptors after all) waits `retry_s`: the clients' SYNs wait in
    the backlog; it is logged at most as often as the gate's own lines."""
    next_log = -float("inf")
    while True:
        try:
            stream = await listener.accept()
        except OSError as error:
            if (now := time.monotonic()) >= next_log:
                next_log = now + gate.log_every_s
                _log.warning("%s: accepting a connection failed: %s", gate.name, error)
            await trio.sleep(retry_s)
            continue
        slot = gate.admit(stream)
        if slot is None:
            stream.socket.close()
            continue
        nursery.start_soon(_handle, handler, gate, stream, slot)


async def _handle(handler: Callable[[trio.SocketStream, Slot], Any], gate: ConnectionGate,
                  stream: trio.SocketStream, slot: Slot) -> None:
    """`handler`, then the stream closed and its slot given back, however it ended (cancelled before it
    began included: trio's own `serve_listeners` closes each stream so too)."""
    try:
        await handler(stream, slot)
    finally:
        try:
            await trio.aclose_forcefully(stream)
        finally:
            gate.release(slot)
