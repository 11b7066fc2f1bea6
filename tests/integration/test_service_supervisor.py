"""`llmgw service` with the built-in supervisor, as an operator runs it: real `llmgw service` commands
starting a real `llmgw control` on loopback, and the faults of its edges: the role killed (started again,
with its exit said), the role failing at once (backoff, "restarting"), the supervisor killed (the role
goes with it, and until it has, status says unknown, never stopped), a second start, a damaged service
file. (A role that does not stop in time, killed past service_stop_s, is not tested here yet.)

Waits poll the service's own status (what the operator reads), each bounded generously: no step depends
on how fast this machine is."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import free_port
from tests.support.processes import until

pytestmark = pytest.mark.slow

ADMIN = "sk-admin-service-test-0123456789"


def llmgw(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmgw", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)




class Machine:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.dir = root / "services"
        self.env = {**os.environ, "LLMGW_SERVICE_DIR": str(self.dir),
                    "LLMGW_TIMEOUTS": "service_restart_first_s=0.2,service_restart_max_s=1,service_stop_s=20"}
        self.admin_port = free_port()

    def install_control(self, *extra: str) -> None:
        r = llmgw("service", "install", "control", "--env", f"LLMGW_ADMIN_KEY={ADMIN}", "--",
                  "--state-dir", str(self.root / "state"), "--raft-addr", f"127.0.0.1:{free_port()}",
                  "--admin-addr", f"127.0.0.1:{self.admin_port}", *extra, env=self.env)
        assert r.returncode == 0, r.stderr

    def service(self, *args: str) -> subprocess.CompletedProcess[str]:
        return llmgw("service", *args, "--manager", "builtin", env=self.env)

    def status(self) -> dict[str, Any]:
        r = self.service("status", "control", "--json")
        return dict(json.loads(r.stdout))

    def serving(self) -> bool:
        """The control plane answers on its admin port (TCP accepts: it is up)."""
        import socket

        with socket.socket() as s:
            s.settimeout(1)
            return s.connect_ex(("127.0.0.1", self.admin_port)) == 0


@pytest.fixture
def machine(tmp_path: Path) -> Iterator[Machine]:
    m = Machine(tmp_path)
    yield m
    m.service("stop")
    state = m.dir / "control.state.json"
    if state.exists():  # whatever a failed test left running
        doc = json.loads(state.read_text())
        for pid in (doc.get("pid"), doc.get("supervisor_pid")):
            if isinstance(pid, int):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def test_start_status_a_killed_role_started_again_restart_stop(machine: Machine) -> None:
    machine.install_control()
    assert machine.status()["state"] == "stopped"
    r = machine.service("start")
    assert r.returncode == 0 and "control  running, pid" in r.stdout, r
    first = machine.status()
    assert first["state"] == "running" and first["manager"] == "builtin" and first["restarts"] == 0
    until("the control plane serving", machine.serving)

    again = machine.service("start", "control")  # already running: nothing new
    assert again.returncode == 0 and machine.status()["pid"] == first["pid"]

    os.kill(first["pid"], signal.SIGKILL)  # the role dies: the supervisor starts it again
    back = until("started again", lambda: (s := machine.status())["state"] == "running"
                 and s["pid"] != first["pid"] and s)
    assert back["restarts"] == 1 and back["last_exit"] == "signal SIGKILL"
    until("serving again", machine.serving)

    r = machine.service("restart")
    assert r.returncode == 0, r
    renewed = machine.status()
    assert renewed["state"] == "running" and renewed["pid"] not in (first["pid"], back["pid"])
    # Stopped before it is ready, a role exits 1 ("stopped before ready"): let it finish its start first.
    until("the restarted role ready", lambda: (machine.dir / "control.log").read_text().count(
        "llmgw.control: admin API on") >= 3)

    r = machine.service("stop")
    assert r.returncode == 0 and "control  stopped" in r.stdout, r
    done = machine.status()
    assert done["state"] == "stopped" and done["last_exit"] == "exit 0" and done["pid"] is None
    until("the port released", lambda: not machine.serving())
    log = (machine.dir / "control.log").read_text()
    assert "SIGTERM: stopping the role" in log and "exited (signal SIGKILL)" in log


def test_a_role_that_fails_at_once_is_restarting_with_backoff_and_stops(machine: Machine) -> None:
    machine.install_control("--bogus-flag")
    r = machine.service("start")
    assert r.returncode == 1 or "restarting" in r.stdout or "running" in r.stdout, r
    s = until("restarting", lambda: (s := machine.status())["state"] == "restarting" and (s["restarts"] or 0) >= 2
              and s)
    assert s["last_exit"] == "exit 2" and "starting it again in" in s["words"]
    r = machine.service("stop")
    assert r.returncode == 0 and machine.status()["state"] == "stopped", r


def test_a_killed_supervisor_takes_the_role_with_it_and_status_never_says_stopped_meanwhile(
        machine: Machine) -> None:
    machine.install_control()
    assert machine.service("start").returncode == 0
    until("serving", machine.serving)
    doc = json.loads((machine.dir / "control.state.json").read_text())
    os.kill(doc["supervisor_pid"], signal.SIGKILL)
    seen = set()

    def gone() -> bool:
        s = machine.status()
        seen.add(s["state"])
        if s["state"] == "unknown":
            assert s["pid"] == doc["pid"] and "its supervisor is gone" in s["words"]
        return s["state"] == "stopped" and not machine.serving()

    until("the role gone with its supervisor", gone)
    assert seen <= {"running", "unknown", "stopped"}
    try:
        os.kill(doc["pid"], 0)
        alive = True
    except ProcessLookupError:
        alive = False
    assert not alive or Path(f"/proc/{doc['pid']}/status").read_text().find("State:\tZ") >= 0


def test_a_second_supervisor_is_refused(machine: Machine) -> None:
    machine.install_control()
    assert machine.service("start").returncode == 0
    r = llmgw("service", "supervise", "control", env=machine.env)
    assert r.returncode == 1 and "another supervisor runs it already" in r.stderr


def test_bad_input_is_refused_at_once_and_changes_nothing(machine: Machine) -> None:
    r = llmgw("service", "install", "router", "--", "--x", env=machine.env)
    assert r.returncode == 2 and "no such role 'router'" in r.stderr
    r = llmgw("service", "install", "control", "--env", "lower=1", "--", "--x", env=machine.env)
    assert r.returncode == 2 and "environment name 'lower'" in r.stderr
    r = llmgw("service", "install", "control", "--", "control", "--x", env=machine.env)
    assert r.returncode == 2 and "give only its flags" in r.stderr
    assert not (machine.dir / "control.json").exists()
    r = machine.service("start")
    assert r.returncode == 2 and "no service is installed" in r.stderr
    machine.dir.mkdir(parents=True, exist_ok=True)
    (machine.dir / "control.json").write_text("{not json")  # damaged
    r = machine.service("status", "control")
    assert r.returncode == 0 and "unknown" in r.stdout and "install the service again" in r.stdout
    r = machine.service("start", "control")
    assert r.returncode == 1 and "install the service again" in r.stderr


def test_the_service_file_is_the_owners_alone(machine: Machine) -> None:
    machine.install_control()
    assert (machine.dir / "control.json").stat().st_mode & 0o777 == 0o600
    assert machine.dir.stat().st_mode & 0o777 == 0o700
