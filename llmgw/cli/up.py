"""`llmgw up`: control, gateway and a local agent in one trio program, on one machine."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import cyclopts


def up(
    *,
    state_dir: Path = Path(".llmgw"),
    host: str = "127.0.0.1",
    gateway_port: int = 8080,
    admin_port: int = 8081,
    raft_port: int = 0,
    catalog: Path | None = None,
    log_json: bool = False,
    log_level: Annotated[str, cyclopts.Parameter(help="debug, info, warning or error")] = "info",
) -> None:
    """Start a one-machine cluster: single-member Raft in STATE_DIR, a local agent, the example catalog.

    On first start it writes STATE_DIR/credentials.json (mode 0600) with the gateway and
    admin URLs and keys (LLMGW_CLIENT_KEY / LLMGW_ADMIN_KEY, if set, become the keys).
    Restarting with the same STATE_DIR keeps every model, setting and key.

    Parameters
    ----------
    state_dir: where the Raft journal, credentials, engine logs and logs live
    host: address every listener binds to
    gateway_port: the OpenAI-compatible API (/v1)
    admin_port: the admin API (/api/v1) and the agents' stream
    raft_port: Raft's port (0 picks a free one; a one-member group needs no fixed address)
    catalog: models to serve on a fresh state dir (default: the built-in example catalog)
    log_json: one JSON object per log line
    """
    from llmgw.cli._up_run import UpOptions, run

    opts = UpOptions(state_dir=state_dir, host=host, gateway_port=gateway_port, admin_port=admin_port,
                     raft_port=raft_port, catalog=catalog, log_json=log_json, log_level=log_level,
                     env_client_key=os.environ.get("LLMGW_CLIENT_KEY"),
                     env_admin_key=os.environ.get("LLMGW_ADMIN_KEY"))
    sys.exit(run(opts))
