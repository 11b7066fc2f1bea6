"""Engines that outlive their agent, with real sim engine processes: an agent that stops leaves
them serving, the next agent on the same state dir adopts them (same replica, same url, no second
engine); ready engines are health-polled, so a stopped (SIGSTOP) or killed engine is reported."""

from __future__ import annotations

import dataclasses
import os
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from llmgw.agent import AgentConfig
from llmgw.agent import serve as agent_serve
from llmgw.agent.adoption import AdoptedProcess, Records
from llmgw.agent.supervisor import _LEFT_RUNNING, Supervisor, _Child
from llmgw.control.service import ControlConfig, ControlHandle, Seed
from llmgw.control.service import serve as control_serve
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import Gpu, NodeInfo, ReplicaObs, mig_index
from llmgw.domain.timeouts import TIMEOUTS
from llmgw.gateway.router import Router
from llmgw.testing import FakeGpuProbe
from tests.support.processes import alive, children_of, free_port

pytestmark = pytest.mark.slow

ADMIN = "sk-admin-adoption-test"
MODEL = f"adopted-{os.getpid()}"  # its engines are told apart from other tests' by this name
DOC: dict[str, Any] = {"name": MODEL, "engine": "sim", "source": "sim://demo"}
# A hung engine is failed after 3 probes of at most 0.5 s, 0.2 s apart.
QUICK = dataclasses.replace(TIMEOUTS, engine_liveness_poll_s=0.2, engine_liveness_request_s=0.5,
                           engine_stop_grace_s=2.0)


async def wait_for(predicate: Callable[[], object], timeout: float = 20.0) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.05)


def engines() -> set[int]:
    """This test's sim engines (children of this process: the agents run in it)."""
    found = set()
    for pid in children_of(os.getpid()):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if MODEL.encode() in argv and alive(pid):
            found.add(pid)
    return found


@pytest.fixture
async def reap_left_running() -> AsyncIterator[None]:
    """The engines an agent in this process left running for the next one: their process objects stay in
    `_LEFT_RUNNING` for the rest of the process. The next agent stops an engine it adopted by its pid, so
    nothing here waits for it: it is reaped here (killed first if a failed test left it running), else its
    `Popen` and trio's pidfd are collected at the interpreter's exit ("subprocess N is still running")."""
    before = list(_LEFT_RUNNING)
    yield
    for proc in [p for p in _LEFT_RUNNING if p not in before]:
        assert isinstance(proc, _Child | AdoptedProcess)
        proc.signal_group(signal.SIGKILL)  # only if it still runs
        with trio.fail_after(10):
            await proc.wait()  # our own child: waitpid reaps it and closes trio's pidfd
        _LEFT_RUNNING.remove(proc)


