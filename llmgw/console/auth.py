"""The console's sign-in: sessions kept in the control plane's memory (cookie = a random token, never
the key), the CSRF token on every form, and `console_route`, which every console page registers through.

A session is signed in with a key of role admin or viewer; the key is checked against the cluster's
keys on every request (a revoked key signs its sessions out). A viewer sees every page and is refused
every action with a page that says why. The clear key stays in this process's memory only, for
asking the gateways' request logs on the operator's behalf (as `ctl` does with its key).
"""

from __future__ import annotations

import hashlib
import hmac
import inspect
import logging
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Literal, Sequence
from urllib.parse import urlsplit

from quart import Response, g, request

from llmgw.domain.keys import hash_key

if TYPE_CHECKING:
    from quart_trio import QuartTrio

    from llmgw.control.admin import ControlDeps

log = logging.getLogger("llmgw.console")

COOKIE = "llmgw_session"
SIGNIN_COOKIE = "llmgw_signin"  # the sign-in form's own CSRF token (double submit: there is no session yet)
CONSOLE_ROLES = ("admin", "viewer")
MAX_SESSIONS = 10_000  # a flood of sign-ins cannot grow the control plane's memory without bound
_EXT = "llmgw_console"

Role = Literal["admin", "viewer"]
View = Callable[..., "Awaitable[str | Response] | str | Response"]


@dataclass(frozen=True)
class Session:
    """Who is signed in: the key's public id and role, and this session's CSRF token."""

    key_id: str
    role: Role
    csrf: str


@dataclass
class _Entry:
    session: Session
    key_hash: str
    key: str  # the clear key, in memory only: the gateways' request logs answer an admin key
    expires_at: float


class Sessions:
    """Signed-in sessions by the hash of their cookie token; each ends `idle_s` after its last request."""

    def __init__(self, idle_s: float, clock: Callable[[], float]) -> None:
        self.idle_s = idle_s
        self.clock = clock
        self._by_token: dict[str, _Entry] = {}

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
        self._by_token[self._digest(token)] = _Entry(session, key_hash, key, self.clock() + self.idle_s)
        return token

    def find(self, token: str | None, key_role: Callable[[str], str | None]) -> _Entry | None:
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


ClusterInfo = Callable[[str | None], Awaitable[dict[str, Any]]]
PlanViews = Callable[[], "dict[str, Any] | None"]


async def _no_cluster(authorization: str | None) -> dict[str, Any]:
    return {}


@dataclass
class Console:
    """What every console view shares: the control plane's collaborators, the sessions, and the admin
    app's own readers (the members' table, the reconciler's views), so pages read what the API does."""

    deps: ControlDeps
    sessions: Sessions
    cluster_info: ClusterInfo = _no_cluster
    views: PlanViews = lambda: None


def console_of(app: QuartTrio) -> Console:
    found = app.extensions.get(_EXT)
    assert isinstance(found, Console), "llmgw.console.register(app, deps) must run first"
    return found


def install(app: QuartTrio, deps: ControlDeps, cluster_info: ClusterInfo | None = None,
            views: PlanViews | None = None) -> Console:
    console = Console(deps, Sessions(deps.reconciler.timeouts.console_session_idle_s, deps.clock),
                      cluster_info or _no_cluster, views or (lambda: None))
    app.extensions[_EXT] = console
    return console


def csrf_field(session: Session) -> str:
    """The hidden form field every console form carries (checked on every POST)."""
    return f'<input type="hidden" name="csrf" value="{session.csrf}">'


def html(body: str, status: int = 200) -> Response:
    return Response(body, status=status, content_type="text/html; charset=utf-8",
                    headers={"cache-control": "no-store", "x-frame-options": "DENY",
                             "content-security-policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; "
                                                        "img-src 'self' data:; frame-ancestors 'none'",
                             "referrer-policy": "same-origin", "x-content-type-options": "nosniff"})


def redirect(to: str) -> Response:
    """A 303 to a path of this console (never another site: `to` must start with one /)."""
    if not to.startswith("/") or to.startswith("//"):
        to = "/"
    return Response("", status=303, headers={"location": to, "cache-control": "no-store"})


def is_tls() -> bool:
    return request.scheme in ("https", "wss")


def cookie_flags() -> dict[str, Any]:
    return {"httponly": True, "samesite": "Strict", "secure": is_tls(), "path": "/"}


def authorization(session: Session) -> str:
    """The `Authorization` header that asks the other members and the gateways on this session's behalf
    (with its own key, as `ctl` would): built here, in memory, never logged."""
    entry = getattr(g, "console_entry", None)
    return f"Bearer {entry.key}" if isinstance(entry, _Entry) and entry.session is session else ""


