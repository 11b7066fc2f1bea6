"""The built-in supervisor: where systemd does not run (a container, a laptop, the tests), `llmgw service
start ROLE` starts `llmgw service supervise ROLE` in a session of its own, which runs the role and starts
it again when it exits, waiting longer each time (`restart_delay`).

Its files, in the services' dir beside ROLE.json:
- ROLE.lock: the supervisor holds an exclusive `flock` on it while it lives, so "running" is never read
  from a stale pid: a lock that can be taken means no supervisor.
- ROLE.state.json: what it does now (running, restarting, stopped), the role's pid and since when, the
  restarts since `start`, how the last process ended. Replaced whole at each change.
- ROLE.log: the supervisor's lines and the role's output, appended.

Stopping: SIGTERM to the supervisor, which passes it to the role (its own orderly stop: engines, streams,
Raft) and kills it if it has not stopped `stop_deadline_s` later; `stop` kills the whole session past
`service_stop_s`.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmgw.domain.timeouts import TIMEOUTS, Timeouts
from llmgw.engines.base import self_command
from llmgw.service.manager import ServiceError, ServiceStatus, exit_words
from llmgw.service.spec import SpecError, load
from llmgw.trust.files import write_private

LOG_TAIL = 2000  # characters of ROLE.log an error quotes


def restart_delay(in_row: int, ran_s: float, timeouts: Timeouts = TIMEOUTS) -> tuple[float, int]:
    """How long to wait before starting again a role whose process ran `ran_s` and then exited, after
    `in_row` quick exits before it; and the count of quick exits after this one. A run of
    `service_stable_s` or more starts the count over: one crash a day waits the first delay."""
    if ran_s >= timeouts.service_stable_s:
        in_row = 0
    delay = min(timeouts.service_restart_first_s * 2 ** min(in_row, 32), timeouts.service_restart_max_s)
    return delay, in_row + 1


@dataclass(frozen=True)
class Files:
    dir: Path
    role: str

    @property
    def lock(self) -> Path:
        return self.dir / f"{self.role}.lock"

    @property
    def state(self) -> Path:
        return self.dir / f"{self.role}.state.json"

    @property
    def log(self) -> Path:
        return self.dir / f"{self.role}.log"

    def read_state(self) -> dict[str, Any]:
        try:
            doc = json.loads(self.state.read_text(encoding="utf-8"))
        except (FileNotFoundError, json.JSONDecodeError):
            return {}
        return doc if isinstance(doc, dict) else {}

    def write_state(self, **doc: Any) -> None:
        write_private(self.state, json.dumps(doc))

    def held(self) -> bool:
        """Whether a supervisor lives (holds the lock)."""
        try:
            fd = os.open(self.lock, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # closing drops a lock this call took
        return False

    def log_tail(self) -> str:
        try:
            with self.log.open("rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - LOG_TAIL))
                return f.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""


class Supervisor:
    """`ServiceManager` by the built-in supervisor, for the services in `dir`."""

    name = "builtin"

    def __init__(self, dir: Path, timeouts: Timeouts = TIMEOUTS, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.dir = dir
        self.timeouts = timeouts
        self._clock = clock
        self._sleep = sleep

    def status(self, role: str) -> ServiceStatus:
        files = Files(self.dir, role)
        try:
            spec = load(self.dir, role)
        except SpecError as e:
            return ServiceStatus(role, "unknown", self.name, words=str(e))
        state = files.read_state()
        restarts = state.get("restarts") if isinstance(state.get("restarts"), int) else None
        last_exit = str(state.get("last_exit") or "")
        if not files.held():
            orphan = state.get("pid") if state.get("state") == "running" else None
            if isinstance(orphan, int) and _runs(orphan, role):
                return ServiceStatus(role, "unknown", self.name, pid=orphan, words=(
                    f"its supervisor is gone but pid {orphan} it started still runs: stop it (kill {orphan}), "
                    f"then `llmgw service start {role}`"))
            if spec is None:
                return ServiceStatus(role, "not installed", self.name)
            words = f"log: {files.log}" if files.log.exists() else ""
            return ServiceStatus(role, "stopped", self.name, since=state.get("stopped_at"), restarts=restarts,
                                 last_exit=last_exit, words=words)
        if state.get("state") == "restarting":
            return ServiceStatus(role, "restarting", self.name, since=state.get("since"), restarts=restarts,
                                 last_exit=last_exit,
                                 words=f"starting it again in {max(0.0, state.get('next_start_at', 0) - time.time()):.0f} s;"
                                       f" log: {files.log}")
        pid = state.get("pid") if isinstance(state.get("pid"), int) else None
        return ServiceStatus(role, "running" if pid is not None else "unknown", self.name, pid=pid,
                             since=state.get("since"), restarts=restarts, last_exit=last_exit,
                             words="" if pid is not None else "its supervisor lives but has not said what it runs")

    def start(self, role: str) -> ServiceStatus:
        files = Files(self.dir, role)
        spec = load(self.dir, role)
        if spec is None:
            raise ServiceError(f"{role} is not installed in {self.dir}: `llmgw service install {role} -- FLAGS` first")
        if files.held():
            return self.status(role)
        before = files.read_state().get("supervisor_pid")
        log = os.open(files.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            proc = subprocess.Popen([*self_command(), "service", "supervise", role, "--dir", str(self.dir)],
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        finally:
            os.close(log)
        _SPAWNED.append(proc)  # reaped by init once this command exits: nothing to wait for here
        deadline = self._clock() + self.timeouts.service_start_s
        while True:
            state = files.read_state()
            if state.get("supervisor_pid") == proc.pid and state.get("supervisor_pid") != before \
                    and state.get("state") in ("running", "restarting", "stopped"):
                return self.status(role)
            if proc.poll() is not None:
                raise ServiceError(f"{role}: its supervisor exited ({exit_words(proc.returncode)}) before it "
                                   f"started the role; {files.log} ends:\n{files.log_tail()}")
            if self._clock() > deadline:
                raise ServiceError(f"{role}: its supervisor (pid {proc.pid}) did not say it started the role "
                                   f"within {self.timeouts.service_start_s:g} s; see {files.log}")
            self._sleep(self.timeouts.service_poll_s)

    def stop(self, role: str) -> ServiceStatus:
        files = Files(self.dir, role)
        if not files.held():
            return self.status(role)
        pid = files.read_state().get("supervisor_pid")
        if not isinstance(pid, int):
            raise ServiceError(f"{role}: a supervisor holds {files.lock} but {files.state} does not name it; "
                               f"`fuser {files.lock}` finds it")
        _signal(pid, signal.SIGTERM)
        deadline = self._clock() + self.timeouts.service_stop_s
        while files.held():
            if self._clock() > deadline:
                _signal(-pid, signal.SIGKILL)  # its session: the supervisor, the role and what the role started
                self._sleep(self.timeouts.service_poll_s)
                state = files.read_state()
                files.write_state(**{**state, "state": "stopped", "stopped_at": time.time(),
                                     "last_exit": f"killed: not stopped within {self.timeouts.service_stop_s:g} s"})
                break
            self._sleep(self.timeouts.service_poll_s)
        return self.status(role)

    def restart(self, role: str) -> ServiceStatus:
        self.stop(role)
        return self.start(role)


_SPAWNED: list[subprocess.Popen[bytes]] = []


def _runs(pid: int, role: str) -> bool:
    """Whether `pid` lives and (where /proc tells) runs `role` still, not a process that reused the pid."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return True  # no /proc: alive is all that is known
    return role.encode() in args


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        if pid < 0:
            os.killpg(-pid, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        pass


# --- the supervisor process (`llmgw service supervise ROLE`) -------------------------------------------


def supervise(dir: Path, role: str, timeouts: Timeouts = TIMEOUTS) -> int:
    """Run `role` as installed in `dir` until SIGTERM/SIGINT, starting it again whenever it exits.
    Returns 0 once stopped; 1 when another supervisor runs it or it is not installed."""
    files = Files(dir, role)
    lock = os.open(files.lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        _say(f"{role}: another supervisor runs it already")
        return 1
    stopping = threading.Event()
    child: list[subprocess.Popen[bytes]] = []

    def on_signal(signum: int, frame: Any) -> None:
        if stopping.is_set():
            return
        stopping.set()
        name = signal.Signals(signum).name
        if child and child[0].poll() is None:
            _say(f"{role}: {name}: stopping the role (pid {child[0].pid})")
            _stop_role(child[0], role, timeouts)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    restarts, in_row, last_exit = 0, 0, ""
    base = {"supervisor_pid": os.getpid(), "role": role}
    while not stopping.is_set():
        try:
            spec = load(dir, role)
        except SpecError as e:
            spec, why = None, str(e)
        else:
            why = f"{role} is not installed in {dir}"
        if spec is None:
            _say(f"{role}: {why}; the supervisor stops")
            files.write_state(**base, state="stopped", stopped_at=time.time(), restarts=restarts, last_exit=why)
            return 1
        started = time.monotonic()
        proc = subprocess.Popen(spec.command(), env={**os.environ, **spec.env}, stdin=subprocess.DEVNULL,
                                preexec_fn=_term_with_parent)
        child[:] = [proc]
        _say(f"{role}: started (pid {proc.pid}): {' '.join(spec.command()[-len(spec.args) - 1:])}")
        files.write_state(**base, state="running", pid=proc.pid, since=time.time(), restarts=restarts,
                          last_exit=last_exit)
        if stopping.is_set() and proc.poll() is None:  # the signal came while it was being started
            _stop_role(proc, role, timeouts)
        proc.wait()
        last_exit = exit_words(proc.returncode)
        if stopping.is_set():
            break
        delay, in_row = restart_delay(in_row, time.monotonic() - started, timeouts)
        restarts += 1
        _say(f"{role}: exited ({last_exit}) after {time.monotonic() - started:.1f} s; starting it again in "
             f"{delay:g} s (restart {restarts})")
        files.write_state(**base, state="restarting", since=time.time(), next_start_at=time.time() + delay,
                          restarts=restarts, last_exit=last_exit)
        stopping.wait(delay)
    _say(f"{role}: stopped ({last_exit or 'never started'})")
    files.write_state(**base, state="stopped", stopped_at=time.time(), restarts=restarts, last_exit=last_exit)
    return 0


def _stop_role(proc: subprocess.Popen[bytes], role: str, timeouts: Timeouts) -> None:
    """SIGTERM (the role's orderly stop), and SIGKILL if it still runs past its stop deadline."""
    proc.send_signal(signal.SIGTERM)
    killer = threading.Timer(timeouts.stop_deadline_s + 1.0, _kill_if_running, (proc, role))
    killer.daemon = True
    killer.start()


def _term_with_parent() -> None:
    """In the role's process before it runs: SIGTERM when the supervisor dies (killed, or out of memory),
    so no role runs on unsupervised while `status` says stopped (Linux's PR_SET_PDEATHSIG)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1


def _kill_if_running(proc: subprocess.Popen[bytes], role: str) -> None:
    if proc.poll() is None:
        _say(f"{role}: still running after its stop deadline: killed (pid {proc.pid})")
        proc.kill()


def _say(line: str) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    sys.stderr.write(f"{stamp}Z supervisor {line}\n")
    sys.stderr.flush()
