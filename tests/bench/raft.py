"""The Raft store's benchmark on three members on loopback; prints one table.

- committed commands/s: three bare `RaftStore` members, each in its own process (this script
  run with `--member`); the leader's process submits `put_setting` commands, one at a time and
  with N in flight, each awaited until committed and applied (fsync policy `always`); with N in
  flight, once with one Raft entry per command and once with the store's group commit (the
  commands submitted in one scheduler pass go as one entry: `llmgw.store.batching`);
- single write latency p50/p99 through the admin API of three `llmgw control` processes, at
  the leader and through a standby (which forwards to the leader);
- the fsync policy's cost: sequential commits on one member per policy (`tests.support.fsync_cost`);
- failover p50/p99: SIGKILL of the leader -> the next write acknowledged through a survivor;
  and in the same kills, an `llmgw agent` and an `llmgw gateway` given every member's URL:
  the kill -> the agent listed as connected by the new leader, and the gateway's /health naming it.

Run: `.venv/bin/python tests/bench/raft.py [--kills 6] [--writes 200] [--commands 2000]`
(about a minute by default). Figures are from one run on this machine, not a judgement: the
goals in issue 6 are beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from llmgw.domain import commands  # noqa: E402
from llmgw.net import free_port  # noqa: E402
from llmgw.store import RaftStore  # noqa: E402
from llmgw.store.batching import MAX_COMMANDS  # noqa: E402
from tests.support.campaign import model_doc  # noqa: E402
from tests.support.cluster import Cluster, Member  # noqa: E402
from tests.support.figures import pct  # noqa: E402
from tests.support.fsync_cost import measure_commits  # noqa: E402
from tests.support.trust import join_token  # noqa: E402


@dataclass
class Row:
    what: str
    figure: str
    goal: str = ""


# --- committed commands/s: bare stores, one process each ------------------------------------


async def _load(store: RaftStore, inflight: int, count: int) -> dict[str, float]:
    took: list[float] = []
    left = [count]

    async def worker() -> None:
        while left[0] > 0:
            left[0] -= 1
            t0 = time.perf_counter()
            await store.submit(commands.put_setting("guard.enabled", bool(left[0] % 2), 1.0))
            took.append(time.perf_counter() - t0)

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(inflight):
            nursery.start_soon(worker)
    total = time.perf_counter() - start
    return {"per_s": count / total, "p50_ms": statistics.median(took) * 1000, "p99_ms": pct(took, 0.99) * 1000}


async def _member(self_addr: str, peers: list[str], state_dir: Path, secret: str) -> None:
    """`--member`: one store; answers "leader?" and "load INFLIGHT COUNT" lines on stdin."""
    store = RaftStore(self_addr=self_addr, peers=peers, state_dir=state_dir, cluster_secret=secret)
    await store.start()
    try:
        await store.wait_ready()
        print("ready", flush=True)
        while line := await trio.to_thread.run_sync(sys.stdin.readline):
            ask = json.loads(line)
            if ask["do"] == "leader?":
                answer: Any = store.is_leader()
            else:  # one Raft entry per command, or the group commit the store does by default
                store.group.max_commands = MAX_COMMANDS if ask["group"] else 1
                answer = await _load(store, ask["inflight"], ask["count"])
            print(json.dumps(answer), flush=True)
    finally:
        store.close()


def member_argv(self_addr: str, peers: list[str], state_dir: Path, secret_file: Path) -> list[str]:
    """One `--member` process's command line. The cluster secret goes by a file, never on the command
    line: `secrets.token_urlsafe` begins with "-" one time in 32, and argparse takes that for an option."""
    return [sys.executable, __file__, "--member", self_addr, ",".join(peers), str(state_dir), str(secret_file)]


def member_of(args: argparse.Namespace) -> tuple[str, list[str], Path, str]:
    """What `--member` was given: its address, its peers, its state directory and the secret (read from its file)."""
    self_addr, peers, state_dir, secret_file = args.member
    return self_addr, peers.split(","), Path(state_dir), Path(secret_file).read_text().strip()


def commit_throughput(root: Path, loads: list[tuple[int, int, bool]]) -> list[tuple[int, bool, dict[str, float]]]:
    addrs = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    secret_file = root / "cluster.secret"
    secret_file.touch(mode=0o600)
    secret_file.write_text(secrets.token_urlsafe(32) + "\n")
    procs = [subprocess.Popen(member_argv(a, [p for p in addrs if p != a], root / f"store{i}", secret_file),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for i, a in enumerate(addrs)]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready", "a store did not start"

        def ask(p: subprocess.Popen[str], doc: dict[str, Any]) -> Any:
            assert p.stdin is not None and p.stdout is not None
            p.stdin.write(json.dumps(doc) + "\n")
            p.stdin.flush()
            return json.loads(p.stdout.readline())

        leader = next(p for p in procs if ask(p, {"do": "leader?"}))
        ask(leader, {"do": "load", "inflight": 8, "count": 200, "group": True})  # warm up
        return [(inflight, group, ask(leader, {"do": "load", "inflight": inflight, "count": count, "group": group}))
                for inflight, count, group in loads]
    finally:
        for p in procs:
            if p.stdin is not None:
                p.stdin.close()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            if p.stdout is not None:
                p.stdout.close()


# --- through the admin API of `llmgw control` processes --------------------------------------


async def write_latency(cluster: Cluster, m: Member, writes: int, tag: str) -> list[float]:
    took = []
    async with httpx.AsyncClient(timeout=10) as http:
        for i in range(writes):
            t0 = time.perf_counter()
            r = await http.post(m.url + "/api/v1/models", json=model_doc(f"lat-{tag}-{i % 20}", f"{tag}{i}"),
                                headers={**cluster.headers, "Idempotency-Key": f"lat-{tag}-{i}"})
            took.append(time.perf_counter() - t0)
            assert r.status_code in (200, 201), r.text
    return took


class Followers:
    """An `llmgw agent` and an `llmgw gateway`, each given every member's admin URL."""

    def __init__(self, cluster: Cluster, root: Path) -> None:
        """Each joins once with a token of its own, made with the admin key (the group is up and led)."""
        urls = [a for m in cluster.members for a in ("--control", m.url)]
        member = cluster.members[0].url
        agent_token = join_token(member, cluster.admin_key, "agent", "bench-node", wait_s=30)
        gateway_token = join_token(member, cluster.admin_key, "gateway", "bench-gateway", wait_s=30)
        self.gateway_port = free_port()
        self.logs = (root / "agent.log").open("ab"), (root / "gateway.log").open("ab")
        self.agent = subprocess.Popen([sys.executable, "-m", "llmgw", "agent", "--stop-engines-on-exit", *urls, "--state-dir", str(root / "agent"),
                                       "--node", "bench-node", f"--join-token={agent_token}"], stdout=self.logs[0],
                                      stderr=subprocess.STDOUT)
        self.gateway = subprocess.Popen([sys.executable, "-m", "llmgw", "gateway", *urls, "--listen",
                                         f"127.0.0.1:{self.gateway_port}", "--state-dir", str(root / "gateway"),
                                         "--name", "bench-gateway", f"--join-token={gateway_token}"],
                                        stdout=self.logs[1], stderr=subprocess.STDOUT)

    async def agent_on(self, cluster: Cluster, survivors: list[Member], http: httpx.AsyncClient) -> bool:
        """Whether the leader (asked through a survivor) lists the agent as connected."""
        for m in survivors:
            try:
                r = await http.get(m.url + "/api/v1/nodes", headers=cluster.headers, timeout=1)
            except httpx.HTTPError:
                continue
            if r.status_code == 200:
                return any(n["node"] == "bench-node" and n["connected"] for n in r.json()["nodes"])
        return False

    async def gateway_leader(self, http: httpx.AsyncClient) -> str | None:
        try:
            r = await http.get(f"http://127.0.0.1:{self.gateway_port}/health", timeout=1)
            leader = r.json().get("leader")
            return str(leader) if leader else None
        except (httpx.HTTPError, ValueError):
            return None

    def close(self) -> None:
        for p in (self.agent, self.gateway):
            p.terminate()
        for p in (self.agent, self.gateway):
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        for f in self.logs:
            f.close()


