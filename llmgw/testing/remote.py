"""A `RemoteShell` whose remote machine is this one: commands run here (`trio.run_process`, no shell unless
asked), files copied here; `refuse` makes every call fail as ssh would (`RemoteError` of that kind). For tests
of what runs over ssh without an sshd (the real one is tested against Debian's sshd: tests/integration)."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import trio

from llmgw.remote import ErrorKind, Ran, RemoteError


class LocalShell:
    def __init__(self, target: str = "root@localhost", *, refuse: ErrorKind | None = None) -> None:
        self.target = target
        self.refuse = refuse
        self.ran: list[list[str]] = []  # every command asked, in order
        self.copied: list[tuple[Path, str]] = []

    def _check(self) -> None:
        if self.refuse is not None:
            raise RemoteError(self.refuse, f"ssh to {self.target}: {self.refuse} (a LocalShell told to refuse)")

    async def run(self, argv: Sequence[str], *, stdin: bytes = b"", timeout_s: float) -> Ran:
        self._check()
        self.ran.append(list(argv))
        with trio.fail_after(timeout_s):
            try:
                done = await trio.run_process(list(argv), stdin=stdin, capture_stdout=True, capture_stderr=True,
                                              check=False)
            except FileNotFoundError:
                return Ran(127, b"", f"sh: 1: {argv[0]}: not found".encode())
        return Ran(done.returncode, done.stdout, done.stderr)

    async def put(self, local: Path, remote: str, *, timeout_s: float) -> None:
        self._check()
        self.copied.append((local, remote))
        await trio.to_thread.run_sync(shutil.copyfile, local, remote)
