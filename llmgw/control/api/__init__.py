"""The admin API (`/api/v1/...`, docs/api.md) as a quart-trio app over a control plane's `Context`.

`make_app(ctx)` registers the route table (`table.py`) through the one wrapper (`route.py`), the
streams' WebSocket routes (`streams.py`) and the answer to whatever no route answered (`errors.py`).
Other web parts (the console) mount themselves on the app through `mounts`: this package never
imports them. The only place of the control plane that imports Quart.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from quart_trio import QuartTrio

from llmgw.control.api import errors, mirror_blobs, streams
from llmgw.control.api.route import MAX_BODY_BYTES, Route, Router
from llmgw.control.api.table import ROUTES
from llmgw.control.context import Context

__all__ = ["Mount", "make_app"]

# Mounts more pages on the admin app (the console: `llmgw.console.register`).
Mount = Callable[[QuartTrio, Context], None]


def make_app(ctx: Context, mounts: Sequence[Mount] = ()) -> QuartTrio:
    app = QuartTrio("llmgw.control")
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    _stream_limit(app, [r for r in ROUTES if r.stream])
    app.config["RESPONSE_TIMEOUT"] = None
    router = Router(app, ctx)
    for route in ROUTES:
        router.add(route)
    streams.register(app, ctx)
    mirror_blobs.register(app, ctx)
    for mount in mounts:
        mount(app, ctx)
    errors.register(app, MAX_BODY_BYTES)  # what no route answered (404, 405, 413, 500...): JSON, never HTML
    return app


def _stream_limit(app: QuartTrio, routes: Sequence[Route]) -> None:
    """The requests of a route that streams its body (a release file, up to `release.MAX_RELEASE_BYTES`) get that
    limit instead of the app's: Quart fixes a request's limit when it makes the request, before routing."""
    from llmgw.release import MAX_RELEASE_BYTES

    rules = [(r.method, re.compile(re.sub(r"<[^>]+>", "[^/]+", r.rule) + "$")) for r in routes]
    base: Any = app.asgi_http_class

    class StreamedBodies(base):  # type: ignore[misc]
        def _create_request_from_scope(self, send: Any) -> Any:
            made = super()._create_request_from_scope(send)
            if any(made.method == method and rule.match(made.path) for method, rule in rules):
                made.body = made.body_class(made.content_length, MAX_RELEASE_BYTES)
            return made

    app.asgi_http_class = StreamedBodies
