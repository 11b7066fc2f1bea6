"""Who is signed in to the console, and where the console keeps it: sessions in the control plane's memory
(cookie = a random token, never the key), and the `Console` each admin app holds (the control plane's
`Context` and the sessions), found with `console_of`. The request-side checks are in `auth.py`.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from quart_trio import QuartTrio

    from llmgw.control.context import Context

MAX_SESSIONS = 10_000  # a flood of sign-ins cannot grow the control plane's memory without bound
_EXT = "llmgw_console"

Role = Literal["admin", "viewer"]


@dataclass(frozen=True)
class Session:
    """Who is signed in: the key's public id and role, and this session's CSRF token."""

    key_id: str
    role: Role
    csrf: str


@dataclass
class Entry:
    session: Session
    key_hash: str
    key: str  # the clear key, in memory only: the gateways' request logs answer an admin key
    expires_at: float


class Sessions:
    """Signed-in sessions by the hash of their cookie token; each ends `idle_s` after its last request."""

    def __init__(self, idle_s: float, clock: Callable[[], float]) -> None:
        self.idle_s = idle_s
        self.clock = clock
        self._by_token: dict[str, Entry] = {}

    @staticmethod
    def _digest(token: str) -> str:
        return hashlib.sha256(token.encode("utf-8", "replace")).hexdigest()

    def open(self, key: str, key_hash: str, key_id: str, role: Role) -> str:
        """A new session for this key; its cookie token (shown to the browser only)."""
        self._prune()
        if len(self._by_token) >= MAX_SESSIONS:  # the oldest to end goes first
            oldest = min(self._by_token, key=lambda d: self._by_token[d].expires_at)
            del self._by_token[oldest]
        token = secrets.token_urlsafe(32)
        session = Session(key_id, role, secrets.token_urlsafe(32))
        self._by_token[self._digest(token)] = Entry(session, key_hash, key, self.clock() + self.idle_s)
        return token

    def find(self, token: str | None, key_role: Callable[[str], str | None]) -> Entry | None:
        """The live session of this token (its expiry moved on), or None: unknown, expired, or its key
        revoked or no longer of the role it signed in with."""
        if not token:
            return None
        digest = self._digest(token)
        entry = self._by_token.get(digest)
        if entry is None:
            return None
        now = self.clock()
        if entry.expires_at <= now or key_role(entry.key_hash) != entry.session.role:
            del self._by_token[digest]
            return None
        entry.expires_at = now + self.idle_s
        return entry

    def close(self, token: str | None) -> None:
        if token:
            self._by_token.pop(self._digest(token), None)

    def __len__(self) -> int:
        return len(self._by_token)

    def _prune(self) -> None:
        now = self.clock()
        for digest in [d for d, e in self._by_token.items() if e.expires_at <= now]:
            del self._by_token[digest]


@dataclass
class Console:
    """What every console view shares: the control plane's context (the one view the admin API reads too,
    so pages show what the API answers) and the sessions."""

    ctx: Context
    sessions: Sessions


def console_of(app: QuartTrio) -> Console:
    found = app.extensions.get(_EXT)
    assert isinstance(found, Console), "llmgw.console.register(app, ctx) must run first"
    return found


def install(app: QuartTrio, ctx: Context) -> Console:
    console = Console(ctx, Sessions(ctx.timeouts.console_session_idle_s, ctx.clock))
    app.extensions[_EXT] = console
    return console


def csrf_field(session: Session) -> str:
    """The hidden form field every console form carries (checked on every POST)."""
    return f'<input type="hidden" name="csrf" value="{session.csrf}">'
