"""Another machine, reached over ssh (`llmgw server add`): what a command run there answered (`Ran`), and why
ssh itself failed (`RemoteError`, its `kind` a word a caller can act on). The seam is `interfaces.RemoteShell`;
its implementation runs the system's ssh and scp (`ssh.py`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# Why ssh failed, as a caller acts on it: nothing listens (refused), the key was not taken (auth), the machine
# was not reached at all (unreachable), its host key is not the one known (host_key), no answer in time
# (timeout), or ssh failed some other way (ssh).
ErrorKind = Literal["refused", "auth", "unreachable", "host_key", "timeout", "ssh"]


class RemoteError(Exception):
    """ssh or scp could not do what it was asked: `kind` says which way, the message says it in words."""

    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind: ErrorKind = kind
        self.message = message


@dataclass(frozen=True)
class Ran:
    """What a command run on the remote machine answered: its exit status and output."""

    returncode: int
    stdout: bytes
    stderr: bytes

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def said(self, limit: int = 600) -> str:
        """Its stderr (else stdout), decoded and trimmed to its last `limit` characters, for a message."""
        text = (self.stderr or self.stdout).decode("utf-8", "replace").strip()
        return text if len(text) <= limit else "…" + text[-limit:]
