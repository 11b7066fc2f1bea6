"""A machine's credential on disk: STATE_DIR/tls/ holds its key (made there, never sent), its
certificate chain and the cluster's trust bundle. Python's `ssl` loads certificates from files, so
these are the files every TLS context of the machine is made from; each is replaced atomically
(write, fsync, rename), 0600 in a 0700 dir.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from llmgw.trust.ca import Identity, identity, new_key_pem

DIR_NAME = "tls"


@dataclass(frozen=True)
class MachineFiles:
    """The paths of one machine's credential (`directory` is STATE_DIR/tls)."""

    directory: Path

    @classmethod
    def of(cls, state_dir: Path) -> MachineFiles:
        return cls(state_dir / DIR_NAME)

    @property
    def key(self) -> Path:
        return self.directory / "key.pem"

    @property
    def cert(self) -> Path:
        return self.directory / "cert.pem"  # the machine's certificate, then its intermediate

    @property
    def ca(self) -> Path:
        return self.directory / "ca.pem"  # the roots and intermediates this machine trusts

    def complete(self) -> bool:
        return self.key.is_file() and self.cert.is_file() and self.ca.is_file()

    def identity(self) -> Identity:
        return identity(self.cert.read_text())

    def key_pem(self) -> str:
        """This machine's key: the one on disk, else a new one written there first."""
        if self.key.is_file():
            return self.key.read_text()
        pem = new_key_pem()
        write_private(self.key, pem)
        return pem

    def write(self, cert_chain: str, bundle: str) -> None:
        write_private(self.cert, cert_chain)
        write_private(self.ca, bundle)

    def write_bundle(self, bundle: str) -> bool:
        """Replace the trust bundle if it changed (a rotation); whether it did."""
        if self.ca.is_file() and self.ca.read_text() == bundle:
            return False
        write_private(self.ca, bundle)
        return True


def write_private(path: Path, text: str) -> None:
    """`text` to `path`, 0600, atomically: a reader sees the old file or the new one whole."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
