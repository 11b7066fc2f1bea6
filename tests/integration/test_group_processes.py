"""A multi-node replica played by real sim processes on loopback: rank 0 serves only once every
rank has joined, and one process that dies takes the whole group down with a reason."""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import trio

from llmgw.agent import AgentConfig
from llmgw.agent import serve as agent_serve
from llmgw.control.service import ControlConfig, Seed
from llmgw.control.service import serve as control_serve
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import NodeInfo
from llmgw.domain.timeouts import TIMEOUTS
from llmgw.engines.sim.group import GROUP_LOST_STATUS
from llmgw.gateway.router import Router
from llmgw.testing import FakeGpuProbe
from tests.support.processes import children_of, free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 20.0


@dataclass
class Rank:
    rank: int
    port: int
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def health(self) -> tuple[int, str]:
        r = httpx.get(f"{self.url}/health", timeout=2.0)
        return r.status_code, r.text

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_exit(self, timeout: float = WAIT_S) -> int:
        return self.proc.wait(timeout=timeout)


class Group:
    """Up to `size` sim processes of one group, each started on demand."""

    def __init__(self, tmp: Path, size: int = 3, leader_port: int | None = None) -> None:
        self.tmp, self.size = tmp, size
        self.leader = f"127.0.0.1:{leader_port or free_port()}"
        self.ranks: dict[int, Rank] = {}

    def start(self, rank: int, *extra: str) -> Rank:
        port = free_port()
        log = self.tmp / f"rank{rank}.log"
        argv = [sys.executable, "-m", "llmgw", "engine", "sim", "--port", str(port), "--model", "g",
                "--group-rank", str(rank), "--group-size", str(self.size), "--group-leader", self.leader, *extra]
        with log.open("wb") as out:
            proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                    env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.ranks[rank] = Rank(rank, port, proc, log)
        wait_for(lambda: answers(self.ranks[rank]), f"rank {rank} answers HTTP", self.ranks[rank])
        return self.ranks[rank]

    def close(self) -> None:
        for r in self.ranks.values():
            if r.proc.poll() is None:
                r.proc.kill()
                r.proc.wait()


def answers(r: Rank) -> bool:
    try:
        r.health()
        return True
    except httpx.TransportError:
        return False


def wait_for(check: Callable[[], bool], what: str, r: Rank) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if check():
            return
        if r.proc.poll() is not None:
            pytest.fail(f"rank {r.rank} exited ({r.proc.returncode}) before {what}:\n{r.output()}")
        time.sleep(0.05)
    pytest.fail(f"not within {WAIT_S} s: {what}\n{r.output()}")


@pytest.fixture
def group(tmp_path: Path) -> Iterator[Group]:
    g = Group(tmp_path)
    yield g
    g.close()


def healthy(r: Rank) -> bool:
    return r.health()[0] == 200


def test_rank_0_serves_only_once_every_rank_has_joined(group: Group) -> None:
    r0 = group.start(0)
    assert r0.health()[0] == 503 and "waiting for ranks 1, 2 to join" in r0.health()[1]
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    assert httpx.post(f"{r0.url}/v1/chat/completions", json=chat, timeout=2).status_code == 503
    r1 = group.start(1)
    wait_for(lambda: "waiting for ranks 2 to join" in r0.health()[1], "rank 1 joined", r0)
    assert r0.health()[0] == 503
    wait_for(lambda: healthy(r1), "rank 1 healthy once joined", r1)
    r2 = group.start(2)
    wait_for(lambda: healthy(r0), "rank 0 healthy once all joined", r0)
    answer = httpx.post(f"{r0.url}/v1/chat/completions", json=chat, timeout=5).json()
    assert answer["choices"][0]["message"]["content"] == "sim says: hi"
    # Members answer /health (the agent's readiness probe) and nothing else: they get no traffic.
    assert healthy(r2)
    refused = httpx.post(f"{r2.url}/v1/chat/completions", json=chat, timeout=2)
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "not_group_leader"


def test_members_started_before_their_leader_join_when_it_comes_up(group: Group) -> None:
    r1, r2 = group.start(1), group.start(2)
    assert r1.health()[0] == 503 and "waiting to join its group leader" in r1.health()[1]
    r0 = group.start(0)
    for r in (r0, r1, r2):
        wait_for(lambda r=r: healthy(r), f"rank {r.rank} healthy", r)  # type: ignore[misc]  # (binds r per loop)


def test_a_member_that_dies_takes_the_group_down_with_the_reason(group: Group) -> None:
    r0, r1, r2 = group.start(0), group.start(1), group.start(2)
    wait_for(lambda: healthy(r0), "rank 0 healthy", r0)
    r2.proc.kill()
    assert r0.wait_exit() == GROUP_LOST_STATUS
    assert "rank 2 left the group" in r0.output()
    assert r1.wait_exit() == GROUP_LOST_STATUS
    assert "group leader gone" in r1.output()


