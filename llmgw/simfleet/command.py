"""`llmgw sim-fleet`: the command line of the fleet simulator (flags -> `FleetConfig`), run until
SIGINT/SIGTERM like every role. LLMGW_KEY is the operator's admin key: with it the fleet makes a join
token for each simulated node, and each node's agent authenticates with its own certificate."""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from cyclopts import Parameter

from llmgw.cli import _collector
from llmgw.cli._log_flags import LogFlags


@Parameter(name="*")
@dataclass(frozen=True)
class FleetLogFlags(LogFlags):
    """The log flags, quieter by default: a thousand agents say a lot at info."""

    log_level: str = "warning"
    """debug, info, warning or error (default warning: a thousand agents say a lot at info)."""


def sim_fleet(
    *,
    control: list[str],
    nodes: int,
    gpus_per_node: int = 8,
    gpu_class: Annotated[str, Parameter(name="--class")] = "h100-80g",
    fabric: list[str] | None = None,
    mig: list[str] | None = None,
    storage_holds: list[str] | None = None,
    storage_shared: bool = False,
    prefix: str = "sim",
    first: int = 1,
    engine_host: str = "127.0.0.1",
    engine_port: int = 0,
    state_dir: Path | None = None,
    ca_hash: str | None = None,
    ca_file: Path | None = None,
    join_concurrency: int = 32,
    log: FleetLogFlags = FleetLogFlags(),
) -> None:
    """Simulate a fleet: N nodes in one process, each a real agent on its own stream to control.

    Parameters
    ----------
    control
        https:// admin URL of a control plane (repeat the flag for each); every node finds the leader.
    nodes
        How many nodes to simulate.
    gpus_per_node
        GPUs on each node (0: CPU-only nodes).
    gpu_class
        The class of every GPU (as discovery names them: h100-80g, a100-40g, rtx-4090-24g).
    fabric
        The fabric nodes are on (default ib-a); repeat it to split the nodes into equal blocks, one per fabric.
    mig
        A MIG profile (3g.40gb, 1g.10gb) carved on every card; repeat it for each instance of a card.
    storage_holds
        MODEL or MODEL=GiB: a model every node's storage reports holding (repeat the flag for each).
    storage_shared
        The held models lie on storage the whole fabric shares (default: each node's own disk).
    prefix
        Nodes are named PREFIX-0001, PREFIX-0002, ...
    first
        The number of the first node (run two fleets side by side with --first 1 and --first 1001).
    engine_host
        Address the engines' one HTTP server listens on; gateways must reach it.
    engine_port
        Its port (default: any free one).
    state_dir
        Where each node keeps its certificate (STATE_DIR/nodes/NAME/tls; locked: one fleet per dir): a
        fleet started again on it joins no node twice. Default: a temporary dir, removed at exit.
    ca_hash
        The cluster CA's hash (`llmgw ctl nodes token create` prints it): the CA is trusted only if it matches.
    ca_file
        The cluster's CA bundle, instead of --ca-hash (default: the system's trust store).
    join_concurrency
        Join tokens and joins in flight at once (each is a commit of the leader's).
    """
    import contextlib
    import tempfile

    import trio

    from llmgw import statedir
    from llmgw.cli._lifecycle import serve_until_signal
    from llmgw.simfleet.fleet import FleetConfig, serve
    from llmgw.simfleet.nodes import HeldModel, NodeShape

    if nodes < 1:
        raise SystemExit(f"error: --nodes must be 1 or more, not {nodes}")
    if join_concurrency < 1:
        raise SystemExit(f"error: --join-concurrency must be 1 or more, not {join_concurrency}")
    for url in control:
        if not url.startswith("https://"):
            raise SystemExit(f"error: --control {url!r}: simulated nodes join and follow control over TLS; give its "
                             f"https:// admin URL")
    if ca_hash is not None and ca_file is not None:
        raise SystemExit("error: give --ca-hash or --ca-file, not both")
    try:
        shape = NodeShape(gpus=gpus_per_node, gpu_class=gpu_class, fabrics=tuple(fabric or ("ib-a",)),
                          mig=tuple(mig or ()), holds=tuple(HeldModel.parse(m) for m in storage_holds or ()),
                          shared_storage=storage_shared)
        shape.check()
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    log.setup()
    if logging.getLogger().level > logging.INFO:  # the fleet's own few lines (ready, counts) still show
        logging.getLogger("llmgw.simfleet").setLevel(logging.INFO)
    # The operator's admin key makes the nodes' join tokens; it never goes to a node.
    config = FleetConfig(controls=control, nodes=nodes, state_dir=Path(), admin_key=os.environ.get("LLMGW_KEY") or None,
                         ca_file=ca_file, ca_hash=ca_hash, join_concurrency=join_concurrency, shape=shape,
                         prefix=prefix, first=first, engine_host=engine_host, engine_port=engine_port)
    with contextlib.ExitStack() as stack:
        if state_dir is None:
            config.state_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="llmgw-sim-fleet-")))
        else:
            stack.enter_context(statedir.acquire_or_exit(state_dir, "llmgw sim-fleet"))
            config.state_dir = state_dir
        _collector.settle()
        status = trio.run(serve_until_signal, serve, config)
    sys.exit(status)
