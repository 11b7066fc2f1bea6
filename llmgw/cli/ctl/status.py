"""The `status` command: the cluster summary (leader, nodes, models, warnings) in
one page; the page itself is drawn by `render.render_status`."""

from __future__ import annotations

import cyclopts

from llmgw.cli.ctl.errors import EXIT_OK
from llmgw.cli.ctl.render import render_status
from llmgw.cli.ctl.session import SessionParam, api_path


def register(app: cyclopts.App) -> None:
    app.command(status)


def status(*, session: SessionParam) -> int:
    """The cluster summary: leader, nodes, models and warnings."""
    _, doc = session.request("GET", api_path("status"))
    session.show(doc, render_status)
    return EXIT_OK
