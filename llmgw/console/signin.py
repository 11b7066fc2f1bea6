"""The console's sign-in and sign-out routes and its static files (`/console/static/...`, shipped in
the package: no CDN, since fleets are often air-gapped).

The key arrives in a POST body only (never a URL), is checked against the cluster's keys, and is never
logged nor put in a cookie: the cookie holds a random session token.
"""

from __future__ import annotations

import hmac
import logging
import secrets
from importlib import resources
from typing import TYPE_CHECKING

from quart import Response, request

from llmgw.console import auth, layout, sessions
from llmgw.console.layout import esc

if TYPE_CHECKING:
    from quart_trio import QuartTrio

log = logging.getLogger("llmgw.console")

STATIC = {"console.js": "text/javascript; charset=utf-8", "console.css": "text/css; charset=utf-8"}
KEY_MAX_CHARS = 1000


def _form(token: str, problem: str = "") -> str:
    error = (f'<p class="banner warn" id="signin-error" data-testid="signin-error">{esc(problem)}</p>'
             if problem else "")
    return layout.bare("Sign in", f"""<h1>Sign in</h1>{error}
<form method="post" action="/signin" id="signin-form" data-testid="signin-form" autocomplete="off">
<input type="hidden" name="csrf" value="{esc(token)}">
<label for="admin-key">Admin key</label>
<input type="password" id="admin-key" name="key" data-testid="admin-key" required autofocus>
<button type="submit" data-testid="signin-submit">Sign in</button>
</form>
<p>An admin key acts; a viewer key (<code>llmgw ctl keys create NAME --role viewer</code>) sees every page
but cannot act. Client keys cannot sign in.</p>""")


def _signin_page(problem: str = "", status: int = 200) -> Response:
    """The form, with a fresh sign-in CSRF token in it and in its cookie (double submit)."""
    token = secrets.token_urlsafe(32)
    response = auth.html(_form(token, problem), status)
    response.set_cookie(auth.SIGNIN_COOKIE, token, **auth.cookie_flags())
    return response


def register(app: QuartTrio) -> None:
    @app.route("/signin", methods=["GET"])
    async def console_signin_form() -> Response:
        if auth.current_entry() is not None:
            return auth.redirect("/")
        return _signin_page()

    @app.route("/signin", methods=["POST"])
    async def console_signin() -> Response:
        console = sessions.console_of(app)
        if not auth.same_origin():
            return _signin_page(auth.ORIGIN_WHY, 403)
        sent = await auth.form_value("csrf") or ""
        expected = request.cookies.get(auth.SIGNIN_COOKIE) or ""
        if not expected or not hmac.compare_digest(sent.encode(), expected.encode()):
            return _signin_page("This sign-in form is stale or came from another site (its CSRF token does not "
                                "match); nothing was checked. Enter the key again.", 403)
        key = (await auth.form_value("key") or "").strip()
        found = auth.role_of(key, console.ctx) if 0 < len(key) <= KEY_MAX_CHARS else None
        if found is None:
            log.warning("console: a sign-in from %s with a key that is not an admin or viewer key",
                        request.remote_addr)
            return _signin_page("That key is not an admin or viewer key of this cluster (a client key cannot "
                                "sign in; an expired or revoked key neither).", 401)
        key_hash, key_id, role = found
        token = console.sessions.open(key, key_hash, key_id, role)
        log.info("console: %s key %s signed in", role, key_id)
        response = auth.redirect("/")
        response.set_cookie(auth.COOKIE, token, **auth.cookie_flags())
        response.delete_cookie(auth.SIGNIN_COOKIE, path="/")
        return response

    @auth.console_route(app, "/signout", methods=("POST",))
    async def signout(session: sessions.Session, ctx: object) -> Response:
        sessions.console_of(app).sessions.close(request.cookies.get(auth.COOKIE))
        log.info("console: key %s signed out", session.key_id)
        response = auth.redirect("/signin")
        response.delete_cookie(auth.COOKIE, path="/", httponly=True, samesite="Strict", secure=auth.is_tls())
        return response

    @app.route("/console/static/<name>", methods=["GET"])
    async def console_static(name: str) -> Response:
        if name not in STATIC:
            return Response("not found", status=404, content_type="text/plain")
        data = resources.files("llmgw.console").joinpath("static", name).read_bytes()
        return Response(data, content_type=STATIC[name], headers={"cache-control": "no-cache"})
