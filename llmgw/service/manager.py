"""What `llmgw service` says of a role (`ServiceStatus`), for the seam between it and whatever keeps this
machine's roles running (`llmgw.interfaces.ServiceManager`): systemd's units
(`systemd.py`) where systemd runs, the built-in supervisor (`supervisor.py`) where it does not.
Each answers for one role at a time; `llmgw service` orders them (start: control, gateway, agent;
stop: the reverse).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

State = Literal["running", "stopped", "restarting", "not installed", "unknown"]


class ServiceError(Exception):
    """A service command that did not do what it was asked; the message says why and what to do."""


@dataclass(frozen=True)
class ServiceStatus:
    role: str
    state: State
    manager: str  # "systemd" or "builtin"
    pid: int | None = None  # the role's process (None when it runs none)
    since: float | None = None  # when that process started (Unix time), or when it stopped
    restarts: int | None = None  # times the manager started it again since `start` (None: not known)
    last_exit: str = ""  # how the role's last process ended ("exit 1", "signal 9"), when one did
    words: str = ""  # anything else the operator should read (why it is unknown, where the log is)

    def to_doc(self) -> dict[str, Any]:
        return {"role": self.role, "state": self.state, "manager": self.manager, "pid": self.pid,
                "since": self.since, "restarts": self.restarts, "last_exit": self.last_exit, "words": self.words}


SYSTEMD_RUNNING = Path("/run/systemd/system")  # present when systemd is the init system (sd_booted)


def systemd_runs(marker: Path = SYSTEMD_RUNNING) -> bool:
    return marker.is_dir()


def exit_words(returncode: int | None) -> str:
    """How a process ended, from its Popen return code: "exit N" or "signal NAME"."""
    import signal

    if returncode is None:
        return ""
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit {returncode}"
