"""The root `ctl` app: global options (--url, --key, --state-dir, --json), the list of
command groups, and dispatch: one Session per run, every CtlError as `error: ...` and its exit code."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, TextIO

import cyclopts
import httpx
from cyclopts import Parameter

from llmgw.cli.ctl.errors import EXIT_OK, EXIT_USAGE, CtlError
from llmgw.cli.ctl.session import Io, Session

# The command groups: each names a module of this package whose `register(app)` adds
# its commands (`ctl --help` sorts them). A new group is a new module and one line here.
COMMAND_GROUPS = (
    "gateways",
    "guard",
    "keys",
    "members",
    "mirror",
    "models",
    "nodes",
    "notify",
    "plan",
    "requests",
    "settings",
    "status",
    "trust",  # after "nodes": it adds `nodes token|certs|revoke`
    "upgrade",
)

_commands = cyclopts.App(name="ctl", help="The operator's command line over the admin API.")


def register_groups(app: cyclopts.App, groups: Sequence[str] = COMMAND_GROUPS) -> None:
    for group in groups:
        module = importlib.import_module(f"llmgw.cli.ctl.{group}")
        register: Callable[[cyclopts.App], None] = module.register
        register(app)


register_groups(_commands)

# `ctl_app` is the meta app of `_commands`: it takes the global options wherever
# they appear (`ctl --json status` and `ctl status --json`), then runs the command.
ctl_app = _commands.meta
ctl_app.help = _commands.help


@ctl_app.default
def ctl(
    *tokens: Annotated[str, Parameter(show=False, allow_leading_hyphen=True)],
    url: Annotated[str | None, Parameter(name="--url")] = None,
    key: Annotated[str | None, Parameter(name="--key")] = None,
    state_dir: Annotated[Path, Parameter(name="--state-dir")] = Path(".llmgw"),
    ca_file: Annotated[str | None, Parameter(name="--ca-file")] = None,
    as_json: Annotated[bool, Parameter(name="--json", negative="", show_default=False)] = False,
    io: Annotated[Io | None, Parameter(parse=False)] = None,
) -> int:
    """The operator's command line over the admin API.

    Parameters
    ----------
    url
        Admin API base URL, e.g. http://127.0.0.1:8081 (else LLMGW_URL, else DIR/credentials.json).
    key
        Admin key (else LLMGW_KEY, else DIR/credentials.json).
    state_dir
        Directory holding credentials.json, as written by `llmgw up`.
    ca_file
        The cluster's CA bundle, to verify an https admin URL (else LLMGW_CA_FILE, else the one
        credentials.json names, else STATE_DIR/tls/ca.pem).
    as_json
        Print the API's JSON as it came, for scripts.
    """
    io = io or Io()
    command, bound, ignored = _commands.parse_args(tokens, **_consoles(io))
    if "session" not in ignored:  # help, version
        result = command(*bound.args, **bound.kwargs)
        return result if isinstance(result, int) else EXIT_OK
    session = Session(url=url, key=key, state_dir=state_dir, as_json=as_json, io=io, ca_file=ca_file)
    try:
        return int(command(*bound.args, **bound.kwargs, session=session))
    except CtlError as e:
        session.note(f"error: {e.message}")
        return e.exit_code
    finally:
        session.close()


def _consoles(io: Io) -> dict[str, Any]:
    """Where cyclopts should print help and usage errors, when not to the real streams."""
    if io.stdout is None and io.stderr is None:
        return {}
    from rich.console import Console  # cyclopts already loaded it; only tests get here

    consoles: dict[str, Any] = {}
    if io.stdout is not None:
        consoles["console"] = Console(file=io.stdout, width=100)
    if io.stderr is not None:
        consoles["error_console"] = Console(file=io.stderr, width=100)
    return consoles


def run_ctl(
    argv: Sequence[str],
    *,
    transport: httpx.BaseTransport | None = None,
    env: Mapping[str, str] | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Run `llmgw ctl ARGV...` and return its exit code, never exiting the process.

    A usage error cyclopts finds is printed by cyclopts and returns 2.
    """
    io = Io(transport=transport, env=env, stdout=stdout, stderr=stderr)
    try:
        command, bound, ignored = ctl_app.parse_args(list(argv), **_consoles(io))
        extra = {"io": io} if "io" in ignored else {}
        result = command(*bound.args, **bound.kwargs, **extra)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    return result if isinstance(result, int) else EXIT_OK
