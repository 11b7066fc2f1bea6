"""The supervisor adopts engines an earlier agent left running (llmgw/agent/supervisor.py): real
processes (`sleep 60` in its own session) stand for engines, their /health is an httpx mock
transport (the engine's HTTP is the world's edge here), and time is trio's MockClock."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from llmgw.agent.adoption import EngineRecord, Records, file_stem, launch_hash, start_ticks
from llmgw.agent.supervisor import LIVENESS_FAILURES, Supervisor
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import Gpu, NodeInfo, ReplicaObs
from llmgw.domain.timeouts import TIMEOUTS

URL = "http://127.0.0.1:40001"
DOC: dict[str, Any] = {"name": "demo", "engine": "sim", "source": "sim://demo"}
LAUNCH = launch_hash(ModelDef.from_doc(DOC).launch_hash(), "demo", [], None)


@pytest.fixture
def clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


class Engine:
    """The /health of the engine the sleeper stands for: ok, hanging or answering 500."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.probes = 0

    async def handle(self, request: httpx.Request) -> httpx.Response:
        assert str(request.url) == URL + "/health"
        self.probes += 1
        if self.mode == "hang":
            await trio.sleep_forever()
        return httpx.Response(200 if self.mode == "ok" else 500)


def leave(records: Records, proc: subprocess.Popen[bytes], *, ready: bool = True, ticks: int | None = None,
          rid: str = "demo-r1") -> EngineRecord:
    """What an earlier agent left behind: a record for a running engine."""
    real = start_ticks(proc.pid)
    assert real is not None
    record = EngineRecord(rid, "demo", "sim", proc.pid, real if ticks is None else ticks, URL, "http", "/health", LAUNCH,
                          1000.0, ready_since=1005.0 if ready else 0.0)
    records.write(record)
    records.log_path(rid).write_text("loading\nserving on port 40001\n")
    return record


@asynccontextmanager
async def agent(tmp_path: Path, engine: Engine, **kw: Any) -> AsyncIterator[Supervisor]:
    """A supervisor inside its nursery, as `serve()` runs it; leaving is the agent's exit."""
    async with httpx.AsyncClient(transport=httpx.MockTransport(engine.handle)) as http:
        async with trio.open_nursery() as engines:
            supervisor = Supervisor(engines, node="n1", host="127.0.0.1", engine_dir=tmp_path / "engines",
                                    on_change=lambda: None, http=http, **kw)
            try:
                yield supervisor
            finally:
                supervisor.close()
                engines.cancel_scope.cancel()


async def ended(proc: subprocess.Popen[bytes]) -> int:
    return await trio.to_thread.run_sync(proc.wait)


def only(supervisor: Supervisor) -> ReplicaObs:
    [obs] = supervisor.replicas()
    return obs


async def test_a_live_engine_is_adopted_and_left_running_again(
        tmp_path: Path, clock: trio.testing.MockClock, sleeper: subprocess.Popen[bytes]) -> None:
    records = Records(tmp_path / "engines")
    record = leave(records, sleeper)
    engine = Engine()
    async with agent(tmp_path, engine, stop_on_exit=False) as supervisor:
        obs = only(supervisor)
        assert (obs.replica_id, obs.state, obs.url, obs.since) == ("demo-r1", "ready", URL, 1005.0)
        await trio.sleep(10 * TIMEOUTS.engine_liveness_poll_s)
        assert only(supervisor).state == "ready"
        assert engine.probes >= 5, "a ready engine is health-polled"
    assert sleeper.poll() is None, "the engine outlives a second agent too"
    assert records.load() == [record], "and its record stays for the next one"
    assert records.log_path("demo-r1").exists()


async def test_a_record_whose_pid_is_now_another_process_is_not_adopted(
        tmp_path: Path, clock: trio.testing.MockClock, sleeper: subprocess.Popen[bytes]) -> None:
    records = Records(tmp_path / "engines")
    start = start_ticks(sleeper.pid)
    assert start is not None
    leave(records, sleeper, ticks=start - 1)  # same pid, another start time: a reused pid
    async with agent(tmp_path, Engine(), stop_on_exit=True) as supervisor:
        obs = only(supervisor)
        assert obs.state == "failed"
        assert obs.error == ("engine exited while the agent was away (exit status unknown): "
                             "loading | serving on port 40001")
        assert records.load() == [], "reported once: the record is gone"
        supervisor.stop("demo-r1")
        assert supervisor.replicas() == [] and not records.log_path("demo-r1").exists()
    assert sleeper.poll() is None, "a process that is not the engine is never signalled"


