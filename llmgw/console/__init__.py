"""The web console (`/` on the control planes' admin URL): server-rendered pages over the same summary,
request log and settings as `ctl`, signed in with an admin or viewer key (docs/console.md).

`register(app, deps)` mounts it all on the admin app; each page module adds its routes through
`auth.console_route`, so every page is signed-in, CSRF-checked and refused to viewers alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmgw.console import auth, do, guardrails, models, nodes, overview, requestlog, settings_page, signin

if TYPE_CHECKING:
    from quart_trio import QuartTrio

    from llmgw.control.admin import ControlDeps

__all__ = ["register"]


def register(app: QuartTrio, deps: ControlDeps, cluster_info: auth.ClusterInfo | None = None,
             views: auth.PlanViews | None = None) -> None:
    """Mount the console on the admin app: sign-in, static files, and every page. `cluster_info` and
    `views` are the admin app's own (the members' table, the reconciler's model views)."""
    auth.install(app, deps, cluster_info, views)
    signin.register(app)  # /signin, /signout, /console/static/*
    overview.register(app)  # /
    requestlog.register(app)  # /requests
    settings_page.register(app)  # /settings
    nodes.register(app)  # /nodes, /nodes/NAME
    models.register(app)  # /models, /models/NAME
    guardrails.register(app)  # /guardrails
    do.register(app)  # /do and its actions (POST /do/serve|retry|judge|system|guards)
