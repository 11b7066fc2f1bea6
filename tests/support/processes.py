"""Run `llmgw up` as a real process for tests and benchmarks: free ports, the
ready line, credentials, and a stop that proves no engine is left behind."""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable, Iterable, Iterator
from typing import Any

__all__ = ["UpProcess", "alive", "children_of", "free_port", "kill_engines_under", "running_under", "stop_all"]

# Ports the tests give their listeners: below Linux's ephemeral range (32768-60999 by default), where neither a
# `bind(..., 0)` nor an outgoing connection of any process takes one, and a block of its own for each pytest-xdist
# worker. `llmgw.net.free_port` (a port 0 bind, then closed) raced both: another test's outgoing connection or
# listener could take the port before its server bound it ("Address already in use", seen once in ~8 parallel runs).
_PORTS_FROM, _PORTS_EACH, _BLOCKS = 20000, 2000, 6


def _ports() -> Iterator[int]:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    start = _PORTS_FROM + (int(worker) % _BLOCKS if worker.isdigit() else 0) * _PORTS_EACH
    return itertools.cycle(range(start, start + _PORTS_EACH))


_NEXT = _ports()


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on `host` now, from this worker's block, each handed out once in turn (the block is used again
    only after all of it: by then the tests that held a port are done)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for _ in range(_PORTS_EACH):
        port = next(_NEXT)
        with socket.socket(family) as probe:
            try:
                probe.bind((host, port))  # no SO_REUSEADDR: a port still in TIME_WAIT is passed over
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port on {host} in this worker's block of {_PORTS_EACH}")


def children_of(pid: int) -> set[int]:
    """Every descendant process of `pid` (engines run in their own sessions, still our children)."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                kids = (task / "children").read_text().split()
            except OSError:
                continue
            for k in kids:
                if int(k) not in found:
                    found.add(int(k))
                    todo.append(int(k))
    return found


def running_under(root: Path) -> list[int]:
    """Processes whose working directory lies under `root`: the engines a test's agents started
    (each engine runs in its agent's `engines/` directory), found even once their agent is gone
    (an agent that adopts leaves them running by design)."""
    root = root.resolve()
    found = []
    for cwd in Path("/proc").glob("[0-9]*/cwd"):
        try:
            where = Path(os.readlink(cwd).removesuffix(" (deleted)"))
        except OSError:
            continue
        if where == root or root in where.parents:
            found.append(int(cwd.parent.name))
    return [pid for pid in found if pid != os.getpid()]


def kill_engines_under(root: Path) -> list[int]:
    """SIGKILL what `running_under(root)` finds, and wait until each is gone (a killed process still shows
    its working directory while it exits: the next look must not find it again); the pids killed."""
    killed = []
    for pid in running_under(root):
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 30  # SIGKILL cannot be ignored: only a stuck kernel takes this long
    while any(alive(pid) for pid in killed) and time.monotonic() < deadline:
        time.sleep(0.05)
    return killed


def until(what: str, probe: Callable[[], Any], limit: float = 60.0, every: float = 0.05) -> Any:
    """`probe()` every `every` s until it gives something true (returned); AssertionError naming `what` after
    `limit` s (a bound a loaded machine never reaches, not a timing)."""
    deadline = time.monotonic() + limit
    while True:
        got = probe()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what}: not within {limit:g} s"
        time.sleep(every)


def stop_all(procs: Iterable[subprocess.Popen[Any]], grace: float = 10.0) -> None:
    """Terminate each process, then wait for each (killed, and reaped, after `grace` seconds)."""
    procs = list(procs)
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purposes (its main thread: its other threads may still be closing its files)
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


@dataclass
class UpProcess:
    state_dir: Path
    gateway_port: int = field(default_factory=free_port)
    admin_port: int = field(default_factory=free_port)
    env: dict[str, str] = field(default_factory=dict)
    extra_args: list[str] = field(default_factory=list)
    wrap: list[str] = field(default_factory=list)  # a command that runs `up`, such as prlimit's
    proc: subprocess.Popen[str] | None = None
    output: list[str] = field(default_factory=list)
    ready_line: str = ""
    _pump: threading.Thread | None = None

    def __post_init__(self) -> None:
        # Two free ports asked one after the other can be the same port (the first was free again):
        # `up` would then refuse its own gateway port.
        while self.admin_port == self.gateway_port:
            self.admin_port = free_port()

    def start(self, timeout: float = 60.0) -> UpProcess:
        argv = [*self.wrap, sys.executable, "-m", "llmgw", "up", "--state-dir", str(self.state_dir),
                "--gateway-port", str(self.gateway_port), "--admin-port", str(self.admin_port), *self.extra_args]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env={**os.environ, **self.env})
        ready = threading.Event()

        def pump() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            for line in self.proc.stdout:
                self.output.append(line)
                if line.startswith("llmgw ready"):
                    self.ready_line = line.strip()
                    ready.set()

        self._pump = threading.Thread(target=pump, daemon=True)
        self._pump.start()
        deadline = time.monotonic() + timeout
        while not ready.wait(0.1):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError("llmgw up did not become ready:\n" + "".join(self.output[-40:]))
        return self

    @property
    def credentials(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads((self.state_dir / "credentials.json").read_text())
        return doc

    def wait_engines(self, count: int, timeout: float = 30.0) -> set[int]:
        """Wait until `count` engine processes run under this `up`."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            engines = {p for p in children_of(self.proc.pid) if b"engine" in _cmdline(p)}
            if len(engines) >= count:
                return engines
            time.sleep(0.1)
        raise AssertionError(f"fewer than {count} engines started")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> tuple[int, float, set[int]]:
        """Signal `up`; return (exit status, seconds to exit, descendants still alive afterwards)."""
        assert self.proc is not None
        descendants = children_of(self.proc.pid)
        t0 = time.monotonic()
        self.proc.send_signal(sig)
        try:
            status = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"llmgw up did not stop within {timeout} s") from None
        elapsed = time.monotonic() - t0
        time.sleep(0.2)
        self._close_output()
        return status, elapsed, {p for p in descendants if alive(p)}

    def kill(self) -> None:
        if self.proc is None:
            return
        for p in children_of(self.proc.pid):
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._close_output()

    def _close_output(self) -> None:
        if self._pump is not None:
            self._pump.join(5)
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
