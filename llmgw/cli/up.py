"""`llmgw up`: control, gateway and a local agent in one trio program, on one machine."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from llmgw.cli._log_flags import LogFlags


def up(
    *,
    state_dir: Path = Path(".llmgw"),
    host: str = "127.0.0.1",
    gateway_port: int = 8080,
    admin_port: int = 8081,
    raft_port: int = 0,
    catalog: Path | None = None,
    tls: bool | None = None,
    log: LogFlags = LogFlags(),
) -> None:
    """Start a one-machine cluster (its help text is at its registration in llmgw/cli/__init__.py).

    Parameters
    ----------
    state_dir
        Where the Raft journal, credentials.json, engine logs and logs live; one process per dir.
    host
        Address every listener binds to: gateway, admin API, Raft and the engines.
    gateway_port
        Port of the OpenAI-compatible API (/v1).
    admin_port
        Port of the admin API (/api/v1) and the agents' stream; `llmgw ctl` talks to it.
    raft_port
        Port of the control plane's Raft log; 0 picks a free one (a one-machine cluster has no peers to tell).
    catalog
        TOML file of [[models]] tables served on a fresh state dir (default: the built-in copy of
        examples/catalog.toml); a state dir that has a cluster keeps its own models.
    tls
        Serve the admin API over TLS with the cluster's own CA (credentials.json names its file, and
        `llmgw ctl` uses it). Default: on when --host is not a loopback address, off on loopback (so
        curl and every SDK work as they are). Off loopback the gateway's /v1 serves TLS too.
    """
    from llmgw.cli._up_run import UpOptions, run

    opts = UpOptions(state_dir=state_dir, host=host, gateway_port=gateway_port, admin_port=admin_port,
                     raft_port=raft_port, catalog=catalog, log_json=log.log_json, log_level=log.log_level, tls=tls,
                     env_client_key=os.environ.get("LLMGW_CLIENT_KEY"),
                     env_admin_key=os.environ.get("LLMGW_ADMIN_KEY"))
    sys.exit(run(opts))
