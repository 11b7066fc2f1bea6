"""The `status` command: the cluster summary (leader, control planes, nodes, models, warnings)
in one page, drawn by `render.fleet.render_status`. With no leader to ask, the control planes as the
member asked sees them, then the error."""

from __future__ import annotations

from typing import Annotated, Any

import cyclopts
from cyclopts import Parameter

from llmgw.cli.ctl.errors import EXIT_OK, CtlError, Refused
from llmgw.cli.ctl.render import render_members
from llmgw.cli.ctl.render.fleet import MODEL_ROWS, render_status
from llmgw.cli.ctl.session import SessionParam, api_path

# A standby answers these when it has no leader to forward to (`Refused` reads `code: message`).
_NO_LEADER = ("no_leader:", "leader_unreachable:")


def register(app: cyclopts.App) -> None:
    app.command(status)


def status(*, session: SessionParam,
           full: Annotated[bool, Parameter(name="--full", negative="", show_default=False)] = False) -> int:
    """The cluster summary: leader, control planes, nodes, models and warnings.

    With --json, the document `GET /api/v1/status` answers: the aggregates (`node_counts`, `capacity`, `fabrics`,
    `totals`, `warnings`, `conditions`...) and a page of each list that grows with the fleet (`nodes`, `models`,
    `idle`, `certificates`: their first 20, 100, 20 and 20 rows), with `pages` saying each one's `offset`, `limit` and `total`
    (docs/api.md). `GET /api/v1/status?nodes=50&nodes_offset=100` pages on.

    Parameters
    ----------
    full
        Every row of every list (`GET /api/v1/status?full=1`: the document before 0.3.0, without `pages`), for
        scripts that read each node or model from it; large at a large fleet (3 MB at 1,000 nodes).
    """
    try:
        # No wait for an election: without a leader, status says at once how the members see it.
        _, doc = session.request("GET", api_path("status") + ("?full=1" if full else ""), wait_for_leader=False)
    except Refused as e:
        if not e.message.startswith(_NO_LEADER):
            raise
        try:  # each member answers this one itself
            _, members = session.request("GET", api_path("cluster", "members"))
        except CtlError:
            raise e from None
        session.show(members, render_members)
        raise
    session.show(doc if session.as_json else _with_short_models(session, doc), render_status)
    return EXIT_OK


def _with_short_models(session: SessionParam, doc: dict[str, Any]) -> dict[str, Any]:
    """The page shows at most MODEL_ROWS models of a large catalog, those short of what they should have now: when
    the answer's page of models leaves some out, those rows are asked for (the look is kept per revision, so this
    costs the control plane a page's serialization)."""
    page = doc.get("pages", {}).get("models") if isinstance(doc.get("pages"), dict) else None
    models = doc.get("models")
    if not isinstance(page, dict) or not isinstance(models, list) or not isinstance(page.get("total"), int) \
            or page["total"] <= max(MODEL_ROWS, len(models)):
        return doc
    _, short = session.request("GET", api_path("status") + f"?nodes=0&idle=0&models={MODEL_ROWS}&short=1")
    if not isinstance(short, dict):
        return doc
    return {**doc, "models": short.get("models"), "totals": short.get("totals"),
            "pages": {**doc["pages"], "models": short.get("pages", {}).get("models")}}
