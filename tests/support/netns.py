"""Network namespaces a test makes, for partitions between real processes: nothing touches the
host's network, and everything vanishes with the test's processes.

`in_own_netns(body)` runs `body` in a thread moved into a new namespace (the *hub*): sockets the
thread opens and processes it starts live there. A `Fabric`, made in the hub, gives each member a
namespace of its own (held by a `sleep` process), joined to the hub by a veth pair on its own
/24: the member is 10.77.N.1, the hub 10.77.N.254, and the hub forwards between members. So every
packet from one member to another crosses the hub's routing, where `cut` drops it with a policy
rule (`ip rule ... blackhole`), one way or both, while the hub itself (the test's clients) still
reaches every member. `wrap(n)` is the command prefix that starts a process in member n's namespace
(`nsenter --net`: the process keeps its pid, so signals reach it). `seal(n)` leaves member n no route but to
the hub and the other members (an air-gapped site). `thread_in_own_netns()` moves the calling thread itself into
a new namespace for a block (and back after): a module's fixture keeps one fabric across its tests that way.

Needs CAP_SYS_ADMIN and CAP_NET_ADMIN (root in CI); `in_own_netns` skips the test, with the
reason, where namespaces are not permitted.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

CLONE_NEWNET = 0x40000000
SUBNET = "10.77"


class NetnsRefused(Exception):
    """This kernel or container does not let the test make network namespaces."""


def in_own_netns(body: Callable[[], None]) -> None:
    """Run `body` in a thread moved into a new network namespace with its loopback up; raises
    NetnsRefused (with the reason) where the kernel refuses, and whatever `body` raised."""
    libc = ctypes.CDLL(None, use_errno=True)
    outcome: dict[str, BaseException | str] = {}

    def thread() -> None:
        if libc.unshare(CLONE_NEWNET) != 0:
            outcome["refused"] = (f"a network namespace of its own is not permitted here (unshare(CLONE_NEWNET): "
                                  f"{os.strerror(ctypes.get_errno())}; needs CAP_SYS_ADMIN, e.g. root)")
            return
        try:
            ip("link", "set", "lo", "up")
            body()
        except BaseException as e:  # handed to the caller's thread, which raises it
            outcome["error"] = e

    worker = threading.Thread(target=thread, name="netns")
    worker.start()
    worker.join()
    if "refused" in outcome:
        raise NetnsRefused(str(outcome["refused"]))
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]


@contextmanager
def thread_in_own_netns() -> Iterator[None]:
    """The calling thread in a new network namespace (its loopback up) for the block, then back in the one it
    was in: for a module's fixture that keeps one namespace (and the fabric made in it) across its tests. Raises
    NetnsRefused where the kernel refuses."""
    libc = ctypes.CDLL(None, use_errno=True)
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        if libc.unshare(CLONE_NEWNET) != 0:
            raise NetnsRefused(f"a network namespace of its own is not permitted here (unshare(CLONE_NEWNET): "
                               f"{os.strerror(ctypes.get_errno())}; needs CAP_SYS_ADMIN, e.g. root)")
        try:
            ip("link", "set", "lo", "up")
            yield
        finally:
            if libc.setns(home, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "could not return to the test's own network namespace")
    finally:
        os.close(home)


def in_own_netns_or_skip(body: Callable[[], None]) -> None:
    import pytest

    try:
        in_own_netns(body)
    except NetnsRefused as e:
        pytest.skip(str(e))


def ip(*argv: str, prefix: tuple[str, ...] = ()) -> None:
    """One `ip` command, in the calling thread's namespace (or through `prefix`); its words if it fails."""
    run(*prefix, "ip", *argv)


def run(*argv: str) -> None:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise AssertionError(f"`{' '.join(argv)}` failed ({done.returncode}): {done.stderr.strip()}")


