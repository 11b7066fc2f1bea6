"""`ServiceManager` by systemd: each role is the unit `llmgw-ROLE.service` (docs/systemd/), which runs
`llmgw service exec ROLE`, so the role's flags live in ROLE.json alone. Everything goes through
`systemctl` (the seam: `run`, a command line in, its CompletedProcess out); the state is read from
`systemctl show`'s properties, never guessed: what they do not settle is "unknown", with why.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable, Mapping

from llmgw.domain.timeouts import TIMEOUTS, Timeouts
from llmgw.service.manager import ServiceError, ServiceStatus

Run = Callable[[list[str]], subprocess.CompletedProcess[str]]

# What `status` asks systemd for. The monotonic timestamps are microseconds of CLOCK_MONOTONIC, the
# clock of time.monotonic(): turned into Unix time without parsing systemd's human dates.
PROPERTIES = ("LoadState", "ActiveState", "SubState", "Result", "MainPID", "NRestarts", "ExecMainCode",
              "ExecMainStatus", "ExecMainStartTimestampMonotonic", "ExecMainExitTimestampMonotonic")

# ExecMainCode: the si_code of the main process's end (waitid(2)).
_CLD_EXITED, _CLD_KILLED, _CLD_DUMPED = 1, 2, 3


def unit(role: str) -> str:
    return f"llmgw-{role}.service"


def default_run(timeouts: Timeouts = TIMEOUTS) -> Run:
    """The real `systemctl`: its output as text, given up on after `service_stop_s` (a stop job waits
    for the unit's TimeoutStopSec, which the units keep under it)."""

    def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeouts.service_stop_s, check=False)

    return run


class Systemd:
    """`ServiceManager` by systemd's llmgw-ROLE units, through `systemctl`."""

    name = "systemd"

    def __init__(self, run: Run | None = None, timeouts: Timeouts = TIMEOUTS, *,
                 wall: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._run = run if run is not None else default_run(timeouts)
        self._wall = wall
        self._monotonic = monotonic

    def status(self, role: str) -> ServiceStatus:
        name = unit(role)
        done = self._systemctl("show", name, f"--property={','.join(PROPERTIES)}")
        if done.returncode != 0:
            return ServiceStatus(role, "unknown", self.name,
                                 words=f"`systemctl show {name}` failed ({_said(done)})")
        return self._read(role, parse_show(done.stdout))

    def start(self, role: str) -> ServiceStatus:
        return self._act("start", role)

    def stop(self, role: str) -> ServiceStatus:
        return self._act("stop", role)

    def restart(self, role: str) -> ServiceStatus:
        return self._act("restart", role)

    # -- internals -----------------------------------------------------------

    def _act(self, verb: str, role: str) -> ServiceStatus:
        name = unit(role)
        done = self._systemctl(verb, name)
        if done.returncode != 0:
            said = _said(done)
            hint = ""
            if "not found" in said or "not loaded" in said:
                hint = (f"; install the unit: copy docs/systemd/{name} to /etc/systemd/system/, then "
                        f"`systemctl daemon-reload && systemctl enable {name}`")
            elif verb != "stop":
                hint = f"; `journalctl -u {name}` says why"
            raise ServiceError(f"`systemctl {verb} {name}` failed ({said}){hint}")
        return self.status(role)

    def _systemctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        argv = ["systemctl", *args]
        try:
            return self._run(argv)
        except subprocess.TimeoutExpired as e:
            return subprocess.CompletedProcess(argv, 124, "", f"no answer within {e.timeout:g} s")
        except OSError as e:  # no systemctl on this machine
            return subprocess.CompletedProcess(argv, 127, "", f"cannot run systemctl: {e.strerror or e}")

    def _read(self, role: str, props: Mapping[str, str]) -> ServiceStatus:
        name = unit(role)
        load, active, sub = props.get("LoadState", ""), props.get("ActiveState", ""), props.get("SubState", "")
        journal = f"`journalctl -u {name}`"
        if load == "not-found":
            return ServiceStatus(role, "not installed", self.name,
                                 words=f"no unit {name}: copy docs/systemd/{name} to /etc/systemd/system/")
        if load not in ("loaded", "masked"):
            return ServiceStatus(role, "unknown", self.name,
                                 words=f"systemd could not load {name} (LoadState={load or '?'}): "
                                       f"`systemd-analyze verify /etc/systemd/system/{name}` says why")
        masked = f"{name} is masked: `systemctl unmask {name}`" if load == "masked" else ""
        restarts = _int(props.get("NRestarts"))
        pid = _int(props.get("MainPID")) or None
        if active in ("active", "reloading"):
            if pid is None:
                return ServiceStatus(role, "unknown", self.name, restarts=restarts,
                                     words=f"{name} is {active} ({sub}) but has no main process")
            return ServiceStatus(role, "running", self.name, pid=pid,
                                 since=self._since(props.get("ExecMainStartTimestampMonotonic")),
                                 restarts=restarts, words=masked)
        ended = self._since(props.get("ExecMainExitTimestampMonotonic"))
        last_exit = _exit(props.get("ExecMainCode"), props.get("ExecMainStatus"))
        if active == "activating" and sub in ("auto-restart", "auto-restart-queued"):  # -queued: systemd 254+
            return ServiceStatus(role, "restarting", self.name, since=ended, restarts=restarts, last_exit=last_exit,
                                 words=f"systemd starts it again after RestartSec; {journal}")
        if active in ("inactive", "failed"):
            result = props.get("Result", "")
            words = [masked] if masked else []
            if active == "failed" or result not in ("", "success"):
                limit = " (it kept exiting: `systemctl reset-failed` before a start)" \
                    if result == "start-limit-hit" else ""
                words.append(f"failed: {result or '?'}{limit}; {journal}")
            return ServiceStatus(role, "stopped", self.name, since=ended, restarts=restarts, last_exit=last_exit,
                                 words="; ".join(words))
        return ServiceStatus(role, "unknown", self.name, pid=pid, restarts=restarts, last_exit=last_exit,
                             words=f"{name} is {active or '?'} ({sub or '?'}); `systemctl status {name}`")

    def _since(self, monotonic_us: str | None) -> float | None:
        us = _int(monotonic_us)
        if not us:
            return None  # 0: it never happened
        return self._wall() - (self._monotonic() - us / 1e6)


def parse_show(text: str) -> dict[str, str]:
    """`systemctl show`'s KEY=VALUE lines (a value may hold "=")."""
    props: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            props[key.strip()] = value.strip()
    return props


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None  # "[not set]" and the like


def _exit(code: str | None, status: str | None) -> str:
    """How the main process last ended, from ExecMainCode/ExecMainStatus: "" when it has not."""
    how, value = _int(code), _int(status)
    if value is None:
        return ""
    if how == _CLD_EXITED:
        return f"exit {value}"
    if how in (_CLD_KILLED, _CLD_DUMPED):
        try:
            sig = signal.Signals(value).name
        except ValueError:
            sig = str(value)
        return f"signal {sig}" + (" (core dumped)" if how == _CLD_DUMPED else "")
    return ""


def _said(done: subprocess.CompletedProcess[str]) -> str:
    said = " ".join((done.stderr or "").split()) or " ".join((done.stdout or "").split())
    return f"status {done.returncode}: {said}" if said else f"status {done.returncode}"
