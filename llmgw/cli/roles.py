"""`llmgw control` and `llmgw agent`: one role per process, for real clusters."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def _split_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit():
        raise SystemExit(f"error: {addr!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def control(
    *,
    state_dir: Path,
    raft_addr: str,
    admin_addr: str,
    peer: list[str] | None = None,
    log_json: bool = False,
    log_level: str = "info",
) -> None:
    """Run a control plane: Raft member, reconciler, admin API and the agents' stream.

    On a fresh state dir, LLMGW_ADMIN_KEY (required then) becomes the first admin key.

    Parameters
    ----------
    state_dir
        Raft journal and snapshots, logs; one process per dir.
    raft_addr
        HOST:PORT this member's Raft listens on.
    admin_addr
        HOST:PORT of the admin API.
    peer
        The other members' Raft HOST:PORT (repeat the flag).
    log_json
        One JSON object per log line instead of text.
    log_level
        debug, info, warning or error.
    """
    import trio

    from llmgw import logs, statedir
    from llmgw.cli import _ports
    from llmgw.cli._lifecycle import serve_until_signal
    from llmgw.control.service import ControlConfig, Seed, serve

    admin_host, admin_port = _split_addr(admin_addr)
    key = os.environ.get("LLMGW_ADMIN_KEY")
    with statedir.acquire_or_exit(state_dir, "llmgw control"):  # before anything in the dir is touched
        logs.setup(json_lines=log_json, level=log_level, log_file=state_dir / "logs" / "control.log")
        cfg = ControlConfig(state_dir=state_dir, raft_addr=raft_addr, admin_host=admin_host, admin_port=admin_port,
                            peers=list(peer or []), seed=Seed(admin_key=key) if key else None)

        async def serve_naming_ports(*, task_status: trio.TaskStatus[object] = trio.TASK_STATUS_IGNORED) -> None:
            async with trio.open_nursery() as nursery:
                with _ports.naming("admin API", admin_host, admin_port, "--admin-addr"):
                    handle = await nursery.start(serve, cfg)
                task_status.started(handle)

        status = trio.run(serve_until_signal, serve_naming_ports)
    sys.exit(status)


def agent(
    *,
    control: list[str],
    state_dir: Path,
    node: str | None = None,
    key: str | None = None,
    engine_host: str = "127.0.0.1",
    log_json: bool = False,
    log_level: str = "info",
) -> None:
    """Run an agent: report this node, start and stop engines as the leading control plane says.

    Parameters
    ----------
    control
        Admin URL of a control plane (repeat the flag for each).
    state_dir
        Engine logs and the agent's log; one process per dir.
    node
        This node's name (default: the host name).
    key
        The key to authenticate to control (default: LLMGW_KEY).
    engine_host
        Address engines listen on; gateways must reach it.
    log_json
        One JSON object per log line instead of text.
    log_level
        debug, info, warning or error.
    """
    import socket

    import trio

    from llmgw import logs, statedir
    from llmgw.agent import AgentConfig, serve
    from llmgw.cli._lifecycle import serve_until_signal

    secret = key or os.environ.get("LLMGW_KEY")
    if not secret:
        raise SystemExit("error: give --key or set LLMGW_KEY (an admin key of the cluster)")
    with statedir.acquire_or_exit(state_dir, "llmgw agent"):  # before anything in the dir is touched
        logs.setup(json_lines=log_json, level=log_level, log_file=state_dir / "logs" / "agent.log")
        cfg = AgentConfig(controls=control, key=secret, state_dir=state_dir, node=node or socket.gethostname(),
                          engine_host=engine_host)
        status = trio.run(serve_until_signal, serve, cfg)
    sys.exit(status)