def console_of_request() -> Console:
    from quart import current_app

    return console_of(current_app)  # type: ignore[arg-type]


def current_entry() -> _Entry | None:
    from quart import current_app  # the app this request runs in: its console

    console = console_of(current_app)  # type: ignore[arg-type]
    state = console.deps.store.snapshot()
    return console.sessions.find(request.cookies.get(COOKIE), state.key_role)


def same_origin() -> bool:
    """A POST whose Origin (when the browser sends one) is this host: another site's form is refused
    even before its CSRF token is looked at."""
    origin = request.headers.get("origin")
    if not origin or origin == "null":
        return origin is None
    return urlsplit(origin).netloc == request.host


def refused(title: str, why: str, session: Session | None, status: int = 403) -> Response:
    """A refusal as a page: what was refused and why, in words, with the way out."""
    from llmgw.console import layout

    body = (f'<section class="refusal" id="refusal" data-testid="refusal"><h2>{layout.esc(title)}</h2>'
            f'<p data-testid="refusal-reason">{layout.esc(why)}</p></section>')
    if session is None:
        return html(layout.bare(title, body + '<p><a href="/signin">Sign in</a></p>'), status)
    return html(layout.page(title, "", body, session=session), status)


VIEWER_WHY = ("you are signed in with a viewer key ({key_id}): a viewer sees every page but cannot act. "
              "Sign out and sign in with an admin key to do this.")
CSRF_WHY = ("this form's CSRF token is missing or is not this session's (the form came from another page or "
            "site, or from before you signed in again); nothing was done. Reload the page and submit it again.")
ORIGIN_WHY = "this request came from another site (its Origin header is not this console's); nothing was done."


async def form_value(name: str) -> str | None:
    form = await request.form
    value = form.get(name)
    return value if isinstance(value, str) else None


async def check_post(session: Session) -> Response | None:
    """None when this POST may go on; else the refusal page (another origin, no or a wrong CSRF token)."""
    if not same_origin():
        log.warning("console: %s %s refused: another origin", request.method, request.path)
        return refused("Refused: another site", ORIGIN_WHY, session)
    token = await form_value("csrf") or ""
    if not hmac.compare_digest(token.encode(), session.csrf.encode()):
        log.warning("console: %s %s refused: no valid CSRF token", request.method, request.path)
        return refused("Refused: the form's CSRF token is not valid", CSRF_WHY, session)
    return None


def console_route(app: QuartTrio, path: str, methods: Sequence[str] = ("GET",), *,
                  action: bool = False) -> Callable[[View], View]:
    """Register a console view at `path`: it is called as `view(session, deps, **path_args)` and returns
    HTML (a full page from `layout.page`) or a Response (a `redirect`). Not signed in: to the sign-in
    page. Every POST needs this session's CSRF token (form field `csrf`); `action=True` also needs an
    admin key, on every method (a viewer is shown why not)."""

    def wrap(view: View) -> View:
        async def handler(**kwargs: Any) -> Response:
            entry = current_entry()
            if entry is None:
                if request.args.get("fragment"):
                    return html("signed out", 401)  # the page's script reloads, which leads to the sign-in
                return redirect("/signin")
            session = entry.session
            g.console_entry = entry  # for `authorization`, this request only
            if action and session.role != "admin":
                log.info("console: %s %s refused to viewer key %s", request.method, request.path, session.key_id)
                return refused("Refused: a viewer cannot act", VIEWER_WHY.format(key_id=session.key_id), session)
            if request.method == "POST":
                refusal = await check_post(session)
                if refusal is not None:
                    return refusal
            result = view(session, console_of(app).deps, **kwargs)
            if inspect.isawaitable(result):
                result = await result
            return result if isinstance(result, Response) else html(str(result))

        handler.__name__ = "console_" + (getattr(view, "__name__", "") or path.strip("/").replace("/", "_") or "root")
        app.route(path, methods=list(methods))(handler)
        return view

    return wrap


def role_of(key: str, deps: ControlDeps) -> tuple[str, str, Role] | None:
    """(hash, id, role) of a key that may sign in (admin or viewer, not expired); None otherwise."""
    key_hash = hash_key(key)
    found = deps.store.snapshot().keys.get(key_hash)
    if found is None or found.role not in CONSOLE_ROLES:
        return None
    if found.expires_at is not None and found.expires_at <= deps.clock():
        return None
    role: Role = "admin" if found.role == "admin" else "viewer"
    return key_hash, found.id, role
