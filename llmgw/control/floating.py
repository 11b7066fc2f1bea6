"""The floating address: `IpFloatingAddress` (`ip addr` + gratuitous ARP, the real seam) and
`FloatingDuty`, the task that keeps "this member leads" and "this machine holds it" equal.
"""

from __future__ import annotations

import ipaddress
import logging
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import Any

import trio

from llmgw.domain.timeouts import TIMEOUTS, Timeouts
from llmgw.interfaces import FloatingAddress, FloatingAddressError
from llmgw.startup import CannotStart

log = logging.getLogger("llmgw.control.floating")

# What `ip` prints when the wanted state is already there (iproute2 6.x, then older ones).
_ALREADY_ADDED = ("Address already assigned", "File exists")
_ALREADY_GONE = ("Address not found", "Cannot assign requested address")
_INSTALL_HINT = {"ip": "iproute2", "arping": "iputils-arping"}


def parse_address(text: str) -> ipaddress.IPv4Interface:
    """`ADDR/PREFIX` as an IPv4 interface; `ValueError` with words otherwise."""
    if "/" not in text:
        raise ValueError(f"floating address {text!r} has no prefix length: give ADDR/PREFIX, "
                         "e.g. 10.0.0.5/24 (the subnet's length) or 10.0.0.5/32")
    try:
        iface = ipaddress.ip_interface(text)
    except ValueError:
        raise ValueError(f"floating address {text!r} is not ADDR/PREFIX (e.g. 10.0.0.5/24)") from None
    if not isinstance(iface, ipaddress.IPv4Interface):
        # Neighbours learn an IPv6 owner from unsolicited neighbour advertisements, which arping does not send.
        raise ValueError(f"floating address {text!r}: only IPv4 is supported (its move is announced by gratuitous ARP)")
    return iface


