"""The `gateways` commands: every gateway the leader has seen on its stream, and restarting one in place
(it drains and runs again with its listening socket: no client refused), waiting until it follows again."""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Annotated, Any

import cyclopts
from cyclopts import Parameter

from llmgw.cli.ctl.errors import EXIT_OK, CtlError
from llmgw.cli.ctl.render import cell, dig, table
from llmgw.cli.ctl.session import Session, SessionParam, api_path
from llmgw.domain.timeouts import TIMEOUTS


def register(app: cyclopts.App) -> None:
    app.command(gateways_app)


gateways_app = cyclopts.App(name="gateways", help="The gateways that follow the leader; restart one in place.")


@gateways_app.command(name="list")
def gateways_list(*, session: SessionParam) -> int:
    """Every gateway the leader has seen: connected or not, address, pid, when its program started."""
    return session.show_answer("GET", api_path("gateways"), render=render_gateways)


gateways_app.default(gateways_list)  # `ctl gateways` alone does the same


@gateways_app.command(name="restart")
def gateways_restart(name: str, /, *, wait: Annotated[bool, Parameter(
        negative="--no-wait", help="Wait until the gateway follows the leader again, restarted (default), or "
                                   "return at once.")] = True, session: SessionParam) -> int:
    """Restart a connected gateway in place: it stops taking connections (they wait in the kernel's queue), lets
    the requests in flight finish, and runs again as the same process with the same flags, taking over its
    listening socket: no client is refused. A gateway machine run with --workers N is restarted one worker at a
    time (NAME-w1, NAME-w2, ...).

    Parameters
    ----------
    name
        The gateway's name, as `llmgw ctl gateways` lists it (a machine's name restarts each of its workers).
    """
    listed = _listed(session)
    names = [name] if name in listed else sorted((n for n in listed if _worker_of(n) == name), key=_worker_index)
    if not names:  # asked anyway: the leader says why (not found)
        names = [name]
    for one in names:
        restart_one(session, one, wait)
    return EXIT_OK


def restart_one(session: Session, name: str, wait: bool = True) -> None:
    """Ask gateway `name` to restart in place; with `wait`, until it follows the leader again as a new program."""
    _, asked = session.request("POST", api_path("gateways", name, "restart"))
    if not wait:
        session.show(asked, lambda d: f"gateway {cell(dig(d, 'restarting'))}: asked to restart")
        return
    before = dig(asked, "started_at"), dig(asked, "connected_at")
    deadline = time.monotonic() + TIMEOUTS.ctl_gateway_restart_s
    while True:
        time.sleep(TIMEOUTS.ctl_poll_s)
        row = _listed(session).get(name)
        # Back: following on a new stream, as a new program (a restart in place keeps the pid).
        if (row is not None and row.get("connected") and row.get("connected_at") != before[1]
                and row.get("started_at") not in (None, before[0])):
            session.show(row, lambda r: f"gateway {name}: restarted (pid {cell(r.get('pid'))}), following the "
                                        f"leader again")
            return
        if time.monotonic() > deadline:
            state = "not listed" if row is None else ("connected" if row.get("connected") else "not connected")
            raise CtlError(f"gateway {name} was asked to restart but is not back within "
                           f"{TIMEOUTS.ctl_gateway_restart_s:g} s ({state}); its log says why (`llmgw service "
                           f"status gateway` on its machine)")


def connected_gateways(session: Session) -> tuple[list[str], list[str]]:
    """The gateways following the leader now, by name: (those that can restart in place, those that cannot).
    One inside a control plane's process (`llmgw up`) is neither: it restarts with its control plane."""
    rows = {name: row for name, row in _listed(session).items() if row.get("connected") and not row.get("in_process")}
    return (sorted(n for n, r in rows.items() if r.get("restartable")),
            sorted(n for n, r in rows.items() if not r.get("restartable")))


def wait_following(session: Session, name: str) -> None:
    """Until gateway `name` follows the leader (after control planes restarted, it finds the new one)."""
    deadline = time.monotonic() + TIMEOUTS.ctl_gateway_restart_s
    while not ((row := _listed(session).get(name)) is not None and row.get("connected")):
        if time.monotonic() > deadline:
            raise CtlError(f"gateway {name} does not follow the leader after {TIMEOUTS.ctl_gateway_restart_s:g} s; "
                           f"its log says why (`llmgw service status gateway` on its machine)")
        time.sleep(TIMEOUTS.ctl_poll_s)


def _listed(session: Session) -> dict[str, Mapping[str, Any]]:
    _, doc = session.request("GET", api_path("gateways"))
    return {str(g.get("name")): g for g in dig(doc, "gateways") or [] if isinstance(g, Mapping)}


def _worker_of(name: str) -> str | None:
    machine, sep, index = name.rpartition("-w")
    return machine if sep and index.isdigit() else None


def _worker_index(name: str) -> int:
    return int(name.rpartition("-w")[2])


# --- rendering: a pure function of the JSON; unknown is `-`, never 0 --------------------------------


def render_gateways(doc: Mapping[str, Any]) -> str:
    rows = [g for g in dig(doc, "gateways") or [] if isinstance(g, Mapping)]
    if not rows:
        return "no gateway has followed the leader: start one (`llmgw gateway --control URL ...`)"
    return table(["GATEWAY", "STATE", "ADDRESS", "PID", "STARTED", "RESTART"],
                 [[g.get("name"), "connected" if g.get("connected") else "not connected", g.get("address"),
                   g.get("pid"), _when(g.get("started_at")), _restart(g)]
                  for g in rows])


def _restart(g: Mapping[str, Any]) -> str:
    if g.get("in_process"):
        return "with llmgw up"  # the gateway inside the control plane's process
    return "in place" if g.get("restartable") else "on its machine"


def _when(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return datetime.fromtimestamp(value, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
