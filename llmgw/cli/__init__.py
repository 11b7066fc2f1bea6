"""The `llmgw` command line (cyclopts). Commands load lazily, so `--help` and `ctl`
start without importing the servers (trio, quart, hypercorn)."""

from __future__ import annotations

import cyclopts

from llmgw import __version__

app = cyclopts.App(
    name="llmgw",
    help="Run open-weight LLMs on your own machines behind one OpenAI-compatible endpoint.",
    version=__version__,
)

# What a command is, in `llmgw --help` and atop its own --help, is said here: a lazily
# loaded command is not imported to list it, and this text replaces its docstring's.
# What each flag is stays in the command's docstring (numpydoc `Parameters`).
app.command("llmgw.cli.up:up", name="up", help="""\
Start a one-machine cluster: control, gateway and a local agent, serving the example catalog.

On first start it writes STATE_DIR/credentials.json (mode 0600) with the gateway and admin
URLs and keys (LLMGW_CLIENT_KEY / LLMGW_ADMIN_KEY, if set, become the keys). Restarting
with the same STATE_DIR keeps every model, setting and key.""")
app.command("llmgw.cli.roles:control", name="control", help="""\
Run a control plane: Raft member, reconciler, admin API and the agents' stream.

On a fresh state dir, LLMGW_ADMIN_KEY (required then) becomes the first admin key.""")
app.command("llmgw.cli.roles:agent", name="agent",
            help="Run an agent: report this node, start and stop engines as the leading control plane says.")
app.command("llmgw.cli.roles:gateway", name="gateway",
            help="Run a gateway: the OpenAI-compatible /v1 API, following the leading control plane's table.")
app.command("llmgw.cli.engine:engine_app", name="engine",
            help="Run one inference engine process (the agent starts these).")
app.command("llmgw.cli.ctl:ctl_app", name="ctl", help="The operator's command line over the admin API.")
app.command("llmgw.cli.system:stop", name="stop", help="""\
Stop serving cluster-wide, live: every model wants 0 replicas and every GPU is freed; definitions stay.""")
app.command("llmgw.cli.system:start", name="start",
            help="Serve again after `llmgw stop`: every model is placed again as it asks.")
app.command("llmgw.cli.system:restart", name="restart", help="""\
Restart the cluster's agents (in place, engines kept serving) and control planes (the leader last, handing over).""")
app.command("llmgw.cli.system:status", name="status",
            help="The cluster summary (as `llmgw ctl status`), saying when serving is stopped.")
app.command("llmgw.cli.init:init", name="init", help="""\
Make the first control plane of a new cluster on this machine, installed and started as a service.

State dir, cluster secret, the cluster CA and this machine's certificate, the first admin key (shown
once, stored hashed); each step looks first, so running it again on a live cluster changes nothing.""")
app.command("llmgw.cli.server:server_app", name="server", help="""\
Machines of the cluster, over ssh: `llmgw server add USER@HOST --role agent|control|gateway`.

Checks the machine first (ssh, Python, ports, clock, disk, not in the cluster already) and changes nothing
when any check fails; then copies the zipapp, installs and starts the role, and waits until it has joined.""")
app.command("llmgw.cli.service:service_app", name="service", help="""\
This machine's roles as services: install what a role runs, then status, start, stop, restart.

Through systemd's llmgw-ROLE units where systemd runs (docs/systemd/), else a built-in supervisor that
starts a role again when it exits (its files in the services' dir).""")
app.command("llmgw.cli.doctor:doctor", name="doctor",
            help="Check this machine: GPUs by each discovery path, MIG, engines, state dir, ports, clock.")
app.command("llmgw.simfleet.command:sim_fleet", name="sim-fleet", help="""\
Simulate a fleet for tests and benchmarks: N nodes in one process, each a real agent on its own stream.

Every node reports GPUs of one class (whole or MIG), a fabric and the models its storage holds;
its replicas are in-process sim engines (their --startup-delay, --fail-start, --tokens-per-s
honoured) on one HTTP server. Each node joins as a machine does and its agent authenticates with a
certificate of its own: LLMGW_KEY (the operator's admin key, never a node's) makes one join token per
node; --control takes the https:// admin URLs.""")


# What a shell reports for a command that a closed pipe ended (`yes | head`): 128 + SIGPIPE.
EXIT_BROKEN_PIPE = 128 + 13


def main() -> None:
    """Run the command line. Output into a pipe that closed early (`llmgw ctl models | head`) ends
    it quietly with EXIT_BROKEN_PIPE, as a command that a shell's SIGPIPE ended: no traceback."""
    try:
        app()
    except BrokenPipeError:
        _quiet_stdout()
        raise SystemExit(EXIT_BROKEN_PIPE) from None


def _quiet_stdout() -> None:
    """Point stdout at /dev/null: the interpreter flushes it at exit, and a flush into the closed
    pipe would print "Exception ignored ... BrokenPipeError" instead."""
    import os
    import sys

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
