"""The `status` command: the cluster summary (leader, control planes, nodes, models, warnings)
in one page, drawn by `render.fleet.render_status`. With no leader to ask, the control planes as the
member asked sees them, then the error."""

from __future__ import annotations

import cyclopts

from llmgw.cli.ctl.errors import EXIT_OK, CtlError, Refused
from llmgw.cli.ctl.render import render_members
from llmgw.cli.ctl.render.fleet import render_status
from llmgw.cli.ctl.session import SessionParam, api_path

# A standby answers these when it has no leader to forward to (`Refused` reads `code: message`).
_NO_LEADER = ("no_leader:", "leader_unreachable:")


def register(app: cyclopts.App) -> None:
    app.command(status)


def status(*, session: SessionParam) -> int:
    """The cluster summary: leader, control planes, nodes, models and warnings."""
    try:
        _, doc = session.request("GET", api_path("status"))
    except Refused as e:
        if not e.message.startswith(_NO_LEADER):
            raise
        try:  # each member answers this one itself
            _, members = session.request("GET", api_path("cluster", "members"))
        except CtlError:
            raise e from None
        session.show(members, render_members)
        raise
    session.show(doc, render_status)
    return EXIT_OK
