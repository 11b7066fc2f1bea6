"""The real floating address on real interfaces: three network namespaces this test makes (two
members and a client on one bridge), the real `ip` and `arping` run inside the members' namespaces.

Every address used lives only inside those namespaces (10.213.0.0/24); nothing is added to the
host's interfaces or routes. A loopback alias would prove nothing: Linux answers for all of 127/8.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio

from llmgw.control.floating import FloatingDuty, IpFloatingAddress
from llmgw.interfaces import FloatingAddressError
from llmgw.testing.floating import LeaderFlag

pytestmark = pytest.mark.slow

VIP = "10.213.0.100"
MEMBER_IPS = {"m1": "10.213.0.11/24", "m2": "10.213.0.12/24"}
CLIENT_IP = "10.213.0.2/24"
IFACE = "lan0"  # each member's side of its veth (inside its own namespace)


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


@dataclass
class Lan:
    client: str
    members: dict[str, str]  # m1/m2 -> namespace name

    def vip(self, member: str) -> IpFloatingAddress:
        return IpFloatingAddress(f"{VIP}/24", IFACE, command_prefix=["ip", "netns", "exec", self.members[member]])

    def answers(self) -> bool:
        """Whether the VIP answers a ping from the client's namespace (one try, one second)."""
        return sh("ip", "netns", "exec", self.client, "ping", "-n", "-c", "1", "-W", "1", VIP, check=False).returncode == 0

    def mac(self, member: str) -> str:
        return sh("ip", "-n", self.members[member], "-o", "link", "show", IFACE).stdout.split("link/ether")[1].split()[0]

    def client_thinks(self) -> str:
        """The MAC the client's neighbour table has for the VIP ("" if none)."""
        words = sh("ip", "-n", self.client, "neigh", "show", VIP).stdout.split()
        return words[words.index("lladdr") + 1] if "lladdr" in words else ""


def _why_no_netns() -> str | None:
    if os.geteuid() != 0:
        return "needs root: network namespaces and `ip addr add` need CAP_SYS_ADMIN and CAP_NET_ADMIN"
    probe = f"llmgw-probe-{os.getpid()}"
    try:
        done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        return None  # root without iproute2: a broken setup, which the tests report (not a skip)
    if done.returncode != 0:
        return f"`ip netns add` is not permitted here: {done.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30)
    return None


