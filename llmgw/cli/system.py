"""`llmgw stop`, `llmgw start`, `llmgw status`: the whole cluster, through the admin API, found as
`ctl` finds it (flags, LLMGW_URL/LLMGW_KEY, DIR/credentials.json); ctl's session, errors and rendering."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Callable

from cyclopts import Parameter

from llmgw.cli.ctl.errors import EXIT_OK, CtlError
from llmgw.cli.ctl.session import Io, Session, api_path
from llmgw.cli.ctl.status import status as ctl_status

# The help of each option is said once, here, for the three commands.
Url = Annotated[str | None, Parameter(name="--url",
                                      help="Admin API base URL (else LLMGW_URL, else DIR/credentials.json).")]
Key = Annotated[str | None, Parameter(name="--key", help="Admin key (else LLMGW_KEY, else DIR/credentials.json).")]
StateDir = Annotated[Path, Parameter(name="--state-dir",
                                     help="Directory holding credentials.json, as written by `llmgw up`.")]
Json = Annotated[bool, Parameter(name="--json", negative="", show_default=False,
                                 help="Print the API's JSON as it came, for scripts.")]
IoParam = Annotated[Io | None, Parameter(parse=False)]


def stop(*, url: Url = None, key: Key = None, state_dir: StateDir = Path(".llmgw"), as_json: Json = False,
         io: IoParam = None) -> int:
    """Stop serving, cluster-wide and live: every model wants 0 replicas, every GPU is freed, the
    gateway answers POSTs under /v1/ with 503 system_stopped. Control planes and agents keep running;
    no model definition changes."""
    return _run(url, key, state_dir, as_json, io, lambda s: _switch(s, "stop"))


def start(*, url: Url = None, key: Key = None, state_dir: StateDir = Path(".llmgw"), as_json: Json = False,
          io: IoParam = None) -> int:
    """Serve again after `llmgw stop`: every model is placed again as it asks."""
    return _run(url, key, state_dir, as_json, io, lambda s: _switch(s, "start"))


def status(*, url: Url = None, key: Key = None, state_dir: StateDir = Path(".llmgw"), as_json: Json = False,
           io: IoParam = None) -> int:
    """The cluster summary (the same page as `llmgw ctl status`), saying when serving is stopped."""
    return _run(url, key, state_dir, as_json, io, lambda s: ctl_status(session=s))


def restart(*, url: Url = None, key: Key = None, state_dir: StateDir = Path(".llmgw"), as_json: Json = False,
            io: IoParam = None) -> int:
    """Restart the cluster's processes in an order that keeps it serving: every connected agent, one at a
    time, in place (its engines keep serving and are adopted); then the control planes, standbys first and
    the leader last (it hands leadership over before it stops); then every gateway that follows the leader,
    one at a time (a --workers machine one worker at a time), in place: it drains and the program that runs
    next takes over its listening socket, so no client is refused. Each is back before the next is asked."""
    return _run(url, key, state_dir, as_json, io, _restart_all)


def _restart_all(session: Session) -> int:
    from llmgw.cli.ctl.gateways import connected_gateways, restart_one, wait_following
    from llmgw.cli.ctl.members import members_restart
    from llmgw.cli.ctl.nodes import nodes_restart

    gateways, fixed = connected_gateways(session)  # now: after the control planes, each follows the new leader
    _, doc = session.request("GET", api_path("nodes"))
    nodes = [n for n in (doc.get("nodes") or []) if isinstance(n, dict) and n.get("state") == "connected"]
    session.note(f"restarting {len(nodes)} agent(s), one at a time")
    for n in nodes:
        nodes_restart(str(n["node"]), wait=True, session=session)
    _, table = session.request("GET", api_path("cluster", "members"))
    rows = [r for r in (table.get("members") or []) if isinstance(r, dict)]
    ordered = [r for r in rows if r.get("role") != "leader"] + [r for r in rows if r.get("role") == "leader"]
    session.note(f"restarting {len(ordered)} control plane(s): standbys first, the leader last")
    for r in ordered:
        members_restart(str(r["id"]), wait=True, session=session)
    session.note(f"restarting {len(gateways)} gateway(s), one at a time: each drains, and the program that runs "
                 f"next takes over its listening socket")
    for name in gateways:
        wait_following(session, name)
        restart_one(session, name)
    if fixed:
        session.note(f"not restarted, they cannot restart in place (an older version, or inside another process): "
                     f"{', '.join(fixed)}; `llmgw service restart gateway` on each machine")
    return EXIT_OK


def _run(url: str | None, key: str | None, state_dir: Path, as_json: bool, io: Io | None,
         command: Callable[[Session], int]) -> int:
    session = Session(url=url, key=key, state_dir=state_dir, as_json=as_json, io=io or Io())
    try:
        return command(session)
    except CtlError as e:
        session.note(f"error: {e.message}")
        return e.exit_code
    finally:
        session.close()


def _switch(session: Session, verb: str) -> int:
    _, doc = session.request("POST", api_path("system", verb))
    session.show(doc, render_switch)
    return EXIT_OK


def render_switch(doc: Any) -> str:
    """What `stop`/`start` did, in words."""
    if not isinstance(doc, dict):
        return str(doc)
    replicas, gpus = doc.get("replicas_placed"), doc.get("gpus_placed")
    held = f"{replicas} replica(s) on {gpus} GPU(s)" if replicas is not None else "the replicas"
    if doc.get("stopped"):
        head = "serving stopped" if doc.get("changed") else "serving was already stopped"
        tail = (f"; {held} are being stopped" if replicas else "; nothing is placed") + \
            " — `llmgw status` shows them go; `llmgw start` serves again"
        return head + tail
    head = "serving started" if doc.get("changed") else "serving was not stopped"
    return f"{head}: every model is placed again as it asks — `llmgw status` shows them come up"