async def failovers(cluster: Cluster, followers: Followers, kills: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"write": [], "agent": [], "gateway": []}
    async with httpx.AsyncClient() as http:
        await cluster.wait_for("the agent attached", lambda: followers.agent_on(cluster, cluster.members, http), 30)
        await cluster.wait_for("the gateway following", lambda: followers.gateway_leader(http), 30)
        for k in range(kills):
            old = await cluster.wait_for("a leader", cluster.leader, 30)
            survivors = [m for m in cluster.members if m is not old]
            cluster.kill(old)
            killed = time.monotonic()
            seen: dict[str, float] = {}

            async def write() -> None:
                n = 0
                while True:
                    n += 1
                    try:
                        r = await http.post(survivors[n % 2].url + "/api/v1/models", json=model_doc(f"fo-{k}", "v"),
                                            headers={**cluster.headers, "Idempotency-Key": f"fo-{k}"}, timeout=1)
                        if r.status_code in (200, 201):
                            seen["write"] = time.monotonic() - killed
                            return
                    except httpx.HTTPError:
                        pass
                    await trio.sleep(0.01)

            async def agent() -> None:
                while not await followers.agent_on(cluster, survivors, http):
                    await trio.sleep(0.02)
                seen["agent"] = time.monotonic() - killed

            async def gateway() -> None:
                while (await followers.gateway_leader(http)) in (None, old.raft_addr, old.url):
                    await trio.sleep(0.02)
                seen["gateway"] = time.monotonic() - killed

            with trio.move_on_after(30):
                async with trio.open_nursery() as nursery:
                    for task in (write, agent, gateway):
                        nursery.start_soon(task)
            for what, took in seen.items():
                times[what].append(took)
            cluster.start_member(old)
            await cluster.wait_settled(30)
    return times


