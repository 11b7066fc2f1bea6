"""The console's sign-in: sessions kept in the control plane's memory (cookie = a random token, never
the key), the CSRF token on every form, and `console_route`, which every console page registers through.

A session is signed in with a key of role admin or viewer; the key is checked against the cluster's
keys on every request (a revoked key signs its sessions out). A viewer sees every page and is refused
every action with a page that says why. The clear key stays in this process's memory only, for
asking the gateways' request logs on the operator's behalf (as `ctl` does with its key).
"""

from __future__ import annotations

import hmac
import inspect
import logging
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Sequence
from urllib.parse import urlsplit

from quart import Response, g, request

from llmgw.console import layout
from llmgw.console.sessions import Role, Session, Entry, console_of
from llmgw.domain.keys import hash_key

if TYPE_CHECKING:
    from quart_trio import QuartTrio

    from llmgw.control.context import Context

log = logging.getLogger("llmgw.console")

COOKIE = "llmgw_session"
SIGNIN_COOKIE = "llmgw_signin"  # the sign-in form's own CSRF token (double submit: there is no session yet)
CONSOLE_ROLES = ("admin", "viewer")

View = Callable[..., "Awaitable[str | Response] | str | Response"]


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
    return f"Bearer {entry.key}" if isinstance(entry, Entry) and entry.session is session else ""


def current_entry() -> Entry | None:
    from quart import current_app  # the app this request runs in: its console

    console = console_of(current_app)  # type: ignore[arg-type]
    state = console.ctx.state()
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
    # The title once: the page's heading (a signed-out page, without the shell, gets it here).
    body = (f'<section class="refusal" id="refusal" data-testid="refusal">'
            f'<p data-testid="refusal-reason">{layout.esc(why)}</p></section>')
    if session is None:
        return html(layout.bare(title, f"<h1>{layout.esc(title)}</h1>" + body +
                                '<p><a href="/signin">Sign in</a></p>'), status)
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
    token = request.headers.get("x-csrf-token") or await form_value("csrf") or ""  # the header: a page's script
    if not hmac.compare_digest(token.encode(), session.csrf.encode()):
        log.warning("console: %s %s refused: no valid CSRF token", request.method, request.path)
        return refused("Refused: the form's CSRF token is not valid", CSRF_WHY, session)
    return None


def console_route(app: QuartTrio, path: str, methods: Sequence[str] = ("GET",), *,
                  action: bool = False) -> Callable[[View], View]:
    """Register a console view at `path`: it is called as `view(session, ctx, **path_args)` and returns
    HTML (a full page from `layout.page`) or a Response (a `redirect`). Not signed in: to the sign-in
    page. Every POST (PUT, DELETE) needs this session's CSRF token (form field `csrf`, or the `X-CSRF-Token`
    header a page's script sends); `action=True` also needs an
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
            if request.method in ("POST", "PUT", "DELETE"):
                refusal = await check_post(session)
                if refusal is not None:
                    return refusal
            result = view(session, console_of(app).ctx, **kwargs)
            if inspect.isawaitable(result):
                result = await result
            return result if isinstance(result, Response) else html(str(result))

        handler.__name__ = "console_" + (getattr(view, "__name__", "") or path.strip("/").replace("/", "_") or "root")
        app.route(path, methods=list(methods))(handler)
        return view

    return wrap


def role_of(key: str, ctx: Context) -> tuple[str, str, Role] | None:
    """(hash, id, role) of a key that may sign in (admin or viewer, not expired); None otherwise."""
    key_hash = hash_key(key)
    found = ctx.state().keys.get(key_hash)
    if found is None or found.role not in CONSOLE_ROLES:
        return None
    if found.expires_at is not None and found.expires_at <= ctx.clock():
        return None
    role: Role = "admin" if found.role == "admin" else "viewer"
    return key_hash, found.id, role
