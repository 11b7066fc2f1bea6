"""`llmgw server add USER@HOST --role agent|control|gateway`: add a machine to the cluster over ssh (the
operation is `llmgw.remote.server_add`; this is its command line: flags, the admin API found as `llmgw ctl`
finds it, each step a line, or a JSON line with --json). Exit 0 once the machine has joined; 1 when a check
found problems (each named; nothing was changed) or a step failed; 2 for a wrong command line."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Literal

import cyclopts
from cyclopts import Parameter

from llmgw.cli.ctl.errors import EXIT_API, EXIT_OK, EXIT_USAGE, UsageError

server_app = cyclopts.App(name="server", help="Machines of the cluster, over ssh: `llmgw server add`.")


@server_app.command
def add(
    target: Annotated[str, Parameter(help="USER@HOST: the machine, as ssh reaches it (the user must be root, or "
                                          "own --remote-dir).")],
    /,
    *,
    role: Annotated[Literal["agent", "control", "gateway"], Parameter(help="What the machine will be.")],
    name: Annotated[str | None, Parameter(help="The node's (agent) or gateway's name (default: the machine's "
                                               "host name); a control plane is named by its Raft address.")] = None,
    floating_address: Annotated[str | None, Parameter(help="Control: ADDR/PREFIX held by whichever control plane "
                                                           "leads (with --floating-interface).")] = None,
    floating_interface: Annotated[str | None, Parameter(help="Control: the interface the floating address goes "
                                                             "on, on that machine.")] = None,
    raft_addr: Annotated[str | None, Parameter(help="Control: HOST:PORT its Raft listens on (default HOST:7000).")] = None,
    admin_addr: Annotated[str | None, Parameter(help="Control: HOST:PORT of its admin API (default HOST:8081).")] = None,
    cluster_secret_file: Annotated[Path | None, Parameter(help=(
        "Control: a copy of the first member's STATE_DIR/cluster.secret (default: LLMGW_CLUSTER_SECRET).")
    )] = None,
    listen: Annotated[str | None, Parameter(help="Gateway: HOST:PORT its /v1 API listens on (default "
                                                 "0.0.0.0:8080).")] = None,
    engine_host: Annotated[str | None, Parameter(help="Agent: the address its engines listen on, which gateways "
                                                      "reach (default: HOST).")] = None,
    storage: Annotated[list[str] | None, Parameter(help="Agent: PATH:FABRIC[:shared], a directory of models it "
                                                        "reports (again for more).")] = None,
    fabric: Annotated[str | None, Parameter(help="Agent: the interconnect it is on.")] = None,
    control: Annotated[list[str] | None, Parameter(help=(
        "The admin URL the machine dials (again for more; default: every member's, as the cluster lists them)."
    ))] = None,
    zipapp: Annotated[Path | None, Parameter(help=(
        "The llmgw zipapp to install there (default: the one this command runs from; `make zipapp` builds "
        "dist/llmgw.pyz).")
    )] = None,
    remote_dir: Annotated[str, Parameter(help=(
        "Where it goes there: DIR/llmgw.pyz, DIR/ROLE (the state dir), DIR/services.")
    )] = "/var/lib/llmgw",
    remote_python: Annotated[str, Parameter(help="The Python that runs llmgw there (3.11 or newer).")] = "python3",
    manager: Annotated[Literal["auto", "builtin", "systemd"], Parameter(help=(
        "Who keeps the role running there: systemd (its llmgw-ROLE unit must be installed), the built-in "
        "supervisor, or auto (systemd where it runs and the unit is installed).")
    )] = "auto",
    ssh_port: Annotated[int | None, Parameter(help="ssh's port there (default: ssh's own, 22).")] = None,
    identity: Annotated[Path | None, Parameter(help="The private key ssh authenticates with (-i).")] = None,
    ssh_option: Annotated[list[str] | None, Parameter(help="An ssh option, NAME=VALUE (-o; again for more).")] = None,
    host_key_checking: Annotated[Literal["accept-new", "yes", "no"], Parameter(help=(
        "StrictHostKeyChecking: accept-new learns a new machine's host key and refuses a changed one; yes "
        "takes only known ones.")
    )] = "accept-new",
    known_hosts: Annotated[Path | None, Parameter(help="ssh's known-hosts file (default: ssh's own).")] = None,
    url: Annotated[str | None, Parameter(help="The admin URL (else LLMGW_URL, else STATE_DIR/credentials.json).")] = None,
    key: Annotated[str | None, Parameter(help="The admin key (else LLMGW_KEY, else STATE_DIR/credentials.json).")] = None,
    state_dir: Annotated[Path, Parameter(help="Where credentials.json is (as `llmgw ctl --state-dir`).")] = Path(".llmgw"),
    ca_file: Annotated[str | None, Parameter(help="The cluster's CA bundle the admin URL is verified with (else "
                                                  "LLMGW_CA_FILE, else the one credentials.json names).")] = None,
    as_json: Annotated[bool, Parameter(name="--json", negative="", help="Each step as one JSON line.")] = False,
) -> int:
    """Add a machine to the cluster over ssh: check it, copy the zipapp, install and start the role, wait until
    it has joined."""
    import trio

    from llmgw.cli.ctl.target import resolve_target
    from llmgw.cli.roles import env_timeouts
    from llmgw.remote import RemoteError
    from llmgw.remote.admin import AdminApi, verify_with
    from llmgw.remote.server_add import AddFailed, AddRequest, Event, ServerAdd, running_zipapp
    from llmgw.remote.ssh import SshShell, SshTarget, check_target
    from llmgw.store.secret import ENV as SECRET_ENV, SecretError, parse, read_file

    def usage(words: str) -> int:
        print(f"error: {words}", file=sys.stderr)
        return EXIT_USAGE

    wrong = check_target(target)
    if wrong:
        return usage(wrong)
    pyz = zipapp or running_zipapp()
    if pyz is None:
        return usage("no zipapp to install: llmgw does not run as one here; give --zipapp PATH (`make zipapp` "
                     "builds dist/llmgw.pyz)")
    secret: str | None = None
    if role == "control":
        try:
            secret = read_file(cluster_secret_file) if cluster_secret_file is not None else (
                parse(os.environ[SECRET_ENV], SECRET_ENV) if os.environ.get(SECRET_ENV) else None)
        except SecretError as e:
            return usage(str(e))
    ssh_target = SshTarget(target, port=ssh_port, identity=identity, options=tuple(ssh_option or ()),
                           host_key_checking=host_key_checking, known_hosts=known_hosts)
    req = AddRequest(role=role, host=ssh_target.host, zipapp=pyz, name=name, dir=remote_dir.rstrip("/") or "/",
                     python=remote_python, manager=manager, controls=tuple(control or ()), engine_host=engine_host,
                     storage=tuple(storage or ()), fabric=fabric, listen=listen, raft_addr=raft_addr,
                     admin_addr=admin_addr, floating_address=floating_address, floating_interface=floating_interface,
                     cluster_secret=secret)
    problems = req.problems()
    if problems:
        return usage("; ".join(problems))
    try:
        where = resolve_target(url=url, key=key, state_dir=state_dir, env=os.environ, ca_file=ca_file)
        verify = verify_with(where.ca_file)
    except UsageError as e:
        return usage(e.message)
    except OSError as e:
        return usage(f"cannot use the CA file {where.ca_file}: {e}")
    timeouts = env_timeouts()

    def report(event: Event) -> None:
        if as_json:
            print(json.dumps(event.to_doc(), ensure_ascii=False), flush=True)
        else:
            mark = {"ok": "", "problem": "PROBLEM: ", "fail": "FAILED: ", "wait": "... ", "note": ""}[event.status]
            print(f"{event.step:<8} {mark}{event.words}", flush=True)

    async def run() -> int:
        api = AdminApi(where.url, where.key, verify=verify, timeout_s=timeouts.ctl_request_s)
        try:
            done = await ServerAdd(req, SshShell(ssh_target, connect_timeout_s=timeouts.ssh_connect_s), api, report,
                                   timeouts).run()
        except AddFailed as e:
            if as_json:
                print(json.dumps({"step": "done", "status": "fail", "words": e.words,
                                  "problems": [p.to_doc() for p in e.problems]}), flush=True)
            print(f"error: {e.words}", file=sys.stderr)
            for p in e.problems:
                print(f"  - {p.code}: {p.words}", file=sys.stderr)
            return EXIT_API
        except RemoteError as e:
            print(f"error: {e.message}", file=sys.stderr)
            return EXIT_API
        finally:
            await api.aclose()
        if as_json:
            print(json.dumps({"step": "done", "status": "ok", "words": "joined", **done}), flush=True)
        else:
            print(f"done     {done['role']} {done['name']} on {done['target']} has joined ({done['manager']} runs it)")
        return EXIT_OK

    return trio.run(run)