def _spread(values: list[float], unit: float = 1.0, fmt: str = "{:.2f}") -> str:
    if not values:
        return "not measured (never seen)"
    return f"p50 {fmt.format(statistics.median(values) * unit)}, p99 {fmt.format(pct(values, 0.99) * unit)}"


async def api_part(root: Path, args: argparse.Namespace, rows: list[Row]) -> None:
    cluster = Cluster(root / "cluster")
    followers: Followers | None = None
    try:
        await cluster.start()
        await cluster.wait_settled()
        leader = await cluster.leader()
        assert leader is not None
        standby = next(m for m in cluster.members if m is not leader)
        at_leader = await write_latency(cluster, leader, args.writes, "l")
        via_standby = await write_latency(cluster, standby, max(20, args.writes // 2), "s")
        rows.append(Row("write latency at the leader (admin API)", _spread(at_leader, 1000, "{:.1f}") + " ms",
                        "p50 <= 15 ms"))
        rows.append(Row("write latency via a standby (forwarded)", _spread(via_standby, 1000, "{:.1f}") + " ms"))
        followers = Followers(cluster, root)
        times = await failovers(cluster, followers, args.kills)
        rows.append(Row(f"failover: SIGKILL of the leader -> next write ({args.kills} kills)",
                        _spread(times["write"]) + " s", "p50 <= 1 s, p99 <= 2 s"))
        rows.append(Row("agent re-attach: kill -> listed by the new leader", _spread(times["agent"]) + " s",
                        "<= 5 s after the election"))
        rows.append(Row("gateway re-attach: kill -> /health names the new leader", _spread(times["gateway"]) + " s"))
    finally:
        if followers is not None:
            followers.close()
        cluster.close()


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--member", nargs=4, metavar=("SELF", "PEERS", "DIR", "SECRET_FILE"), help=argparse.SUPPRESS)
    parser.add_argument("--commands", type=int, default=2000, help="commands per throughput figure")
    parser.add_argument("--inflight", type=int, nargs="+", default=[16, 256])
    parser.add_argument("--writes", type=int, default=200, help="writes per latency figure")
    parser.add_argument("--kills", type=int, default=6, help="SIGKILLs of the leader")
    parser.add_argument("--fsync-commits", type=int, default=300)
    return parser


def main() -> None:
    args = parser().parse_args()
    if args.member:
        trio.run(_member, *member_of(args))
        return
    started = time.monotonic()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="llmgw-raft-bench-") as tmp:
        root = Path(tmp)
        one = max(100, args.commands // 5)
        loads = [(1, one, False)] + [(n, args.commands, group) for n in args.inflight for group in (False, True)]
        for inflight, group, got in commit_throughput(root, loads):
            how = "group commit" if group else "one entry per command"
            rows.append(Row(f"committed commands/s, {inflight} in flight, {how}",
                            f"{got['per_s']:.0f}/s (p50 {got['p50_ms']:.1f} ms, p99 {got['p99_ms']:.1f} ms)",
                            ">= 5,000/s" if group and inflight == max(args.inflight) else ""))
        trio.run(api_part, root, args, rows)
        for policy in ("always", "off"):
            cost = trio.run(measure_commits, root / f"fsync-{policy}", policy, args.fsync_commits)
            rows.append(Row(f"fsync {policy}: sequential commits, one member",
                            f"{cost.per_s:.0f}/s (p50 {cost.p50_ms:.2f} ms, p99 {cost.p99_ms:.2f} ms)"))
    width = max(len(r.what) for r in rows)
    fig = max(len(r.figure) for r in rows)
    print(f"{'measure':<{width}}  {'this run':<{fig}}  goal (issue 6)")
    print(f"{'-' * width}  {'-' * fig}  {'-' * 14}")
    for r in rows:
        print(f"{r.what:<{width}}  {r.figure:<{fig}}  {r.goal}")
    print(f"\n3 members on loopback, {os.cpu_count()} CPUs; {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