class IpFloatingAddress:
    """A `FloatingAddress` on a Linux interface, through `ip` and `arping` (needs CAP_NET_ADMIN).

    `command_prefix` runs each command through another (tests: `ip netns exec NS`)."""

    def __init__(self, address: str, interface: str, *, command_prefix: Sequence[str] = (),
                 timeouts: Timeouts = TIMEOUTS) -> None:
        if not interface or "/" in interface or interface != interface.strip():
            raise ValueError(f"floating interface {interface!r} is not an interface name")
        self.address = parse_address(address)
        self.interface = interface
        self._prefix = list(command_prefix)
        self._timeouts = timeouts

    def describe(self) -> str:
        return f"{self.address.with_prefixlen} on {self.interface}"

    async def claim(self) -> None:
        cidr = self.address.with_prefixlen
        added = await self._run("ip", "addr", "add", cidr, "dev", self.interface, ok_if=_ALREADY_ADDED)
        # Neighbours may still map the address to the previous owner's MAC: announce the move.
        announced = await self._run("arping", "-U", "-c", "1", "-I", self.interface, str(self.address.ip))
        if not announced.ok:
            raise FloatingAddressError(
                f"{self.describe()}: {'added' if added.ok else 'already here'}, but the gratuitous ARP failed "
                f"({announced.words}); neighbours may send to the previous holder until their ARP cache expires")

    async def release(self) -> None:
        await self._run("ip", "addr", "del", self.address.with_prefixlen, "dev", self.interface, ok_if=_ALREADY_GONE)

    async def holds(self) -> bool:
        shown = await self._run("ip", "-o", "-4", "addr", "show", "dev", self.interface)
        for line in shown.stdout.splitlines():
            words = line.split()
            for i, word in enumerate(words[:-1]):
                if word != "inet":
                    continue
                found = ipaddress.ip_interface(words[i + 1])
                if found.ip != self.address.ip:
                    continue
                if found.network.prefixlen != self.address.network.prefixlen:
                    raise FloatingAddressError(
                        f"{self.describe()}: {found.with_prefixlen} is on {self.interface} with another prefix "
                        f"length; remove it (ip addr del {found.with_prefixlen} dev {self.interface}) "
                        "or give that length")
                return True
        return False

    async def _run(self, *argv: str, ok_if: Sequence[str] = ()) -> _Ran:
        """Run one command, bounded by `floating_command_s`. A failure raises with the command's
        own words, except an outcome in `ok_if` (the wanted state was already there) and a failed
        arping, which the caller words (the address is on then)."""
        cmd = [*self._prefix, *argv]
        shown = " ".join(argv)
        limit = self._timeouts.floating_command_s
        try:
            with trio.fail_after(limit):
                done = await trio.run_process(cmd, capture_stdout=True, capture_stderr=True, check=False,
                                              stdin=subprocess.DEVNULL)
        except trio.TooSlowError:
            raise FloatingAddressError(f"{self.describe()}: `{shown}` did not finish within {limit:g} s") from None
        except FileNotFoundError as e:
            missing = e.filename or cmd[0]
            hint = _INSTALL_HINT.get(str(missing), "")
            raise FloatingAddressError(f"{self.describe()}: `{missing}` is not installed"
                                       + (f" (Debian: apt-get install {hint})" if hint else "")) from None
        except OSError as e:
            raise FloatingAddressError(f"{self.describe()}: `{shown}` could not run: {e.strerror or e}") from None
        ran = _Ran(done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace"))
        if ran.ok or argv[0] == "arping" or any(text in ran.stderr for text in ok_if):
            return ran
        hint = "; run control as root or give it CAP_NET_ADMIN" if "not permitted" in ran.stderr else ""
        raise FloatingAddressError(f"{self.describe()}: `{shown}` failed ({ran.words}){hint}")


class _Ran:
    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.ok = returncode == 0
        self.stdout = stdout
        self.stderr = stderr
        last = (stderr.strip() or stdout.strip()).splitlines()
        self.words = f"exit {returncode}" + (f": {last[-1].strip()}" if last else "")


class FloatingDuty:
    """Holds the floating address exactly while `is_leader()` says this member leads.

    Level-triggered: each pass asks the system whether the address is here and compares that
    with leadership, so an address someone removed is claimed again and a stale one (left by a
    member killed while it led) is released. A pass runs when leadership changes (checked every
    `floating_leader_poll_s`) and at least every `floating_verify_s`. On stop it releases."""

    def __init__(self, floating: FloatingAddress, is_leader: Callable[[], bool], *,
                 timeouts: Timeouts = TIMEOUTS, clock: Callable[[], float] = time.time) -> None:
        self.floating = floating
        self._is_leader = is_leader
        self._timeouts = timeouts
        self._clock = clock
        self._leader: bool | None = None
        self._held: bool | None = None  # None: not asked yet, or the last question failed
        self._error: str | None = None
        self._error_since: float | None = None
        self._failures = 0
        self._checked_at: float | None = None

    def status(self) -> dict[str, Any]:
        """For the admin API: what should be, what is (None = unknown), and the last failure."""
        return {
            "address": self.floating.describe(),
            "leader": self._leader,
            "held": self._held,
            "ok": self._error is None and self._held is not None and self._held == self._leader,
            "error": self._error,
            "error_since": self._error_since,
            "failures": self._failures,
            "checked_at": self._checked_at,
        }

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            await self.floating.holds()  # a wrong interface, a missing `ip`: a start error, not a log line later
        except FloatingAddressError as e:
            raise CannotStart(f"floating address: {e}") from None
        try:
            task_status.started()
            while True:
                await self.check()
                await self._until_leadership_changes()
        finally:
            with trio.CancelScope(shield=True):
                await self._release_on_stop()

    async def check(self) -> None:
        """One pass: make "held" equal "leads"."""
        leads = self._is_leader()
        self._leader = leads
        held: bool | None = None  # unknown until the system has answered
        try:
            held = await self.floating.holds()
            # A claim that failed is retried even if the address is on: its announcement may be missing.
            if leads and (not held or self._error is not None):
                await self.floating.claim()
                if self._held and not held:  # this member had it, and did not remove it
                    log.warning("floating address %s was removed from outside while this member leads: "
                                "claimed again", self.floating.describe())
                else:
                    log.info("this member leads: floating address %s claimed", self.floating.describe())
                held = True
            elif not leads and held:
                await self.floating.release()
                held = False
                log.info("this member does not lead: floating address %s released", self.floating.describe())
        except FloatingAddressError as e:
            self._failed(str(e), leads)
        else:
            if self._error is not None:
                log.info("floating address %s is right again (%s)", self.floating.describe(),
                         "held" if leads else "not held")
            self._error = self._error_since = None
        self._held = held
        self._checked_at = self._clock()

    def _failed(self, why: str, leads: bool) -> None:
        self._failures += 1
        if why != self._error:  # the same failure each pass is logged once, and counted
            log.error("floating address %s (this member %s): %s", self.floating.describe(),
                      "leads" if leads else "does not lead", why)
            self._error_since = self._clock()
        self._error = why

    async def _until_leadership_changes(self) -> None:
        was = self._leader
        with trio.move_on_after(self._timeouts.floating_verify_s):
            while self._is_leader() == was:
                await trio.sleep(self._timeouts.floating_leader_poll_s)

    async def _release_on_stop(self) -> None:
        with trio.move_on_after(self._timeouts.floating_command_s):
            try:
                await self.floating.release()
            except FloatingAddressError as e:
                log.error("stopping: floating address %s not released: %s", self.floating.describe(), e)
                return
            if self._held or self._leader:  # a claim cut short by the stop may have put it on
                log.info("stopping: floating address %s released", self.floating.describe())
            self._held = False
            return
        log.error("stopping: floating address %s not released within %g s", self.floating.describe(),
                  self._timeouts.floating_command_s)