def test_stopping_rank_0_first_stops_cleanly_and_its_members_follow(group: Group) -> None:
    r0, r1, r2 = group.start(0), group.start(1), group.start(2)
    wait_for(lambda: healthy(r0), "rank 0 healthy", r0)
    r0.proc.send_signal(signal.SIGTERM)
    assert r0.wait_exit() == 0, r0.output()
    for r in (r1, r2):
        assert r.wait_exit() == GROUP_LOST_STATUS and "group leader gone" in r.output()


def test_a_taken_leader_port_fails_rank_0_with_the_reason(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        g = Group(tmp_path, leader_port=squatter.getsockname()[1])
        try:
            argv = [sys.executable, "-m", "llmgw", "engine", "sim", "--port", str(free_port()), "--model", "g",
                    "--group-rank", "0", "--group-size", "3", "--group-leader", g.leader]
            done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=WAIT_S)
        finally:
            g.close()
    assert done.returncode == GROUP_LOST_STATUS
    assert f"cannot listen for the group's members on {g.leader}" in done.stderr


@pytest.mark.parametrize("flags, words", [
    (["--group-rank", "3", "--group-size", "3", "--group-leader", "127.0.0.1:1"], "--group-rank must be 0..2"),
    (["--group-rank", "0", "--group-size", "1", "--group-leader", "127.0.0.1:1"], "--group-size must be 2..64"),
    (["--group-rank", "0", "--group-size", "2", "--group-leader", "nowhere"], "--group-leader must be HOST:PORT"),
    (["--group-rank", "1"], "go together"),
])
def test_bad_group_flags_are_refused(flags: list[str], words: str) -> None:
    argv = [sys.executable, "-m", "llmgw", "engine", "sim", "--port", "0", "--model", "g", *flags]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=WAIT_S)
    assert done.returncode == 2 and words in done.stderr


# --- end to end: a control plane and three agents in one trio run -------------------------

ADMIN = "sk-admin-groups-test"


def engine_pid(rank: int, model: str) -> int | None:
    """The pid of this test's sim engine playing `rank` of `model` (a child of one agent's)."""
    for pid in children_of(os.getpid()):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"sim" in argv and b"--group-rank" in argv and argv[argv.index(b"--group-rank") + 1] == str(rank).encode() \
                and argv[argv.index(b"--model") + 1] == model.encode():
            return pid
    return None


async def test_three_agents_run_a_group_and_one_dead_member_replaces_it_whole(tmp_path: Path) -> None:
    router = Router()
    seed = Seed(admin_key=ADMIN, models=[ModelDef.from_doc(
        {"name": "g", "engine": "sim", "source": "sim://g", "profile": {"nodes": 3, "tp": 3, "cpu": True}})])
    timeouts = dataclasses.replace(TIMEOUTS, start_backoff_first_s=0.1, start_backoff_max_s=0.4)
    config = ControlConfig(state_dir=tmp_path / "control", raft_addr=f"127.0.0.1:{free_port()}",
                           admin_host="127.0.0.1", admin_port=free_port(), seed=seed, sinks=[router],
                           demand=[router], timeouts=timeouts)

    def endpoint() -> str | None:
        route = router.route("g")
        return route.endpoints[0].replica_id if route and route.endpoints else None

    async def wait(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
        with trio.fail_after(timeout):
            while not predicate():
                await trio.sleep(0.05)

    async with trio.open_nursery() as nursery:
        control = await nursery.start(control_serve, config)
        for name in ("n1", "n2", "n3"):
            probe = FakeGpuProbe(NodeInfo(name, hostname=name, cpus=2, engines=("sim",)))
            await nursery.start(agent_serve, AgentConfig(controls=[control.admin_url], tls=None,
                                                         local_credential=control.context.local_credential(
                                                             "agent", name),
                                                         state_dir=tmp_path / name, node=name, probe=probe,
                                                         fabric="lo"))
        await wait(lambda: endpoint() is not None)
        first = endpoint()
        assert first is not None and first.endswith("-r0"), "rank 0 is the group's only endpoint"
        placements = control.store.snapshot().placements
        assert sorted(p.node for p in placements.values()) == ["n1", "n2", "n3"]
        route = router.route("g")
        assert route is not None and len(route.endpoints) == 1
        async with httpx.AsyncClient() as http:
            chat = {"messages": [{"role": "user", "content": "hi"}]}
            answer = (await http.post(f"{route.endpoints[0].url}/v1/chat/completions", json=chat)).json()
            assert answer["choices"][0]["message"]["content"] == "sim says: hi"

        victim = engine_pid(2, "g")
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        # The whole group goes, and a new one (a new id, so likely a new port) serves again.
        await wait(lambda: endpoint() not in (None, first))
        assert not set(placements) & set(control.store.snapshot().placements), "no member of the old group stays"
        nursery.cancel_scope.cancel()