async def test_engines_outlive_their_agent_and_the_next_agent_adopts_them(tmp_path: Path,
                                                                          reap_left_running: None) -> None:
    router = Router()
    seed = Seed(admin_key=ADMIN, models=[ModelDef.from_doc(DOC)])
    control_cfg = ControlConfig(state_dir=tmp_path / "control", raft_addr=f"127.0.0.1:{free_port()}",
                                admin_host="127.0.0.1", admin_port=free_port(), seed=seed, sinks=[router],
                                demand=[router])
    probe = FakeGpuProbe(NodeInfo("x", hostname="test-node", cpus=2, engines=("sim",)))
    async with trio.open_nursery() as nursery:
        control: ControlHandle = await nursery.start(control_serve, control_cfg)
        assert control.context is not None
        credential = control.context.local_credential("agent", "n1")  # both agents are node n1

        def agent_config(stop_engines_on_exit: bool) -> AgentConfig:
            return AgentConfig(controls=[control.admin_url], tls=None, local_credential=credential,
                               state_dir=tmp_path / "agent", node="n1", probe=probe,
                               stop_engines_on_exit=stop_engines_on_exit)

        first = trio.CancelScope()

        async def run_first(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
            with first:
                await agent_serve(agent_config(False), task_status=task_status)

        await nursery.start(run_first)

        def ready() -> ReplicaObs | None:
            found = [r for r in control.hub.observed().replicas.values() if r.model == MODEL and r.state == "ready"]
            return found[0] if found else None

        await wait_for(ready)
        replica = ready()
        assert replica is not None
        [pid] = engines()
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert not any(v.startswith(b"LLMGW_PARENT_PID=") for v in environ), "it must not stop with its agent"
        async with httpx.AsyncClient() as http:
            first.cancel()  # the agent stops (a restart, an upgrade) ...
            await trio.sleep(1.0)
            assert (await http.get(f"{replica.url}/health")).status_code == 200, "... its engine keeps serving"
            assert engines() == {pid}

            await nursery.start(agent_serve, agent_config(True))  # the next agent, on the same state dir
            await wait_for(lambda: "n1" in control.hub.nodes)
            await wait_for(ready)
            await trio.sleep(2.0)  # long enough for a start, had one been sent
            replicas = {r.replica_id: r for r in control.hub.observed().replicas.values() if r.model == MODEL}
            assert list(replicas) == [replica.replica_id], "the same replica, adopted, not a new one"
            assert (replicas[replica.replica_id].state, replicas[replica.replica_id].url) == ("ready", replica.url)
            assert engines() == {pid}, "no second engine was started"
            route = router.route(MODEL)
            assert route is not None and [e.url for e in route.endpoints] == [replica.url]
            assert (await http.get(f"{replica.url}/health")).status_code == 200
        nursery.cancel_scope.cancel()  # this agent stops its engines on exit
    with trio.fail_after(10):
        while alive(pid):
            await trio.sleep(0.05)
    assert list((tmp_path / "agent" / "engines").glob("*.json")) == [], "records go with their engines"


@asynccontextmanager
async def supervisor(tmp_path: Path, inventory: NodeInfo | None = None) -> AsyncIterator[Supervisor]:
    async with httpx.AsyncClient() as http, trio.open_nursery() as nursery:
        sup = Supervisor(nursery, node="n1", host="127.0.0.1", engine_dir=tmp_path / "engines",
                         on_change=lambda: None, http=http, timeouts=QUICK,
                         inventory=None if inventory is None else (lambda: inventory))
        try:
            yield sup
        finally:
            sup.close()
            nursery.cancel_scope.cancel()


def state(sup: Supervisor, rid: str) -> ReplicaObs:
    return next(r for r in sup.replicas() if r.replica_id == rid)


async def test_a_stopped_engine_is_reported_failed_within_seconds(tmp_path: Path) -> None:
    async with supervisor(tmp_path) as sup:
        sup.start("r1", DOC, [])
        await wait_for(lambda: state(sup, "r1").state == "ready")
        [record] = Records(tmp_path / "engines").load()
        os.kill(record.pid, signal.SIGSTOP)  # alive, listening, answering nothing
        stopped = trio.current_time()
        await wait_for(lambda: state(sup, "r1").state == "failed", timeout=15)
        assert trio.current_time() - stopped < 10
        assert state(sup, "r1").error.startswith(
            "engine stopped answering /health (3 probes in a row failed, the last: no answer within 0.5 s)")
        await wait_for(lambda: not alive(record.pid), timeout=10)  # and the agent stopped it,
        await wait_for(lambda: Records(tmp_path / "engines").load() == [], timeout=10)  # its record gone after


async def test_a_killed_engine_is_reported_with_its_signal_and_last_lines(tmp_path: Path) -> None:
    async with supervisor(tmp_path) as sup:
        sup.start("r1", DOC, [])
        await wait_for(lambda: state(sup, "r1").state == "ready")
        [record] = Records(tmp_path / "engines").load()
        os.kill(record.pid, signal.SIGKILL)
        await wait_for(lambda: state(sup, "r1").state == "failed", timeout=10)
        error = state(sup, "r1").error
        assert error.startswith("engine was killed by SIGKILL while serving: ") and len(error) > 50, error
        log = Records(tmp_path / "engines").log_path("r1")
        assert log.exists(), "the log stays while control can still ask about the replica"
        sup.stop("r1")
        assert not log.exists() and list(log.parent.iterdir()) == []


async def test_a_mig_instance_reaches_the_engine_as_its_uuid(tmp_path: Path) -> None:
    index = mig_index(0, 1)
    instance = Gpu(index, "MIG-7f3c9a2e-1b4d-5e6f-8a9b-0c1d2e3f4a5b", "NVIDIA A100-SXM4-80GB MIG 3g.40gb",
                   "a100-80g-mig-3g.40gb", 40 << 30, 0, mig_profile="3g.40gb", parent_index=0)
    async with supervisor(tmp_path, NodeInfo("n1", gpus=(instance,))) as sup:
        sup.start("r1", DOC, [index])
        await wait_for(lambda: state(sup, "r1").state != "starting")
        assert state(sup, "r1").state == "ready", state(sup, "r1").error
        [record] = Records(tmp_path / "engines").load()
        environ = Path(f"/proc/{record.pid}/environ").read_bytes().split(b"\0")
        assert f"CUDA_VISIBLE_DEVICES={instance.uuid}".encode() in environ
        assert any(v.startswith(b"LLMGW_PARENT_PID=") for v in environ), "stop_on_exit: it stops when we go"
