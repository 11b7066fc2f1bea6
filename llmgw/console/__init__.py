"""The web console (`/` on the control planes' admin URL): server-rendered pages over the same summary,
request log and settings as `ctl`, signed in with an admin or viewer key (docs/console.md).

`register(app, ctx)` mounts it all on the admin app; each page module adds its routes through
`auth.console_route`, so every page is signed-in, CSRF-checked and refused to viewers alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmgw.console import (auth, do, do_add, guardrails, mirror_page, models, nodes, overview, requestlog, sessions,
                           settings_page, signin)

if TYPE_CHECKING:
    from quart_trio import QuartTrio

    from llmgw.control.context import Context

__all__ = ["register"]


def register(app: QuartTrio, ctx: Context) -> None:
    """Mount the console on the admin app (an `api.Mount`): sign-in, static files, and every page, each
    reading the control plane's `Context`, as the admin API's routes do."""
    sessions.install(app, ctx)
    signin.register(app)  # /signin, /signout, /console/static/*
    overview.register(app)  # /
    requestlog.register(app)  # /requests
    settings_page.register(app)  # /settings
    nodes.register(app)  # /nodes, /nodes/NAME
    models.register(app)  # /models, /models/NAME
    guardrails.register(app)  # /guardrails
    mirror_page.register(app)  # /mirror and the browser's upload (POST /mirror/uploads, PUT .../ID, POST .../commit)
    do.register(app)  # /do and its actions (POST /do/serve|retry|judge|system|guards)
    do_add.register(app)  # POST /do/add: `llmgw server add` run by this control plane
