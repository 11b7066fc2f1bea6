"""The cluster secret: made at a group's first start, kept in STATE_DIR/cluster.secret (0600),
checked at every later start; the Raft transport's password is derived from it."""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import stat
from pathlib import Path

from llmgw import startup

log = logging.getLogger("llmgw.store")

FILE_NAME = "cluster.secret"
ENV = "LLMGW_CLUSTER_SECRET"
# A secret the operator writes by hand must not be guessable; ours has 43 characters.
MIN_LENGTH = 16
# Domain separation: the secret may key other things later (`server add`); Raft gets its own key.
_RAFT_CONTEXT = b"llmgw raft transport v1"


class SecretError(startup.CannotStart):
    """A cluster secret that cannot be used (given or stored); the message says which and what to do.
    It never contains the secret."""


def make() -> str:
    """A new secret: 32 random bytes, URL-safe text."""
    return secrets.token_urlsafe(32)


def parse(text: str, source: str) -> str:
    """The secret in `text` (surrounding whitespace dropped), or `SecretError` naming `source`."""
    secret = text.strip()
    if not secret.isprintable() or any(c.isspace() for c in secret):
        raise SecretError(f"{source}: a cluster secret is one word of printable characters")
    if len(secret) < MIN_LENGTH:
        raise SecretError(f"{source}: a cluster secret has at least {MIN_LENGTH} characters "
                          f"(this one has {len(secret)}); copy the first member's {FILE_NAME}")
    return secret


def read_file(path: Path) -> str:
    """The secret kept in `path` (a file the operator names, or a state dir's own)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise SecretError(f"cannot read the cluster secret {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise SecretError(f"{path} does not hold a cluster secret (not text)") from None
    return parse(text, str(path))


def load_or_create(state_dir: Path, given: str | None) -> str:
    """This member's secret: the one in the state dir; on a fresh state dir the one `given`
    (stored), else a new one (stored). A stored secret that differs from `given` is refused:
    the state dir belongs to another cluster."""
    path = state_dir / FILE_NAME
    if path.exists():
        stored = read_file(path)
        _keep_private(path)
        if given is not None and not hmac.compare_digest(stored.encode(), given.encode()):
            raise SecretError(
                f"the state dir {state_dir} belongs to another cluster: its {FILE_NAME} differs from the "
                f"cluster secret given (--cluster-secret-file or {ENV}); give that cluster's secret, "
                f"or use a fresh state dir to join this one")
        return stored
    secret = make() if given is None else given
    state_dir.mkdir(parents=True, exist_ok=True)
    _write_private(path, secret)
    if given is None:
        log.info("made a new cluster secret in %s: start every other member of this group with a copy "
                 "of it (--cluster-secret-file or %s)", path, ENV)
    else:
        log.info("stored the cluster secret given in %s", path)
    return secret


def raft_password(secret: str) -> str:
    """The password pysyncobj derives its transport key from (HMAC of the secret, not the secret)."""
    return hmac.new(secret.encode(), _RAFT_CONTEXT, hashlib.sha256).hexdigest()


def _write_private(path: Path, secret: str) -> None:
    """Mode 0600 from the first byte, written whole and synced before it is renamed into place:
    a member that acknowledged writes must find the same secret after a power loss."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # a stale .tmp keeps its old mode through O_CREAT
        os.write(fd, (secret + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _keep_private(path: Path) -> None:
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        log.warning("%s could be read by other users (mode %04o): set to 0600", path, mode)
        path.chmod(0o600)