@dataclass
class Host:
    """One member's namespace: its address, and the process that holds the namespace open."""

    number: int
    holder: subprocess.Popen[bytes]

    @property
    def address(self) -> str:
        return f"{SUBNET}.{self.number}.1"

    @property
    def hub_address(self) -> str:
        return f"{SUBNET}.{self.number}.254"

    @property
    def wrap(self) -> list[str]:
        return ["nsenter", "-t", str(self.holder.pid), "--net", "--"]


@dataclass
class Fabric:
    """Member namespaces around the calling thread's (the hub), and the cuts between them."""

    hosts: dict[int, Host] = field(default_factory=dict)
    cuts: set[tuple[str, str]] = field(default_factory=set)  # (from, to) addresses dropped at the hub
    _pref: int = 1000

    def __post_init__(self) -> None:
        with open("/proc/sys/net/ipv4/ip_forward", "w") as f:
            f.write("1")

    def host(self, number: int) -> Host:
        """Member `number`'s namespace (made at the first call)."""
        if number in self.hosts:
            return self.hosts[number]
        holder = subprocess.Popen(["unshare", "--net", "sleep", "infinity"])
        mine = os.readlink("/proc/thread-self/ns/net")
        deadline = time.monotonic() + 30
        while True:  # until `unshare` has moved itself into the new namespace (then exec'd sleep)
            try:
                if os.readlink(f"/proc/{holder.pid}/ns/net") != mine and _execd(holder.pid):
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or holder.poll() is not None:
                raise AssertionError(f"the namespace holder for member {number} did not start")
            time.sleep(0.005)
        h = Host(number, holder)
        outside, inside = f"h{number}", f"m{number}"
        ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        ip("link", "set", inside, "netns", str(holder.pid))
        ip("addr", "add", f"{h.hub_address}/24", "dev", outside)
        ip("link", "set", outside, "up")
        pre = tuple(h.wrap)
        ip("link", "set", "lo", "up", prefix=pre)
        ip("addr", "add", f"{h.address}/24", "dev", inside, prefix=pre)
        ip("link", "set", inside, "up", prefix=pre)
        ip("route", "add", "default", "via", h.hub_address, prefix=pre)
        self.hosts[number] = h
        return h

    def seal(self, number: int) -> None:
        """Member `number`'s namespace with no default route: it reaches the hub and the other members (10.77/16)
        and nothing else (an air-gapped site)."""
        h = self.host(number)
        pre = tuple(h.wrap)
        ip("route", "del", "default", prefix=pre)
        ip("route", "add", f"{SUBNET}.0.0/16", "via", h.hub_address, prefix=pre)

    def cut(self, a: str, b: str, *, one_way: bool = False) -> None:
        """Drop every packet from address `a` to `b` (and from `b` to `a` unless `one_way`), on open
        connections too (a rule change invalidates the routes sockets cached)."""
        for pair in [(a, b)] if one_way else [(a, b), (b, a)]:
            if pair not in self.cuts:
                self._pref += 1
                ip("rule", "add", "pref", str(self._pref), "from", pair[0], "to", pair[1], "blackhole")
                self.cuts.add(pair)

    def isolate(self, a: str, others: list[str], *, one_way: str | None = None) -> None:
        """Cut `a` off from each of `others`: both ways, or only what `a` sends (`one_way="out"`)
        or only what it receives (`"in"`)."""
        for b in others:
            if one_way == "in":
                self.cut(b, a, one_way=True)
            else:
                self.cut(a, b, one_way=one_way == "out")

    def heal(self) -> None:
        """Remove every cut."""
        for src, dst in sorted(self.cuts):
            ip("rule", "del", "from", src, "to", dst, "blackhole")
        self.cuts.clear()

    def close(self) -> None:
        for h in self.hosts.values():
            if h.holder.poll() is None:
                h.holder.send_signal(signal.SIGKILL)
                h.holder.wait()
        self.hosts.clear()


def _execd(pid: int) -> bool:
    with open(f"/proc/{pid}/comm") as f:
        return f.read().strip() == "sleep"