@pytest.fixture
def lan() -> Iterator[Lan]:
    why = _why_no_netns()
    if why:
        pytest.skip(why)
    missing = [prog for prog in ("ip", "ping", "arping") if shutil.which(prog) is None]
    if missing:  # root with namespaces: a setup to fix, not a reason to skip
        pytest.fail(f"missing {', '.join(missing)}: run .ci/system-packages.sh "
                    "(apt-get install iproute2 iputils-ping iputils-arping)")
    tag = f"llmgw-t{os.getpid()}"
    net = Lan(client=f"{tag}-client", members={m: f"{tag}-{m}" for m in MEMBER_IPS})
    made: list[str] = []
    try:
        for ns in (net.client, *net.members.values()):
            sh("ip", "netns", "add", ns)
            made.append(ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        # The bridge lives in the client's namespace; each veth is made inside the namespaces, never the host's.
        sh("ip", "-n", net.client, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", net.client, "addr", "add", CLIENT_IP, "dev", "br0")
        sh("ip", "-n", net.client, "link", "set", "br0", "up")
        # A neighbour entry may change at once (default: not within 1 s of its last update), so the
        # test sees the gratuitous ARP itself rather than the cache's lock time.
        sh("ip", "netns", "exec", net.client, "sysctl", "-qw", "net.ipv4.neigh.br0.locktime=0")
        for member, ns in net.members.items():
            port = f"to-{member}"
            sh("ip", "-n", ns, "link", "add", IFACE, "type", "veth", "peer", "name", port, "netns", net.client)
            sh("ip", "-n", net.client, "link", "set", port, "master", "br0")
            sh("ip", "-n", net.client, "link", "set", port, "up")
            sh("ip", "-n", ns, "addr", "add", MEMBER_IPS[member], "dev", IFACE)
            sh("ip", "-n", ns, "link", "set", IFACE, "up")
        yield net
    finally:
        for ns in made:  # deleting a namespace deletes the veths in it
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def test_a_claimed_address_answers_from_another_namespace_and_stops_when_released(lan: Lan) -> None:
    async def main() -> None:
        vip = lan.vip("m1")
        assert not await vip.holds()
        assert not lan.answers()
        await vip.claim()
        assert await vip.holds()
        assert lan.answers()
        await vip.claim()  # again: already there is not an error, and it is announced again
        await vip.release()
        assert not await vip.holds()
        assert not lan.answers()
        await vip.release()  # already gone is not an error

    trio.run(main)


def test_the_address_follows_leadership_and_its_move_is_announced(lan: Lan) -> None:
    """Two duties, one leader at a time: the client reaches the VIP on m1, then on m2 at once
    (its neighbour cache updated by m2's gratuitous ARP, not by expiry)."""
    async def main() -> None:
        leads = {"m1": LeaderFlag(True), "m2": LeaderFlag(False)}
        duties = {m: FloatingDuty(lan.vip(m), leads[m]) for m in leads}
        async with trio.open_nursery() as nursery:
            for duty in duties.values():
                await nursery.start(duty.run)
            await until(lambda: duties["m1"].status()["held"] is True)
            assert lan.answers()
            assert lan.client_thinks() == lan.mac("m1")

            leads["m1"].leads = False
            await until(lambda: duties["m1"].status()["held"] is False)
            leads["m2"].leads = True
            await until(lambda: duties["m2"].status()["held"] is True)
            assert lan.client_thinks() == lan.mac("m2")
            assert lan.answers()
            assert not await lan.vip("m1").holds()
            nursery.cancel_scope.cancel()
        # Stopped: each duty released the address on its way out.
        assert not await lan.vip("m2").holds()
        assert not lan.answers()

    trio.run(main)


def test_a_wrong_interface_is_an_error_with_words(lan: Lan) -> None:
    async def main() -> None:
        wrong = IpFloatingAddress(f"{VIP}/24", "nosuch0", command_prefix=["ip", "netns", "exec", lan.members["m1"]])
        with pytest.raises(FloatingAddressError, match=r'nosuch0.*Device "nosuch0" does not exist'):
            await wrong.holds()
        with pytest.raises(FloatingAddressError, match=r"`ip addr add 10.213.0.100/24 dev nosuch0` failed"):
            await wrong.claim()

    trio.run(main)


def test_llmgw_control_holds_the_address_while_it_serves(lan: Lan, tmp_path: Path) -> None:
    """`llmgw control --floating-address` as a process inside m1's namespace: a one-member group
    leads, so the client reaches the VIP; SIGTERM releases it. (Its ports are m1's own loopback.)"""
    out = (tmp_path / "control.out").open("wb")
    proc = subprocess.Popen(
        ["ip", "netns", "exec", lan.members["m1"], sys.executable, "-m", "llmgw", "control",
         "--state-dir", str(tmp_path / "state"), "--raft-addr", "127.0.0.1:7101", "--admin-addr", "127.0.0.1:7102",
         "--floating-address", f"{VIP}/24", "--floating-interface", IFACE],
        stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "LLMGW_ADMIN_KEY": "test-admin-key"})
    try:
        deadline = time.monotonic() + 30
        log = tmp_path / "control.out"
        while not ("floating address 10.213.0.100/24 on lan0 claimed" in log.read_text() and lan.answers()):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0, log.read_text()
        assert not lan.answers()
        assert "floating address 10.213.0.100/24 on lan0 released" in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        out.close()


async def until(condition: object, limit_s: float = 10.0) -> None:
    """Wait for a duty to act (each action is one or two real commands; arping takes ~1 s)."""
    assert callable(condition)
    with trio.fail_after(limit_s):
        while not condition():
            await trio.sleep(0.05)
