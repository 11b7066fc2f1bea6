"""A group of real `llmgw control` processes on loopback for tests and benchmarks: free ports, one
cluster secret, the first admin key, the session's test root CA (`--ca-root`: each member's admin API
serves TLS that the tests' SSL_CERT_FILE trusts); start, stop, SIGKILL, SIGSTOP/SIGCONT; who leads;
settled states.

Each member is one `python -m llmgw control` process with its own state dir and log file. The
first member's first start makes the group's secret and gets `LLMGW_ADMIN_KEY`; the others get a
copy of the secret (`--cluster-secret-file`). The waits are async (trio) so that writers can run
beside them; every wait is bounded and its failure carries the members' log tails.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import trio

from tests.support.processes import free_port
from llmgw.store.failpoints import lose_unflushed, write_controls
from tests.support.netns import Fabric
from tests.support.trust import ca_root_args, test_ca_root

ADMIN_KEY = "sk-cluster-admin"
# At import, before any client is made: a script (tests/bench) that starts members trusts them too (its
# httpx clients and the processes it starts read SSL_CERT_FILE). Under pytest, conftest made it already.
test_ca_root()
T = TypeVar("T")


@dataclass
class Member:
    """One `llmgw control` process. Its Raft and admin ports are fixed at creation: a restart reuses them."""

    name: str
    state_dir: Path
    raft_addr: str = field(default_factory=lambda: f"127.0.0.1:{free_port()}")
    admin_port: int = field(default_factory=free_port)
    host: str = "127.0.0.1"
    wrap: list[str] = field(default_factory=list)  # a command prefix: e.g. nsenter into its namespace
    failpoints: Path | None = None  # its LLMGW_FAILPOINTS directory (llmgw/store/failpoints.py)
    clock_offset_s: float = 0.0  # its store clock's offset, through the failpoints
    proc: subprocess.Popen[bytes] | None = None
    paused: bool = False
    starts: int = 0
    code: Path | None = None  # the llmgw it runs: a tree holding the `llmgw` package (PYTHONPATH); None: this one
    # Or a release file (a zipapp) it runs, with `python` (a Python without our dependencies, as a machine has).
    pyz: Path | None = None
    python: str = sys.executable
    env: dict[str, str] = field(default_factory=dict)  # more environment for each of its starts

    @property
    def url(self) -> str:
        """Its admin URL: TLS, with a certificate of the group's CA (under the session's test root)."""
        return f"https://{self.host}:{self.admin_port}"

    @property
    def raft_dir(self) -> Path:
        return self.state_dir / "raft"

    @property
    def log(self) -> Path:
        return self.state_dir.parent / f"{self.name}.log"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, peers: Iterable[str], *, env: dict[str, str] | None = None, extra: Iterable[str] = ()) -> None:
        args = ["control", "--state-dir", str(self.state_dir), "--raft-addr", self.raft_addr,
                "--admin-addr", f"{self.host}:{self.admin_port}", *[a for p in peers for a in ("--peer", p)],
                *ca_root_args(), *extra]
        env = {**os.environ, **self.env, **(env or {})}
        if self.code is not None:
            env["PYTHONPATH"] = str(self.code)
        if self.failpoints is not None:
            env["LLMGW_FAILPOINTS"] = str(self.failpoints)
        with self.log.open("ab") as out:
            out.write(f"=== start {self.starts + 1}: llmgw {' '.join(args)}"
                      f"{f' (the llmgw in {self.code})' if self.code is not None else ''}"
                      f"{f' (from {self.pyz})' if self.pyz is not None else ''}\n".encode())
            out.flush()
            # In its tree: `python -m` puts the working directory before PYTHONPATH.
            program = [self.python, str(self.pyz)] if self.pyz is not None else [sys.executable, "-m", "llmgw"]
            self.proc = subprocess.Popen([*self.wrap, *program, *args], stdout=out,
                                         stderr=subprocess.STDOUT, env=env,
                                         cwd=self.code if self.code is not None else None)
        self.paused = False
        self.starts += 1

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            if sig == signal.SIGSTOP:
                self.paused = True
            elif sig == signal.SIGCONT:
                self.paused = False

    def kill(self) -> None:
        """SIGKILL, and reap it (immediate: the kernel ends it at once, paused or not)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.paused = False

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM (SIGCONT first if paused); SIGKILL after `timeout`. Returns the exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            if self.paused:
                self.signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else "(no log)"


