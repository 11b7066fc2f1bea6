"""The system's `ssh` and `scp`, run from trio (`trio.run_process`): the `RemoteShell` that `llmgw server add`
uses. Never interactive (BatchMode: a key or nothing), bounded (ConnectTimeout, and a deadline per command),
the host key checked as the operator says (accept-new by default: a new machine is learned, a changed key
refused). What ssh says when it fails is read into a `RemoteError` kind (`classify`, pure)."""

from __future__ import annotations

import math
import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import trio

from llmgw.remote import ErrorKind, Ran, RemoteError

SSH_FAILED = 255  # ssh's own exit status when it (not the remote command) failed
HOST_KEY_CHECKING = ("accept-new", "yes", "no")


@dataclass(frozen=True)
class SshTarget:
    """USER@HOST and how to reach it: `port`, `identity` (-i), `options` (-o NAME=VALUE, each as given),
    `host_key_checking` (StrictHostKeyChecking), `known_hosts` (UserKnownHostsFile; None: ssh's own)."""

    target: str
    port: int | None = None
    identity: Path | None = None
    options: tuple[str, ...] = ()
    host_key_checking: str = "accept-new"
    known_hosts: Path | None = None

    @property
    def user(self) -> str:
        return self.target.rpartition("@")[0]

    @property
    def host(self) -> str:
        return self.target.rpartition("@")[2].strip("[]")


def check_target(target: str) -> str | None:
    """Why `target` is not USER@HOST (None when it is)."""
    user, at, host = target.rpartition("@")
    if not at or not user or not host:
        return f"{target!r}: give USER@HOST (e.g. root@10.0.0.7)"
    if any(c.isspace() for c in target) or target.startswith("-") or host.startswith("-"):
        return f"{target!r}: no spaces, and no leading '-'"
    return None


def classify(stderr: str) -> ErrorKind:
    """Which way ssh (or scp) failed, from what it printed."""
    text = stderr.lower()
    if "connection refused" in text:
        return "refused"
    if "host key verification failed" in text or "remote host identification has changed" in text:
        return "host_key"
    if "permission denied" in text or "too many authentication failures" in text or "no supported authentication" in text:
        return "auth"
    if any(words in text for words in ("no route to host", "network is unreachable", "timed out", "could not resolve",
                                       "name or service not known", "temporary failure in name resolution",
                                       "connection closed by", "connection reset")):
        return "unreachable"
    return "ssh"


def explain(kind: ErrorKind, target: str, said: str) -> str:
    """The words an operator reads for a failure of `kind` reaching `target`."""
    host = target.rpartition("@")[2]
    why = {
        "refused": f"ssh to {target} was refused: nothing listens for ssh on {host} (is sshd running? "
                   f"another port: --ssh-port)",
        "auth": f"ssh to {target} was refused its key: authorize this machine's key for that user (ssh-copy-id "
                f"{target}), or give --identity KEY",
        "unreachable": f"{host} was not reached over ssh (the address, a route, a firewall?)",
        "host_key": f"{host}'s ssh host key is not the one known here: if the machine was reinstalled, remove "
                    f"the old key (ssh-keygen -R {host}); else someone may be in the way",
        "timeout": f"ssh to {target} did not finish in time",
        "ssh": f"ssh to {target} failed",
    }[kind]
    return f"{why} ({said})" if said else why


class SshShell:
    """`RemoteShell` over the system's ssh and scp."""

    def __init__(self, target: SshTarget, *, connect_timeout_s: float, ssh: str = "ssh", scp: str = "scp") -> None:
        self.ssh_target = target
        self.target = target.target
        self.connect_timeout_s = connect_timeout_s
        self._ssh = ssh
        self._scp = scp

    def options(self) -> list[str]:
        """The options both ssh and scp get (scp's port flag is -P, ssh's -p: added by each)."""
        t = self.ssh_target
        opts = ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, math.ceil(self.connect_timeout_s))}",
                "-o", f"StrictHostKeyChecking={t.host_key_checking}", "-o", "ServerAliveInterval=5",
                "-o", "ServerAliveCountMax=3"]
        if t.known_hosts is not None:
            opts += ["-o", f"UserKnownHostsFile={t.known_hosts}"]
        if t.identity is not None:
            opts += ["-i", str(t.identity), "-o", "IdentitiesOnly=yes"]
        for option in t.options:
            opts += ["-o", option]
        return opts

    def ssh_argv(self, argv: Sequence[str]) -> list[str]:
        port = ["-p", str(self.ssh_target.port)] if self.ssh_target.port else []
        return [self._ssh, *self.options(), *port, "-T", "--", self.target, shlex.join(argv)]

    def scp_argv(self, local: Path, remote: str) -> list[str]:
        port = ["-P", str(self.ssh_target.port)] if self.ssh_target.port else []
        host = self.target if ":" not in self.ssh_target.host else f"{self.ssh_target.user}@[{self.ssh_target.host}]"
        return [self._scp, "-q", *self.options(), *port, "--", str(local), f"{host}:{remote}"]

    async def run(self, argv: Sequence[str], *, stdin: bytes = b"", timeout_s: float) -> Ran:
        done = await self._run(self.ssh_argv(argv), stdin, timeout_s, f"`{shlex.join(argv)}`")
        ran = Ran(done.returncode, done.stdout, done.stderr)
        if done.returncode == SSH_FAILED:
            said = ran.said(300)
            kind = classify(said)
            if kind != "ssh" or not said:  # else: the remote command itself may have exited 255
                raise RemoteError(kind, explain(kind, self.target, said))
        return ran

    async def put(self, local: Path, remote: str, *, timeout_s: float) -> None:
        done = await self._run(self.scp_argv(local, remote), b"", timeout_s, f"copying {local} to {remote}")
        if done.returncode != 0:
            said = (done.stderr or done.stdout).decode("utf-8", "replace").strip()[-300:]
            kind = classify(said)
            raise RemoteError(kind, explain(kind, self.target, said) if kind != "ssh" else
                              f"copying {local} to {self.target}:{remote} failed ({said or f'scp exit {done.returncode}'})")

    async def _run(self, cmd: list[str], stdin: bytes, timeout_s: float, what: str) -> subprocess.CompletedProcess[bytes]:
        result: subprocess.CompletedProcess[bytes] | None = None
        with trio.move_on_after(timeout_s):
            try:
                result = await trio.run_process(cmd, stdin=stdin, capture_stdout=True, capture_stderr=True, check=False)
            except FileNotFoundError:
                raise RemoteError("ssh", f"no {cmd[0]} program here: install the OpenSSH client "
                                         f"(Debian: apt-get install openssh-client)") from None
        if result is None:
            raise RemoteError("timeout", f"{what} on {self.target} did not finish within {timeout_s:g} s")
        return result