async def test_a_hung_engine_is_reported_failed_within_seconds_and_stopped(
        tmp_path: Path, clock: trio.testing.MockClock, sleeper: subprocess.Popen[bytes]) -> None:
    engine = Engine()
    leave(Records(tmp_path / "engines"), sleeper)
    async with agent(tmp_path, engine, stop_on_exit=False) as supervisor:
        await trio.sleep(3)
        engine.mode = "hang"
        hung = trio.current_time()
        while only(supervisor).state == "ready":
            await trio.sleep(0.1)
        t = TIMEOUTS
        assert trio.current_time() - hung <= LIVENESS_FAILURES * (t.engine_liveness_poll_s + t.engine_liveness_request_s) + 1
        obs = only(supervisor)
        assert obs.state == "failed" and obs.url == ""
        assert obs.error.startswith("engine stopped answering /health (3 probes in a row failed, the last: "
                                    "no answer within 3 s)")
        assert await ended(sleeper) in (-signal.SIGTERM, -signal.SIGKILL), "the agent stops a hung engine"


async def test_an_engine_answering_errors_is_failed_but_one_bad_probe_is_not_enough(
        tmp_path: Path, clock: trio.testing.MockClock, sleeper: subprocess.Popen[bytes]) -> None:
    engine = Engine()
    leave(Records(tmp_path / "engines"), sleeper)
    async with agent(tmp_path, engine) as supervisor:
        await trio.sleep(TIMEOUTS.engine_liveness_poll_s / 2)  # between probes (one each poll interval)
        for _ in range(3):  # failures that do not come in a row
            engine.mode = "500"
            await trio.sleep(TIMEOUTS.engine_liveness_poll_s * (LIVENESS_FAILURES - 1))
            engine.mode = "ok"
            await trio.sleep(TIMEOUTS.engine_liveness_poll_s * 2)
        assert only(supervisor).state == "ready"
        engine.mode = "500"
        await trio.sleep(TIMEOUTS.engine_liveness_poll_s * (LIVENESS_FAILURES + 1))
        assert "the last: answered HTTP 500" in only(supervisor).error


async def test_an_adopted_engine_that_dies_is_reported_with_its_status_unknown(
        tmp_path: Path, clock: trio.testing.MockClock, sleeper: subprocess.Popen[bytes]) -> None:
    leave(Records(tmp_path / "engines"), sleeper)
    async with agent(tmp_path, Engine()) as supervisor:
        await trio.sleep(2)
        sleeper.kill()  # a zombie of the test's until it is reaped: gone all the same
        with trio.fail_after(30):
            while only(supervisor).state == "ready":
                await trio.sleep(0.1)
        assert only(supervisor).error == ("engine exited (exit status unknown: it was started by an earlier agent) "
                                          "while serving: loading | serving on port 40001")
        assert Records(tmp_path / "engines").load() == [], "nothing left to adopt"


async def test_a_start_from_the_same_launch_is_a_no_op_and_another_launch_replaces_it(
        tmp_path: Path, clock: trio.testing.MockClock, sleeper: subprocess.Popen[bytes]) -> None:
    inventory = NodeInfo("n1", gpus=(Gpu(0, "GPU-aaa", "NVIDIA A100", "a100-80g", 80 << 30, None),))
    leave(Records(tmp_path / "engines"), sleeper)
    async with agent(tmp_path, Engine(), inventory=lambda: inventory) as supervisor:
        before = only(supervisor)
        supervisor.start("demo-r1", DOC, [])
        await trio.sleep(1)
        assert only(supervisor) == before and sleeper.poll() is None, "the adopted engine is kept as it is"
        supervisor.start("demo-r1", DOC, [5])  # another launch (its GPUs): the old engine goes first
        assert await ended(sleeper) in (-signal.SIGTERM, -signal.SIGKILL)
        with trio.fail_after(30):
            while only(supervisor).state == "starting":
                await trio.sleep(0.1)
        assert only(supervisor).error == "gpu 5 is not in this node's inventory (known: 0)"


