"""`llmgw service`: this machine's roles as services. `install` stores what a role runs (DIR/ROLE.json);
`status`, `start`, `stop`, `restart` act on one role or on every installed one, through systemd where it
runs and the unit is installed, else through the built-in supervisor (`--manager` picks). Exit 0 when
everything asked is done; 1 when a manager failed (its words say why); 2 for a wrong command line.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Literal

import cyclopts
from cyclopts import Parameter

from llmgw.cli.ctl.errors import EXIT_API, EXIT_OK, EXIT_USAGE
from llmgw.cli.roles import env_timeouts
from llmgw.interfaces import ServiceManager
from llmgw.service.manager import ServiceError, ServiceStatus, systemd_runs
from llmgw.service.spec import DIR_ENV, START_ORDER, ServiceSpec, SpecError, install as install_spec, load, \
    roles_asked, services_dir
from llmgw.service.supervisor import Supervisor, supervise as run_supervisor

service_app = cyclopts.App(name="service", help="This machine's llmgw roles as services (systemd, or a built-in "
                                                "supervisor where systemd does not run).")

Dir = Annotated[Path | None, Parameter(name="--dir", help=f"The services' dir (else ${DIR_ENV}, else "
                                                          f"/var/lib/llmgw/services).")]
Manager = Annotated[Literal["auto", "systemd", "builtin"], Parameter(
    name="--manager", help="Who runs the roles: systemd's llmgw-ROLE units, the built-in supervisor, or auto "
                           "(systemd where it runs, else built-in).")]
Role = Annotated[str, Parameter(help="control, gateway or agent.")]
RoleOrAll = Annotated[str | None, Parameter(help="control, gateway or agent (default: every installed role).")]
Json = Annotated[bool, Parameter(name="--json", negative="", show_default=False, help="One JSON object per role.")]


def manager_for(dir: Path, which: str) -> ServiceManager:
    if which == "systemd" or (which == "auto" and systemd_runs()):
        from llmgw.service.systemd import Systemd

        return Systemd()
    return Supervisor(dir, env_timeouts())


@service_app.command
def install(role: Role, flags: Annotated[list[str] | None, Parameter(
        help="The role's own flags, after `--` (as `llmgw ROLE --help` lists them).")] = None, /, *, dir: Dir = None,
            env: Annotated[list[str] | None, Parameter(name="--env", help="NAME=VALUE for the role's environment "
                                                                          "(again for more).")] = None,
            env_stdin: Annotated[bool, Parameter(name="--env-stdin", negative="", help=(
                "Read more NAME=VALUE lines for the role's environment from stdin (a join token stays off every "
                "command line: `llmgw server add` gives it so)."))] = False) -> int:
    """Store what ROLE runs: its flags after `--` (`llmgw service install control -- --state-dir ...`).
    Replaces an earlier install; a running role takes it at its next (re)start."""
    where = services_dir(dir)
    pairs = {}
    given = list(env or [])
    if env_stdin:
        given += [line for line in sys.stdin.read().splitlines() if line.strip()]
    for item in given:
        name, sep, value = item.partition("=")
        if not sep:
            return _usage(f"--env {item!r}: give NAME=VALUE")
        pairs[name] = value
    try:
        path = install_spec(where, ServiceSpec(role, tuple(flags or ()), pairs))
    except SpecError as e:
        return _usage(str(e))
    print(f"{role}: installed ({path}); `llmgw service start {role}` starts it")
    return EXIT_OK


@service_app.command
def status(role: RoleOrAll = None, /, *, dir: Dir = None, manager: Manager = "auto", as_json: Json = False) -> int:
    """Each role's state: running (pid, since, restarts), restarting, stopped (how it last ended)."""
    return _each(role, dir, manager, as_json, "show", lambda m, r: m.status(r))


@service_app.command
def start(role: RoleOrAll = None, /, *, dir: Dir = None, manager: Manager = "auto", as_json: Json = False) -> int:
    """Start ROLE (or every installed role: control, gateway, agent, in that order) if it is not running."""
    return _each(role, dir, manager, as_json, "start", lambda m, r: m.start(r))


@service_app.command
def stop(role: RoleOrAll = None, /, *, dir: Dir = None, manager: Manager = "auto", as_json: Json = False) -> int:
    """Stop ROLE (or every installed role, agent first): its own orderly stop, killed past service_stop_s."""
    return _each(role, dir, manager, as_json, "stop", lambda m, r: m.stop(r), reverse=True)


@service_app.command
def restart(role: RoleOrAll = None, /, *, dir: Dir = None, manager: Manager = "auto", as_json: Json = False) -> int:
    """Stop, then start ROLE (or every installed role, one after the other): a new process of it."""
    return _each(role, dir, manager, as_json, "restart", lambda m, r: m.restart(r))


@service_app.command(show=False)
def supervise(role: Role, /, *, dir: Dir = None) -> int:
    """The built-in supervisor of ROLE (what `start` runs, in a session of its own)."""
    return run_supervisor(services_dir(dir), role, env_timeouts())


@service_app.command(name="exec", show=False)
def exec_(role: Role, /, *, dir: Dir = None) -> int:
    """Replace this process with ROLE as installed (what systemd's llmgw-ROLE unit runs)."""
    try:
        spec = load(services_dir(dir), role)
    except SpecError as e:
        return _usage(str(e))
    if spec is None:
        return _usage(f"{role} is not installed in {services_dir(dir)}: `llmgw service install {role} -- FLAGS`")
    argv = spec.command()
    os.execve(argv[0], argv, {**os.environ, **spec.env})


def _each(role: str | None, dir: Path | None, which: str, as_json: bool, verb: str,
          act: Callable[[ServiceManager, str], ServiceStatus], reverse: bool = False) -> int:
    where = services_dir(dir)
    try:
        roles = list(roles_asked(where, role, verb))
    except SpecError as e:
        return _usage(str(e))
    if reverse:
        roles.sort(key=START_ORDER.index, reverse=True)
    m = manager_for(where, which)
    code = EXIT_OK
    for r in roles:
        try:
            st = act(m, r)
        except (ServiceError, SpecError) as e:
            print(f"{r}: {verb} failed: {e}", file=sys.stderr)
            code = EXIT_API
            continue
        print(json.dumps(st.to_doc()) if as_json else _line(st))
        if verb in ("start", "restart") and st.state != "running":
            code = EXIT_API
        if verb == "stop" and st.state not in ("stopped", "not installed"):
            code = EXIT_API
    return code


def _line(st: ServiceStatus) -> str:
    parts = [f"{st.role:<8} {st.state}"]
    if st.pid is not None:
        parts.append(f"pid {st.pid}")
    if st.since is not None and st.state in ("running", "stopped"):
        parts.append(f"{'for' if st.state == 'running' else 'since'} {_ago(time.time() - st.since)}")
    if st.restarts:
        parts.append(f"{st.restarts} restart(s)")
    if st.last_exit:
        parts.append(f"last exit: {st.last_exit}")
    parts.append(f"({st.manager})")
    line = ", ".join(parts[:1] + parts[1:-1]) + " " + parts[-1] if len(parts) > 2 else " ".join(parts)
    return line + (f"\n         {st.words}" if st.words else "")


def _ago(seconds: float) -> str:
    s = max(0, int(seconds))
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min"
    return f"{s // 3600} h"


def _usage(words: str) -> int:
    print(f"error: {words}", file=sys.stderr)
    return EXIT_USAGE