class ClusterError(AssertionError):
    """A wait on the group ran out; the message has the members' log tails."""


class Cluster:
    """`size` members under `root`. `start()` starts them and waits until each is healthy and announced."""

    def __init__(self, root: Path, size: int = 3, *, admin_key: str = ADMIN_KEY, fabric: Fabric | None = None,
                 failpoints: bool = False) -> None:
        """`fabric`: each member in a network namespace of its own (tests/support/netns.py), at
        10.77.N.1, Raft on port 7000 and the admin API on 8000; else all on 127.0.0.1, free ports.
        `failpoints`: each member started with LLMGW_FAILPOINTS=ROOT/failpoints-mN."""
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.admin_key = admin_key
        self.fabric = fabric
        self.members = []
        for i in range(1, size + 1):
            m = Member(f"m{i}", root / f"m{i}")
            if fabric is not None:
                h = fabric.host(i)
                m.host, m.wrap, m.raft_addr, m.admin_port = h.address, h.wrap, f"{h.address}:7000", 8000
            if failpoints:
                m.failpoints = root / f"failpoints-m{i}"
            self.members.append(m)
        self.headers = {"Authorization": f"Bearer {admin_key}"}
        # More flags for each start of a member (e.g. a journal compaction threshold drawn per start).
        self.every_start: Callable[[Member], list[str]] | None = None

    @property
    def secret_file(self) -> Path:
        return self.members[0].state_dir / "cluster.secret"

    def peers_of(self, m: Member) -> list[str]:
        return [o.raft_addr for o in self.members if o is not m]

    def by_addr(self, addr: str | None) -> Member | None:
        return next((m for m in self.members if m.raft_addr == addr), None)

    def start_member(self, m: Member, *, extra: Iterable[str] = (), peers: Iterable[str] | None = None) -> None:
        """Start (or restart) `m` with the group as its peers; the first start of the first member
        makes the secret and seeds the admin key, every other start is given the secret file."""
        first = m is self.members[0] and not self.secret_file.exists()
        env = {"LLMGW_ADMIN_KEY": self.admin_key} if first else None
        secret = [] if first else ["--cluster-secret-file", str(self.secret_file)]
        every = self.every_start(m) if self.every_start is not None else []
        m.start(self.peers_of(m) if peers is None else peers, env=env, extra=[*secret, *every, *extra])

    async def start(self, timeout: float = 60.0) -> None:
        first = self.members[0]
        self.start_member(first)
        await self.wait_for("the first member's cluster secret", lambda: self.secret_file.exists() or None,
                            timeout)
        for m in self.members[1:]:
            self.start_member(m)
        await self.wait_for("every member healthy and announced", self.all_healthy, timeout)
        # A new group's members move to TLS between themselves a moment after (docs/security.md): its
        # one write (`trust.raft_tls`) belongs to the start, not to what a test then does.
        await self.wait_for("the group requiring TLS between its members", self.requires_tls, timeout)

    async def requires_tls(self) -> bool:
        """Whether every running member says the group requires TLS between its members."""
        for m in self.members:
            if m.running and not m.paused:
                try:
                    r = await self.get(m, "/api/v1/cluster/self")
                except httpx.HTTPError:
                    return False
                if r.status_code != 200 or not r.json().get("raft_tls_since"):
                    return False
        return True

    def close(self) -> None:
        for m in self.members:
            m.stop()

    # -- what the members say ------------------------------------------------------------------

    async def get(self, m: Member, path: str, timeout: float = 3.0) -> httpx.Response:
        async with httpx.AsyncClient(timeout=timeout) as client:
            return await client.get(m.url + path, headers=self.headers)

    async def table(self, m: Member) -> dict[str, dict[str, Any]] | None:
        """`GET /api/v1/cluster/members` as `m` answers it, by member id; None when it does not answer."""
        try:
            r = await self.get(m, "/api/v1/cluster/members")
        except httpx.HTTPError:
            return None
        if r.status_code != 200:
            return None
        return {row["id"]: row for row in r.json()["members"]}

    async def leader(self) -> Member | None:
        """The member that says it leads, as the first running member that answers sees the group."""
        for m in self.members:
            if m.running and not m.paused:
                rows = await self.table(m)
                if rows is not None:
                    leaders = [a for a, row in rows.items() if row.get("role") == "leader"]
                    return self.by_addr(leaders[0]) if len(leaders) == 1 else None
        return None

    async def all_healthy(self) -> dict[str, dict[str, Any]] | None:
        """Every member healthy and announced, as a running member sees them; else None."""
        for m in self.members:
            if not m.running or m.paused:
                continue
            rows = await self.table(m)
            if rows is None:
                continue
            if sorted(rows) != sorted(o.raft_addr for o in self.members):
                return None
            if all(r["state"] == "healthy" and r["admin_url"] for r in rows.values()):
                return rows
            return None
        return None

    async def settled(self) -> dict[str, dict[str, Any]] | None:
        """Every member healthy, at one revision, and (so) with one state hash; else None."""
        rows = await self.all_healthy()
        if rows is None or len({(r["revision"], r["applied_index"]) for r in rows.values()}) != 1:
            return None
        return rows

    async def wait_settled(self, timeout: float = 30.0) -> dict[str, dict[str, Any]]:
        rows: dict[str, dict[str, Any]] = await self.wait_for("every member healthy at one revision", self.settled,
                                                              timeout)
        return rows

    async def wait_for(self, what: str, probe: Callable[[], Any], timeout: float, poll: float = 0.05) -> Any:
        """Call `probe` (sync or async) until it returns something other than None/False."""
        with trio.move_on_after(timeout):
            while True:
                found = probe()
                if hasattr(found, "__await__"):
                    found = await found
                if found is not None and found is not False:
                    return found
                await trio.sleep(poll)
        raise ClusterError(f"{what}: not within {timeout:g} s\n{self.log_tails()}")

    def log_tails(self, chars: int = 3000) -> str:
        return "\n".join(f"--- {m.name} ({m.raft_addr}, {m.url})\n{m.log_tail(chars)}" for m in self.members)

    # -- faults ----------------------------------------------------------------------------------

    def kill(self, m: Member) -> None:
        m.kill()

    def pause(self, m: Member) -> None:
        m.signal(signal.SIGSTOP)

    def resume(self, m: Member) -> None:
        m.signal(signal.SIGCONT)

    def kill_all(self) -> None:
        # Each SIGKILL first, then the reaping: as close to "all at once" as signals get.
        for m in self.members:
            if m.proc is not None and m.proc.poll() is None:
                m.proc.send_signal(signal.SIGKILL)
        for m in self.members:
            m.kill()

    def set_failpoints(self, m: Member, *, send: dict[str, Any] | None = None, clock_offset_s: float | None = None) -> None:
        """Change `m`'s failpoints (llmgw/store/failpoints.py): what its Raft sends suffer
        (None: nothing), and its store clock's offset (None: the one it has)."""
        assert m.failpoints is not None, "the cluster was made without failpoints"
        if clock_offset_s is not None:
            m.clock_offset_s = clock_offset_s
        write_controls(m.failpoints, {"clock_offset_s": m.clock_offset_s, "send": send or {}})

    def power_loss(self, m: Member) -> list[str]:
        """SIGKILL `m`, then drop every write to its Raft files that was not flushed (what a power
        loss does to a disk that honours fsync). Returns what was dropped, in words."""
        assert m.failpoints is not None, "the cluster was made without failpoints"
        m.kill()
        return lose_unflushed(m.raft_dir, m.failpoints)

    def restart_all(self) -> None:
        self.kill_all()
        for m in self.members:
            self.start_member(m)
