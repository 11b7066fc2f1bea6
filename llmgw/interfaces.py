"""The seams between roles, as small Protocols; fakes live in `llmgw.testing`.

In one process they are plain calls; across machines an adapter carries them.
"""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

from llmgw.domain.observed import BreakerSeen, ModelRoute, NodeInfo, ReplicaObs
from llmgw.domain.state import ApiKey, ClusterState

if TYPE_CHECKING:
    from pathlib import Path

    from llmgw.engines.base import Group
    from llmgw.gateway.pool import Ticket
    from llmgw.remote import Ran
    from llmgw.service.manager import ServiceStatus
    from llmgw.wire.protocol_agent import MirrorSource


class EndpointSink(Protocol):
    """Control → router: the whole routing table, pushed whenever it changes."""

    def update_routes(self, routes: Mapping[str, ModelRoute]) -> None: ...


class DemandReport(Protocol):
    """Router → control, the opposite direction: who asked for what, and when."""

    def on_ask(self, wake: Callable[[], None]) -> None:
        """Call `wake` when a request starts waiting for an activation (the reader of the asks, the control plane,
        plans now rather than at its next tick)."""
        ...

    def last_used(self) -> Mapping[str, float]:
        """Replica id -> last Acquire time (trio clock). Absent means unknown, never idle."""
        ...

    def take_activation_asks(self) -> Mapping[str, float]:
        """Model -> time of the newest request that found no ready replica; cleared on read."""
        ...

    def outstanding(self) -> Mapping[str, int]:
        """Model -> requests in flight to its replicas or waiting for one, now (absent: none)."""
        ...


@runtime_checkable
class BreakerReport(Protocol):
    """Gateway → control, beside its demand: the replicas its circuit breakers keep out of rotation now."""

    def open_breakers_seen(self) -> Sequence[BreakerSeen]: ...


class StateReader(Protocol):
    """Read side of the replicated store."""

    def snapshot(self) -> ClusterState: ...

    async def wait_changed(self, revision: int) -> ClusterState:
        """Return the first snapshot whose revision is greater than `revision`."""
        ...


class WritableStore(StateReader, Protocol):
    """Control's side of the replicated store: it also commits commands and knows who leads."""

    async def submit(self, command: dict[str, Any], *, through_leader: bool = False) -> Any:
        """Commit `command`; its result once applied (`through_leader`: from a standby, handed to the
        leader rather than refused). Raises `CommandError` when it does not apply
        (refused before the log, or recorded in the state as a no-op with its reason: nothing else
        changed), `NotLeader` / `StoreUnavailable` when it cannot commit now, and `CommitUnknown`
        when it may or may not have been committed (retry with the same command id: it applies once)."""
        ...

    def is_leader(self) -> bool: ...

    async def confirm_leader(self) -> None:
        """Return once this member has confirmed, after the call began, that it still leads (a majority
        answered it), so a read served next misses no acknowledged write. Raises `NotLeader`, or
        `StoreUnavailable` (`LeadershipUnconfirmed`) when no majority confirmed it in time."""
        ...


class RaftGroup(Protocol):
    """Control → its Raft group: this member's view of the group, commands sent through the
    leader, and membership changes (one at a time, each committed through Raft)."""

    def status(self) -> dict[str, Any]:
        """This member's view: `self`, `leader`, `is_leader`, `ready`, `term`,
        `commit_index`, `last_applied`, `member_change` (words while one is in flight, else None),
        `partners` (each other member's Raft address -> 2 when connected, else 0)."""
        ...

    async def submit(self, command: dict[str, Any], *, through_leader: bool = False) -> Any:
        """As `WritableStore.submit`; `through_leader` lets a standby hand it to the leader."""
        ...

    async def add_member(self, raft_addr: str) -> None: ...

    async def remove_member(self, raft_addr: str) -> None: ...


class RaftPeerTls(Protocol):
    """The store's Raft transport → what its members' TLS rests on (the control plane's trust). Called
    on pysyncobj's thread: each answer is read from files and the last applied state, never awaited."""

    def server_context(self) -> ssl.SSLContext | None:
        """What this member answers a TLS peer with (its control certificate, peers' required), or None
        while it has no certificate yet."""
        ...

    def client_context(self, peer: str) -> ssl.SSLContext | None:
        """What this member dials member `peer` with over TLS; None: sealed only (this member has no
        certificate yet, or `peer` has none and the group does not require TLS yet)."""
        ...

    def check_peer(self, cert_der: bytes | None, name: str | None) -> str | None:
        """Why a peer's certificate is refused (not a control plane's of this cluster, revoked, expired,
        or not the member `name` when given), or None when it is accepted."""
        ...

    def plain_refused(self) -> str | None:
        """Why a connection without TLS is refused now (the group requires TLS since ...), or None."""
        ...

    def settled(self, peer: str) -> bool:
        """Whether this member's start and `peer`'s are done (each announced itself): only then is a sealed
        link between them dropped to be dialled again over TLS (a command handed to the leader over a
        link that is down is lost, and a member's start hands it some)."""
        ...


class FloatingAddressError(Exception):
    """A floating address could not be claimed, released or checked; the message says why."""


class FloatingAddress(Protocol):
    """The cluster's floating address (a VIP) on this machine: held by the leader alone.

    Each call is bounded in time and idempotent: claiming a held address announces it
    again, releasing one that is not held is done. Failures raise `FloatingAddressError`."""

    def describe(self) -> str:
        """What and where, for logs and status: "10.0.0.5/24 on eth0"."""
        ...

    async def claim(self) -> None:
        """Put the address on this machine and tell the neighbours (gratuitous ARP)."""
        ...

    async def release(self) -> None: ...

    async def holds(self) -> bool:
        """Whether this machine has the address now (asked of the system, not remembered)."""
        ...