async def test_gpus_that_cannot_run_an_engine_fail_the_start_with_the_reason(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    card = Gpu(0, "GPU-aaa", "NVIDIA A100", "a100-80g", 80 << 30, None, placeable=False,
               reason="in MIG mode: its instances are placed, not the card")
    sick = Gpu(1, "GPU-bbb", "NVIDIA A100", "a100-80g", 80 << 30, None, healthy=False,
               reason="uncorrectable ECC errors")
    inventory = NodeInfo("n1", gpus=(card, sick))
    async with agent(tmp_path, Engine(), inventory=lambda: inventory) as supervisor:
        for gpus, reason in (([0], "gpu 0 cannot run an engine: in MIG mode: its instances are placed, not the card"),
                             ([1], "gpu 1 cannot run an engine: uncorrectable ECC errors")):
            supervisor.start("demo-r1", DOC, gpus)
            with trio.fail_after(30):
                while only(supervisor).state == "starting":
                    await trio.sleep(0.1)
            assert only(supervisor).error == reason
    async with agent(tmp_path, Engine()) as supervisor:
        supervisor.start("demo-r2", DOC, [0])
        await trio.sleep(1)
        assert [r.error for r in supervisor.replicas() if r.replica_id == "demo-r2"] == [
            "this agent has no GPU inventory to start a GPU replica from"]


async def test_a_crafted_replica_id_is_refused_and_writes_no_file(tmp_path: Path, clock: trio.testing.MockClock) -> None:
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    async with agent(work, Engine()) as supervisor:
        supervisor.start("../../x", DOC, [])
        await trio.sleep(1)
        obs = only(supervisor)
        assert obs.replica_id == "../../x" and obs.state == "failed" and obs.error.startswith("replica id '../../x'")
        supervisor.stop("../../x")
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


async def test_an_agent_that_stops_its_engines_removes_their_records_and_logs(
        tmp_path: Path, clock: trio.testing.MockClock, sleeper: subprocess.Popen[bytes]) -> None:
    records = Records(tmp_path / "engines")
    leave(records, sleeper)
    async with agent(tmp_path, Engine(), stop_on_exit=True) as supervisor:
        assert only(supervisor).state == "ready"
    assert await ended(sleeper) in (-signal.SIGTERM, -signal.SIGKILL)
    assert sorted(os.listdir(records.dir)) == [], f"{file_stem('demo-r1')} files are gone with the engine"


async def test_a_source_outside_the_storage_dirs_fails_the_start_and_starts_nothing(tmp_path: Path) -> None:
    """An agent given `--storage` dirs (its supervisor's `roots`) refuses weights elsewhere, with the
    reason, before any process starts. Real clock: the header check runs in a worker thread."""
    models, elsewhere = tmp_path / "models", tmp_path / "elsewhere"
    models.mkdir()
    elsewhere.mkdir()
    weights = elsewhere / "m.gguf"
    weights.write_bytes(b"GGUF")
    doc = {"name": "outside", "engine": "llama.cpp", "source": str(weights), "profile": {"cpu": True}}
    async with agent(tmp_path, Engine(), roots=(str(models),)) as supervisor:
        supervisor.start("outside-r1", doc, [])
        with trio.fail_after(10):
            while only(supervisor).state == "starting":
                await trio.sleep(0.01)
        obs = only(supervisor)
        assert obs.state == "failed" and "outside" in obs.error and str(models) in obs.error, obs.error
        assert list((tmp_path / "engines").glob("*.json")) == [], "no engine was started"


class LlamaCpp(Engine):
    """A llama.cpp engine's /health and /props: what its chat template can do (None: /props answers 404)."""

    def __init__(self, tool_calls: bool | None) -> None:
        super().__init__()
        self.tool_calls = tool_calls
        self.props = 0

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if str(request.url) != URL + "/props":
            return await super().handle(request)
        self.props += 1
        if self.tool_calls is None:
            return httpx.Response(404)
        return httpx.Response(200, json={"chat_template_caps": {"supports_tool_calls": self.tool_calls,
                                                                "supports_tools": self.tool_calls}})


@pytest.mark.parametrize("ready", [True, False])
@pytest.mark.parametrize("calls", [True, False, None])
async def test_an_adopted_llamacpp_engine_says_whether_its_template_calls_tools(
        tmp_path: Path, clock: trio.testing.MockClock, sleeper: subprocess.Popen[bytes], calls: bool | None,
        ready: bool) -> None:
    records = Records(tmp_path / "engines")
    records.write(replace(leave(records, sleeper, ready=ready), engine="llama.cpp"))
    engine = LlamaCpp(calls)
    async with agent(tmp_path, engine, stop_on_exit=False) as supervisor:
        await trio.sleep(10 * TIMEOUTS.engine_liveness_poll_s)
        assert (only(supervisor).state, only(supervisor).tool_calls) == ("ready", calls)
        assert engine.props == 1, "read once"


async def test_an_adopted_engine_keeps_its_mirror_file_from_eviction(
        tmp_path: Path, clock: trio.testing.MockClock, sleeper: subprocess.Popen[bytes]) -> None:
    """The mirror cache's file an engine runs from is in its record: the next agent never evicts it; a record
    written before the mirror reads as running from none."""
    import dataclasses
    import json

    records = Records(tmp_path / "engines")
    record = dataclasses.replace(leave(records, sleeper), mirror_sha256="ab" * 32)
    records.write(record)
    async with agent(tmp_path, Engine(), stop_on_exit=False) as supervisor:
        assert supervisor.mirror_in_use() == {"ab" * 32}
    old = {k: v for k, v in dataclasses.asdict(record).items() if k != "mirror_sha256"}
    assert EngineRecord.from_doc(json.loads(json.dumps(old))).mirror_sha256 == ""
