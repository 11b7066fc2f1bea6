"""The floating address follows leadership (`FloatingDuty` with the fake and a MockClock), and the
real `IpFloatingAddress` words its failures (commands run through a prefix that stands in for them).
The real address on real interfaces: tests/integration/test_floating_netns.py."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from llmgw.control.floating import FloatingDuty, IpFloatingAddress, parse_address
from llmgw.domain.timeouts import TIMEOUTS
from llmgw.interfaces import FloatingAddressError
from llmgw.startup import CannotStart
from llmgw.testing.floating import FakeFloatingAddress, LeaderFlag

T = TIMEOUTS
# Long enough for the duty to notice a change of leadership and act on it.
NOTICE_S = 3 * T.floating_leader_poll_s


def run_mock(test: Callable[[], object]) -> None:
    trio.run(test, clock=trio.testing.MockClock(autojump_threshold=0))  # type: ignore[arg-type]


@asynccontextmanager
async def running(duty: FloatingDuty) -> AsyncIterator[trio.Nursery]:
    async with trio.open_nursery() as nursery:
        await nursery.start(duty.run)
        yield nursery
        nursery.cancel_scope.cancel()


def test_claims_on_becoming_leader_and_releases_on_losing_it() -> None:
    async def main() -> None:
        vip, leader = FakeFloatingAddress(), LeaderFlag(False)
        duty = FloatingDuty(vip, leader, clock=trio.current_time)
        async with running(duty):
            await trio.sleep(T.floating_verify_s * 2)
            assert not vip.held and "claim" not in vip.calls
            assert duty.status()["held"] is False and duty.status()["ok"]

            leader.leads = True
            await trio.sleep(NOTICE_S)  # well before the verify interval: a change is acted on at once
            assert vip.held and vip.announcements == 1
            assert duty.status() | {"checked_at": None} == {
                "address": "10.213.0.100/24 on fake0", "leader": True, "held": True, "ok": True, "error": None,
                "error_since": None, "failures": 0, "checked_at": None}

            leader.leads = False
            await trio.sleep(NOTICE_S)
            assert not vip.held
            assert duty.status()["held"] is False and duty.status()["leader"] is False

    run_mock(main)


def test_claims_again_when_someone_removed_it(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        vip, leader = FakeFloatingAddress(), LeaderFlag(True)
        duty = FloatingDuty(vip, leader)
        async with running(duty):
            await trio.sleep(NOTICE_S)
            assert vip.held and vip.announcements == 1
            vip.held = False  # an operator's `ip addr del`
            await trio.sleep(T.floating_verify_s + NOTICE_S)
            assert vip.held and vip.announcements == 2

    with caplog.at_level(logging.INFO, logger="llmgw.control.floating"):
        run_mock(main)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned == ["floating address 10.213.0.100/24 on fake0 was removed from outside while this member leads: "
                      "claimed again"]


def test_a_follower_releases_an_address_left_behind() -> None:
    """A member killed while it led comes back as a follower: the address it left is removed."""
    async def main() -> None:
        vip, leader = FakeFloatingAddress(), LeaderFlag(False)
        vip.held = True
        async with running(FloatingDuty(vip, leader)):
            await trio.sleep(NOTICE_S)
            assert not vip.held

    run_mock(main)


def test_releases_on_stop() -> None:
    async def main() -> None:
        vip, leader = FakeFloatingAddress(), LeaderFlag(True)
        async with running(FloatingDuty(vip, leader)):
            await trio.sleep(NOTICE_S)
            assert vip.held
        assert not vip.held and vip.calls[-1] == "release"

    run_mock(main)


def test_a_failed_claim_is_logged_once_shown_in_status_and_retried(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        vip, leader = FakeFloatingAddress(), LeaderFlag(True)
        vip.fail_claims = "`ip addr add` failed (exit 2: RTNETLINK answers: Operation not permitted)"
        duty = FloatingDuty(vip, leader, clock=trio.current_time)
        async with running(duty):
            await trio.sleep(T.floating_verify_s * 3 + NOTICE_S)
            status = duty.status()
            assert not vip.held
            assert status["ok"] is False and status["held"] is False and status["leader"] is True
            assert "Operation not permitted" in status["error"]
            assert status["failures"] == 4 and status["error_since"] == pytest.approx(0, abs=NOTICE_S)

            vip.fail_claims = None
            await trio.sleep(T.floating_verify_s + NOTICE_S)
            assert vip.held
            assert duty.status()["ok"] and duty.status()["error"] is None

    with caplog.at_level(logging.INFO, logger="llmgw.control.floating"):
        run_mock(main)
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, errors  # the same failure each pass: one line, and a count in status
    assert "10.213.0.100/24 on fake0 (this member leads)" in errors[0] and "Operation not permitted" in errors[0]
    assert any("is right again" in r.getMessage() for r in caplog.records)


def test_an_unknown_holding_is_shown_as_unknown() -> None:
    """holds() failing later (not at start): `held` is None, never False."""
    async def main() -> None:
        vip, leader = FakeFloatingAddress(), LeaderFlag(False)
        duty = FloatingDuty(vip, leader)
        async with running(duty):
            vip.fail_holds = "`ip -o -4 addr show dev fake0` failed (exit 1: Device \"fake0\" does not exist.)"
            await trio.sleep(T.floating_verify_s + NOTICE_S)
            assert duty.status()["held"] is None and duty.status()["ok"] is False

    run_mock(main)


def test_an_address_it_cannot_check_at_start_stops_the_start() -> None:
    async def main() -> None:
        vip = FakeFloatingAddress()
        vip.fail_holds = "`ip -o -4 addr show dev fake0` failed (exit 1: Device \"fake0\" does not exist.)"
        with pytest.raises(CannotStart, match=r"floating address: .*fake0.* does not exist"):
            await FloatingDuty(vip, LeaderFlag(True)).run()
        assert "release" not in vip.calls  # nothing was claimed, so nothing is undone

    run_mock(main)


# --- the real class: addresses and words ----------------------------------------------------


@pytest.mark.parametrize(("text", "words"), [
    ("10.0.0.5", "no prefix length"),
    ("10.0.0.500/24", "is not ADDR/PREFIX"),
    ("fd00::5/64", "only IPv4"),
])
def test_parse_address_refuses_with_words(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        parse_address(text)


def test_parse_address_keeps_the_prefix() -> None:
    assert parse_address("10.0.0.5/24").with_prefixlen == "10.0.0.5/24"
    assert IpFloatingAddress("10.0.0.5/32", "eth0").describe() == "10.0.0.5/32 on eth0"


def _real(prefix: list[str], command_s: float = T.floating_command_s) -> IpFloatingAddress:
    return IpFloatingAddress("10.213.0.100/24", "vip0", command_prefix=prefix,
                             timeouts=dataclasses.replace(T, floating_command_s=command_s))


def _sh(script: str) -> list[str]:
    """A prefix that runs `script` in place of the command (which it gets as "$@")."""
    return ["sh", "-c", script, "sh"]


def test_a_command_past_its_timeout_is_an_error_that_says_so() -> None:
    async def main() -> None:
        vip = _real(_sh("exec sleep 30"), command_s=0.2)
        with pytest.raises(FloatingAddressError, match=r"`ip -o -4 addr show dev vip0` did not finish within 0.2 s"):
            await vip.holds()

    trio.run(main)


def test_a_refused_command_is_an_error_with_its_words_and_a_hint() -> None:
    async def main() -> None:
        vip = _real(_sh('echo "RTNETLINK answers: Operation not permitted" >&2; exit 2'))
        with pytest.raises(FloatingAddressError, match=r"`ip addr add 10.213.0.100/24 dev vip0` failed "
                           r"\(exit 2: RTNETLINK answers: Operation not permitted\); run control as root"):
            await vip.claim()

    trio.run(main)


def test_a_missing_program_is_named_with_its_package() -> None:
    async def main() -> None:
        vip = _real(["/nonexistent/llmgw-test-ip"])
        with pytest.raises(FloatingAddressError, match=r"`/nonexistent/llmgw-test-ip` is not installed"):
            await vip.holds()
        vip = _real(_sh('if [ "$1" = arping ]; then exec /nonexistent/arping; fi'))
        with pytest.raises(FloatingAddressError, match=r"gratuitous ARP failed \(exit 127: .*not found\)"):
            await vip.claim()

    trio.run(main)


def test_already_there_and_already_gone_are_not_errors() -> None:
    async def main() -> None:
        added = _real(_sh('if [ "$1" = ip ]; then echo "Error: ipv4: Address already assigned." >&2; exit 2; fi'))
        await added.claim()  # and arping ran (the stand-in succeeded)
        gone = _real(_sh('echo "Error: ipv4: Address not found." >&2; exit 2'))
        await gone.release()

    trio.run(main)


def test_holds_reads_the_interface_and_refuses_a_different_prefix() -> None:
    def ip_shows(address: str) -> list[str]:
        lines = ["6: vip0    inet 10.213.0.1/24 scope global vip0\\       valid_lft forever",
                 f"6: vip0    inet {address} scope global secondary vip0\\       valid_lft forever",
                 "6: vip0    inet6 fe80::1/64 scope link \\       valid_lft forever"]
        return _sh("printf '%s\\n' " + " ".join(f"'{line}'" for line in lines))

    async def main() -> None:
        assert await _real(ip_shows("10.213.0.100/24")).holds() is True
        assert await _real(ip_shows("10.213.0.99/24")).holds() is False
        with pytest.raises(FloatingAddressError, match=r"10.213.0.100/32 is on vip0 with another prefix length"):
            await _real(ip_shows("10.213.0.100/32")).holds()

    trio.run(main)
