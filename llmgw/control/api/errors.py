"""The admin API's answer to whatever no route answered: every HTTP error Quart or werkzeug raises
(404, 405, 413, 400, 408, ...) and any unhandled exception, in the admin error shape, never an HTML page;
and every request's body read before it is answered, so a refusal never stalls a kept-alive connection."""

from __future__ import annotations

import json

from quart import Response, request
from quart_trio import QuartTrio
from quart_trio.wrappers.response import TrioResponse
from werkzeug.exceptions import HTTPException

from llmgw.errors import AdminError

__all__ = ["register"]

# Stable codes for the statuses clients meet; any other HTTP error gets werkzeug's name, snake_cased.
_CODES = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large", 500: "internal_error"}


class _JsonResponse(TrioResponse):
    default_mimetype = "application/json"


def register(app: QuartTrio, max_body_bytes: int) -> None:
    """Answer every `HTTPException` (an unhandled exception reaches here as a 500) as an `AdminError`,
    after reading the request's body (up to the app's MAX_CONTENT_LENGTH)."""

    # What Quart answers by itself (OPTIONS, a HEAD's headers) would say text/html; nothing here is HTML.
    app.response_class = _JsonResponse

    @app.before_request
    async def read_body_first() -> None:
        # Hypercorn stalls the next request on a kept-alive connection whose last request was answered
        # with its body unread (a 404, 405 or 409 answered before any route read it): seen in ~15% of
        # such pairs. Routes that read the body get it from Quart's cache.
        await request.get_data(as_text=False)

    @app.errorhandler(HTTPException)
    async def http_error(error: HTTPException) -> Response:
        status = error.code or 500
        code = _CODES.get(status) or (error.name or "http_error").lower().replace(" ", "_").replace("'", "")
        if status == 404:
            words = f"no such endpoint: {request.method} {request.path}"
        elif status == 405:
            words = f"{request.method} is not allowed on {request.path}"
        elif status == 413:
            words = f"request bodies are limited to {max_body_bytes} bytes"
        elif status >= 500:
            # The traceback is in this member's log (Quart logs it); the client gets no internals.
            words = "this member failed on the request; it is logged"
        else:
            words = error.description or error.name or f"HTTP {status}"
        doc = AdminError(status, code, words).doc()
        allowed = getattr(error, "valid_methods", None)  # a MethodNotAllowed's
        headers = {"allow": ", ".join(allowed)} if status == 405 and allowed else {}
        return Response(json.dumps(doc), status=status, content_type="application/json", headers=headers)