class GpuProbe(Protocol):
    """Discovers this node's accelerators (NVML, nvidia-smi, or a fake)."""

    def inventory(self, node: str) -> NodeInfo: ...


class ReplicaRunner(Protocol):
    """Agent → the engines it runs: what its stream asks for, and what runs. The real one starts
    engine processes (`agent.supervisor.Supervisor`); `llmgw sim-fleet` runs simulated engines
    in-process (`simfleet.engines.SimRunner`). Every call returns at once; each change of a
    replica's state is told through the `on_change` the runner was built with."""

    def replicas(self) -> list[ReplicaObs]:
        """Every replica it runs or ran (starting, ready or failed), as the stream reports them."""
        ...

    def start(self, replica_id: str, model_doc: dict[str, Any], gpus: Sequence[int],
              group: Group | None = None, mirror: MirrorSource | None = None) -> None:
        """Start a replica (a no-op when the same launch is starting or ready); a refusal is a failed replica.
        `mirror`: where a `mirror://NAME` source is fetched from (agent/mirror_fetch.py) before the engine starts."""
        ...

    def stop(self, replica_id: str) -> None: ...

    def sleep(self, replica_id: str, level: int) -> None:
        """Fast wake: put a ready replica's engine to sleep at `level` (1 or 2); reported `sleeping` at once, failed
        (its engine then stopped by control) when the engine refuses. A no-op for one not ready."""
        ...

    def wake(self, replica_id: str) -> None:
        """Fast wake: wake a sleeping replica's engine; reported starting (phase `waking`), then ready, or failed
        with why. A no-op for one not sleeping."""
        ...

    def load_adapters(self, replica_id: str, adapters: Mapping[str, str]) -> None:
        """Make a ready replica's engine hold exactly these LoRA adapters (name -> file), each reported on the
        replica (`ReplicaObs.adapters`) as loading, then loaded once the engine lists it, or failed with why."""
        ...

    def close(self) -> None:
        """The agent stops: its replicas stop, or keep running for the next agent (the runner's choice)."""
        ...

    def leave_running(self) -> None:
        """The agent restarts in place (`ctl nodes restart`): at `close`, leave the replicas running for the
        agent that adopts them. A runner whose replicas cannot outlive its process does nothing."""
        ...


class NvmlApi(Protocol):
    """The part of pynvml GPU discovery calls (same names, return shapes and errors): the real one
    is the `pynvml` module, tests pass a fake (llmgw/agent/gpus/nvml.py reads through it)."""

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> Any: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetName(self, handle: Any) -> Any: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> Any: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any: ...
    def nvmlDeviceGetMigMode(self, handle: Any) -> Any: ...
    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int: ...
    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> Any: ...
    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int: ...
    def nvmlDeviceGetComputeInstanceId(self, handle: Any) -> int: ...
    def nvmlDeviceGetAttributes(self, handle: Any) -> Any: ...
    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> Any: ...
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> Any: ...
    def nvmlDeviceGetPowerUsage(self, handle: Any) -> Any: ...
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any: ...
    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int) -> Any: ...
    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any) -> Any: ...
    def nvmlDeviceGetRemappedRows(self, handle: Any) -> Any: ...


class RequestFacts(Protocol):
    """Gateway app → request log: what the app knows of one request when it ends (its exchange)."""

    request_id: str
    key: ApiKey | None  # the client key admitted; None: none was
    model: str  # "-": none
    served: str  # the model that served `model` (itself, an alias's or a fallback); "": none did
    replica: str  # "-": none
    node: str
    error: str  # the error code answered, "" if none
    tokens_in: int | None
    tokens_out: int | None
    ttft: float | None  # trio time of the first streamed chunk; None: not streamed
    guard_rule: str  # the judges' verdicts (gateway/guard.py); "" when no policy applied
    ticket: Ticket | None  # its priority class and wait for a replica's slot (gateway/pool.py); None: not admitted


class ServiceManager(Protocol):
    """`llmgw service` → what keeps this machine's roles running: systemd's units (`service/systemd.py`)
    or the built-in supervisor (`service/supervisor.py`), one role at a time."""

    name: str

    def status(self, role: str) -> ServiceStatus: ...

    def start(self, role: str) -> ServiceStatus:
        """Start the role if it is not running; its status once started (ServiceError if it does not)."""

    def stop(self, role: str) -> ServiceStatus:
        """Stop the role (its own stop first; killed past `service_stop_s`); its status after."""

    def restart(self, role: str) -> ServiceStatus:
        """Stop, then start: a new process of the role."""


class RemoteShell(Protocol):
    """`llmgw server add` → another machine: commands run there and a file copied there, over ssh
    (`remote/ssh.py`, the system's ssh and scp). Raises `llmgw.remote.RemoteError` (its `kind`: refused,
    auth, unreachable, host_key, timeout, ssh) when ssh itself fails; a command that ran and failed is a
    `Ran` with its exit status, not an error."""

    target: str  # USER@HOST, as the operator gave it

    async def run(self, argv: Sequence[str], *, stdin: bytes = b"", timeout_s: float) -> Ran:
        """Run `argv` there (each argument quoted for the remote shell), `stdin` fed to it."""
        ...

    async def put(self, local: Path, remote: str, *, timeout_s: float) -> None:
        """Copy the file `local` to the path `remote` there."""
        ...
