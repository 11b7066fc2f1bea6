"""The fault catalog's worlds (tests/integration/test_faults.py, tests/bench/faults.py, docs/faults.md): a real
control plane with real agents and a webhook receiver in a thread of their own (`World`), and a group of real
`llmgw control` processes (`Group`); what each place shows (`ctl status`'s page, the API, /metrics, webhooks).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import trio
from prometheus_client.parser import text_string_to_metric_families

from llmgw.agent import AgentConfig
from llmgw.agent import serve as agent_serve
from llmgw.agent.adoption import Records
from llmgw.agent.gpus.facts import CardFacts, MachineFacts, MigFacts, to_gpus, warnings
from llmgw.agent.storage import StorageDir
from llmgw.cli.ctl.render.fleet import render_status
from llmgw.control.service import ControlConfig, ControlHandle, Seed
from llmgw.control.service import serve as control_serve
from llmgw.domain.observed import NodeInfo
from llmgw.domain.timeouts import TIMEOUTS, Timeouts
from tests.support.processes import free_port
from llmgw.testing import FakeGpuProbe
from llmgw.testing.webhooks import WebhookReceiver, in_thread
from tests.support.cluster import Cluster, Member

ADMIN = "sk-admin-faults"
GIB = 1 << 30
T = TypeVar("T")

# Short enough that the whole catalog runs in about a minute, long enough for two shared cores: a tick is
# the default's, everything the faults wait on (grace, rescans, backoff, the resolve hold) is cut.
FAST = dataclasses.replace(
    TIMEOUTS, reconcile_tick_s=1.0, reconcile_startup_quiet_s=0.5, lost_node_grace_s=1.0, stream_heartbeat_s=0.5,
    storage_rescan_s=0.3, start_backoff_first_s=0.1, start_backoff_max_s=0.3, restart_window_s=6.0,
    agent_reconnect_max_s=0.5, notify_check_s=0.1, notify_resolve_hold_s=0.3, notify_post_s=1.0,
    notify_retry_first_s=0.05, notify_retry_max_s=0.2, engine_exit_log_s=0.05, engine_stop_grace_s=2.0,
    agent_report_grace_s=0.5)
# The same for the group's processes (LLMGW_TIMEOUTS).
GROUP_TIMEOUTS = ("reconcile_tick_s=1,notify_check_s=0.1,notify_resolve_hold_s=0.3,member_probe_s=0.5,"
                  "notify_election_settle_s=1")

# --- what each place shows ----------------------------------------------------------------------------------


Families = dict[str, list[Any]]  # family name -> its samples (prometheus_client.samples.Sample)


def parse_metrics(text: str) -> Families:
    return {f.name: list(f.samples) for f in text_string_to_metric_families(text)}


def sample(families: Families, name: str, suffix: str = "", **labels: str) -> float | None:
    """The value of family `name`'s sample `name + suffix` (a counter's "_total") with these labels (others
    free); None when there is none."""
    for s in families.get(name, ()):
        if s.name == name + suffix and all(s.labels.get(k) == v for k, v in labels.items()):
            return float(s.value)
    return None


def condition_on(families: Families, kind: str, subject: str) -> bool:
    return sample(families, "llmgw_condition", kind=kind, subject=subject) == 1.0


def events(receiver: WebhookReceiver, path: str, event: str, kind: str, subject: str,
           since: int = 0) -> list[dict[str, Any]]:
    """The `event` ("started", "resolved") posts about (kind, subject) received at `path`, from the `since`-th on."""
    out = []
    for r in receiver.received[since:]:
        if r.path != path:
            continue
        doc = r.json()
        c = doc.get("condition") or {}
        if doc.get("event") == event and c.get("kind") == kind and c.get("subject") == subject:
            out.append(doc)
    return out


# --- the nodes' inventories ---------------------------------------------------------------------------------

A100 = "NVIDIA A100-SXM4-80GB"


def mig_node(name: str, *, carved: bool) -> NodeInfo:
    """A node with one A100 in MIG mode: two 3g.40gb instances carved, or none (the fault), as the probe says it."""
    instances = tuple(MigFacts(uuid=f"MIG-{name}-{n}", profile="3g.40gb", memory_total=39 * GIB, memory_used=0,
                               gpu_instance_id=n + 1, compute_instance_id=0) for n in range(2)) if carved else ()
    facts = MachineFacts("nvml", driver="550.54", cards=(CardFacts(A100, f"GPU-{name}-0", 80 * GIB, 0, mig_current=True,
                                                                   mig_pending=True, instances=instances),))
    return NodeInfo(name, hostname=name, cpus=8, memory_total=64 * GIB, gpus=to_gpus(facts), probe="nvml",
                    warnings=warnings(facts))


def cpu_node(name: str, engines: tuple[str, ...] = ()) -> NodeInfo:
    return NodeInfo(name, hostname=name, cpus=4, memory_total=16 * GIB, engines=engines, probe="none")


# --- one control plane and its agents, in a thread ----------------------------------------------------------


@dataclass
class Agent:
    name: str
    probe: FakeGpuProbe
    storage: tuple[StorageDir, ...] = ()
    scope: trio.CancelScope | None = None


@dataclass
class World:
    """A real control plane (one-member Raft, the admin API on loopback, the notifier) with in-process agents
    (FakeGpuProbe; real sim engine processes on n1) and a webhook receiver, in a trio loop of its own thread.
    Nodes: n1 runs the sim models (CPU), n2 is the one that gets lost, n3 has the MIG card, n4 the storage dir.
    Tests talk to it over HTTP (`api`, `status`, `metrics`) and change it with `run` (a call in its loop)."""

    root: Path
    timeouts: Timeouts = FAST
    agents: dict[str, Agent] = field(default_factory=dict)
    receiver: WebhookReceiver = field(default_factory=WebhookReceiver)
    handle: ControlHandle | None = None
    http: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=10))
    _token: trio.lowlevel.TrioToken | None = None
    _nursery: trio.Nursery | None = None
    _thread: threading.Thread | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _failed: list[BaseException] = field(default_factory=list)

    HOOK = "/hook"
    FAILING = "/failing"

    @property
    def storage_dir(self) -> Path:
        return self.root / "models"

    def start(self) -> World:
        self.storage_dir.mkdir(parents=True, exist_ok=True)
        self.agents = {
            "n1": Agent("n1", FakeGpuProbe(cpu_node("n1", ("sim",)))),
            "n2": Agent("n2", FakeGpuProbe(cpu_node("n2"))),
            "n3": Agent("n3", FakeGpuProbe(mig_node("n3", carved=True))),
            "n4": Agent("n4", FakeGpuProbe(cpu_node("n4")), (StorageDir(self.storage_dir, "fab-a"),)),
        }
        ready = threading.Event()
        self._thread = threading.Thread(target=self._main, args=(ready,), daemon=True, name="fault-world")
        self._thread.start()
        while not ready.wait(0.1):
            if self._failed or not self._thread.is_alive():
                raise RuntimeError(f"the fault world did not start: {self._failed!r}")
        self.put_setting("notify.webhooks", [self.hook_url])
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        self.http.close()

    def _main(self, ready: threading.Event) -> None:
        try:
            trio.run(self._serve, ready)
        except BaseException as e:  # noqa: BLE001 - reported to the starting thread
            self._failed.append(e)

    async def _serve(self, ready: threading.Event) -> None:
        self._token = trio.lowlevel.current_trio_token()
        cfg = ControlConfig(state_dir=self.root / "control", raft_addr=f"127.0.0.1:{free_port()}",
                            admin_host="127.0.0.1", admin_port=0, seed=Seed(admin_key=ADMIN), timeouts=self.timeouts)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await nursery.start(self.receiver.serve)
            self.handle = await nursery.start(control_serve, cfg)
            for name in self.agents:
                await self.start_agent(name)
            ready.set()
            await trio.to_thread.run_sync(self._stop.wait, abandon_on_cancel=True)
            nursery.cancel_scope.cancel()

    async def start_agent(self, name: str) -> None:
        """Start node `name`'s agent (again); returns once the leader welcomed it."""
        agent, handle, nursery = self.agents[name], self.handle, self._nursery
        assert handle is not None and nursery is not None
        assert handle.context is not None  # an agent in the control plane's process: its in-memory credential
        cfg = AgentConfig(controls=[handle.admin_url], tls=None, local_credential=handle.context.local_credential(
                              "agent", name), state_dir=self.root / "agents" / name, node=name,
                          probe=agent.probe, timeouts=self.timeouts, storage=agent.storage)
        scope = agent.scope = trio.CancelScope()

        async def run(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            with scope:
                await agent_serve(cfg, task_status=task_status)

        await nursery.start(run)

    async def stop_agent(self, name: str) -> None:
        scope = self.agents[name].scope
        assert scope is not None
        scope.cancel()
        await trio.sleep(0)

    def run(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """`await fn(*args)` in the world's loop, from the test's thread."""
        return trio.from_thread.run(fn, *args, trio_token=self._token)

    def run_sync(self, fn: Callable[..., T], *args: Any) -> T:
        return trio.from_thread.run_sync(fn, *args, trio_token=self._token)

    # -- the admin API, as an operator's tools read it --------------------------------------------------

    @property
    def admin_url(self) -> str:
        assert self.handle is not None
        return self.handle.admin_url

    @property
    def hook_url(self) -> str:
        return self.receiver.url + self.HOOK

    def api(self, method: str, path: str, body: Any = None, ok: Iterable[int] = (200, 201)) -> Any:
        r = self.http.request(method, self.admin_url + path, headers={"authorization": f"Bearer {ADMIN}"},
                              content=None if body is None else json.dumps(body))
        assert r.status_code in tuple(ok), f"{method} {path}: {r.status_code} {r.text}"
        return r.json()

    def put_setting(self, key: str, value: Any) -> None:
        self.api("PUT", f"/api/v1/settings/{key}", value)

    def put_model(self, doc: Mapping[str, Any]) -> None:
        self.api("POST", "/api/v1/models", dict(doc))

    def delete_model(self, name: str) -> None:
        self.api("DELETE", f"/api/v1/models/{name}", ok=(200, 404))

    def status(self) -> dict[str, Any]:
        doc: dict[str, Any] = self.api("GET", "/api/v1/status")
        return doc

    def metrics(self) -> Families:
        r = self.http.get(self.admin_url + "/metrics")  # no key, as a scraper
        assert r.status_code == 200, r.text
        return parse_metrics(r.text)

    def model(self, name: str) -> dict[str, Any] | None:
        return next((m for m in self.status()["models"] if m["name"] == name), None)

    def wait(self, what: str, probe: Callable[[], Any], timeout: float = 30.0) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            found = probe()
            if found:
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not within {timeout:g} s")
            time.sleep(0.05)

    def wait_ready(self, name: str, ready: int = 1, timeout: float = 30.0) -> None:
        self.wait(f"model {name} has {ready} ready", lambda: (self.model(name) or {}).get("ready") == ready, timeout)

    def engine_pids(self, model: str) -> dict[str, int]:
        """Replica id -> the pid of its sim engine on n1, from the agent's engine records."""
        return {r.replica_id: r.pid for r in Records(self.root / "agents" / "n1" / "engines").load()
                if r.model == model}

    def kill_engine(self, pid: int) -> None:
        """SIGKILL an engine the agent started (its own process group), as a crash."""
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# --- a group of control plane processes -----------------------------------------------------------------------


@dataclass
class Group:
    """Three real `llmgw control` processes (tests/support/cluster.py) with short LLMGW_TIMEOUTS and a webhook
    receiver in its own thread, for the faults of the group itself (a member stopped, no quorum)."""

    root: Path
    size: int = 3
    cluster: Cluster = field(init=False)
    receiver: WebhookReceiver = field(default_factory=WebhookReceiver)
    http: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=5))
    leader_fallback_s: float = TIMEOUTS.raft_leader_fallback_s  # GROUP_TIMEOUTS leaves Raft's own as they are
    _receiving: Any = None

    def __post_init__(self) -> None:
        self.cluster = Cluster(self.root, self.size, admin_key=ADMIN)

    def start(self) -> Group:
        self._receiving = in_thread(self.receiver)
        self._receiving.__enter__()
        c = self.cluster
        self.start_member(c.members[0])
        trio.run(c.wait_for, "the first member's cluster secret", lambda: c.secret_file.exists() or None, 60.0)
        for m in c.members[1:]:
            self.start_member(m)
        trio.run(c.wait_for, "every member healthy and announced", c.all_healthy, 60.0)
        r = self.api(self.leader(), "PUT", "/api/v1/settings/notify.webhooks", [self.receiver.url + World.HOOK])
        assert r.status_code == 200, r.text
        trio.run(c.wait_for, "the leader's notifier settled with nothing active", self.notifier_quiet, 60.0)
        return self

    async def notifier_quiet(self) -> bool | None:
        """True once the leader's notifier is past its election hold with no condition active: a fault injected
        from here is the only thing its webhook can post (a member still connecting at the start is not)."""
        leader = await self.cluster.leader()
        if leader is None:
            return None
        r = self.api(leader, "GET", "/api/v1/notify/status")
        doc = r.json() if r.status_code == 200 else {}
        settled, checked = doc.get("settling_until"), doc.get("checked_at")
        return (settled is not None and checked is not None and checked >= settled and not doc.get("active")) or None

    def close(self) -> None:
        self.cluster.close()
        if self._receiving is not None:
            self._receiving.__exit__(None, None, None)
        self.http.close()

    def start_member(self, m: Member) -> None:
        c = self.cluster
        first = m is c.members[0] and not c.secret_file.exists()
        env = {"LLMGW_TIMEOUTS": GROUP_TIMEOUTS, **({"LLMGW_ADMIN_KEY": ADMIN} if first else {})}
        m.start(c.peers_of(m), env=env, extra=[] if first else ["--cluster-secret-file", str(c.secret_file)])

    def leader(self, timeout: float = 30.0) -> Member:
        found = trio.run(self.cluster.wait_for, "a leader", self.cluster.leader, timeout)
        assert isinstance(found, Member)
        return found

    def api(self, m: Member, method: str, path: str, body: Any = None) -> httpx.Response:
        return self.http.request(method, m.url + path, headers={"authorization": f"Bearer {ADMIN}"},
                                 content=None if body is None else json.dumps(body))

    def metrics(self, m: Member) -> Families:
        r = self.http.get(m.url + "/metrics")
        assert r.status_code == 200, r.text
        return parse_metrics(r.text)

    def ctl_status(self, m: Member) -> subprocess.CompletedProcess[str]:
        """`llmgw ctl status` run against member `m`, as an operator would."""
        return subprocess.run([sys.executable, "-m", "llmgw", "ctl", "status", "--url", m.url, "--key", ADMIN,
                               "--state-dir", str(self.root / "no-credentials")],
                              capture_output=True, text=True, timeout=60)


def ctl_page(doc: Mapping[str, Any]) -> str:
    """What `llmgw ctl status` prints for this status document (its own renderer)."""
    return render_status(doc)
