"""The Raft fault campaign's rounds: concurrent writers through every member's admin API, one
random fault per round, a recorded history, and the checks at each round's end.

A write is `POST /api/v1/models` of a model whose name is the key and whose source holds the
value (`sim://c2-17`: client 2's 17th write), under one `Idempotency-Key` for all its tries; a
read is `GET /api/v1/models/KEY`. Keys are per round: a few shared by every client (registers,
where a write applied late or twice shows as a non-linearizable read) and one per write (each
acknowledged one must be there at the end). A round ends when every write has an answer: each
write is retried, with its key, until one try is acknowledged or `resolve_s` passes.

Checks at each round's end: the members settle at one revision with one state hash; every
acknowledged write is there; the revision moved by exactly the writes applied (more: a write
applied twice; fewer: one lost); each key's history is linearizable (an "unknown" verdict fails);
no member's log says pysyncobj cut entries it had applied.
"""

from __future__ import annotations

import random
import signal
import statistics
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

import httpx
import trio

from tests.support.cluster import Cluster, Member
from tests.support.figures import pct
from tests.support.netns import Fabric
from tests.support.linearizability import KV_MODEL, KvInput, KvOutput, Operation, Verdict, check, get, put

FAULTS = ("kill-leader", "kill-standby", "pause-leader", "pause-standby", "restart-all", "stop-leader")
# Faults that need the members in network namespaces (tests/support/netns.py) and failpoints on.
NET_FAULTS = ("partition-leader", "partition-standby", "partition-one-way", "partition-bridge", "net-flaky",
              "clock-jump", "power-loss", "bitflip", "member-change", "overlap")
Outcome = Literal["ok", "refused", "unknown"]
_DIVERGED = "state machine may have diverged"  # pysyncobj's word for a follower that cut applied entries
# A member's own writes, each one more revision than the clients': its announcement (sent again by a member
# that restarted behind the group, whose copy of the state did not yet hold its record), and the record of
# its certificate (a member whose certificate files a power loss took makes a new one), and the leader's
# record that the group requires TLS between its members (once, or once more by a leader that had not yet
# applied another's).
_OWN_WRITES = ("llmgw.control.members: announced to the group", "this control plane's certificate: serial",
               "the group requires TLS between its members from now on",
               "llmgw.notify: recording conditions")  # a member missing in a round: the leader records it
_NOTHING_DONE = frozenset({"no_leader", "not_leader", "leader_unreachable", "store_unavailable"})


@dataclass(frozen=True)
class RoundConfig:
    clients: int = 4
    seconds: float = 1.2  # how long clients start new operations
    shared_keys: int = 3
    reads: float = 0.4  # share of operations that are reads
    shared: float = 0.5  # share of writes to a shared key
    try_s: float = 1.5  # one try's HTTP timeout (a paused member answers nothing)
    retry_s: float = 0.03  # wait between tries of one write
    resolve_s: float = 30.0  # a write still unanswered this long after the round's end stays unknown
    settle_s: float = 30.0
    settle_bound_s: float = 15.0  # a round fails when the members settle later than this after the last heal
    check_s: float = 10.0  # the linearizability checker's timeout
    cleanup: bool = True  # remove the round's models once checked (keeps the state small)


@dataclass
class Write:
    client: int
    key: str
    value: str
    idem: str
    call: float
    unique: bool = False  # the only write to its key: it must be there at the end
    ret: float | None = None
    outcome: Outcome = "refused"
    tries: list[str] = field(default_factory=list)  # what each try got, in words

    @property
    def unknown_tries(self) -> int:
        return sum(t.startswith("unknown") for t in self.tries)


@dataclass
class Read:
    client: int | str
    key: str
    call: float
    ret: float
    value: str | None
    member: str = ""  # the member that answered (itself, or by forwarding to the leader)


@dataclass
class RoundResult:
    number: int
    fault: str
    writes: list[Write]
    reads: list[Read]
    failover_s: float | None = None
    failures: list[str] = field(default_factory=list)
    revision_delta: int = 0
    seconds: float = 0.0
    changes: int = 0  # membership changes acknowledged (each moves the revision by 0, 1 or 2)
    settle_s: float | None = None  # the last heal (or the clients' end, if later) -> every member at one revision
    notes: list[str] = field(default_factory=list)  # what the fault did, in words

    @property
    def acked(self) -> int:
        return sum(w.outcome == "ok" for w in self.writes)

    @property
    def unknown(self) -> int:
        return sum(w.outcome == "unknown" for w in self.writes)

    def history(self) -> list[Operation[KvInput, KvOutput]]:
        ops: list[Operation[KvInput, KvOutput]] = []
        for w in self.writes:
            if w.outcome != "refused":  # a definite refusal took no effect
                ops.append(Operation(w.client, put(w.key, w.value), w.call, None, w.ret))
        ops += [Operation(r.client, get(r.key), r.call, r.value, r.ret) for r in self.reads]
        return ops


def low_compaction(rng: random.Random) -> Callable[[Member], list[str]]:
    """Flags for each start of a member: half of the starts compact the journal past 40 entries, so
    snapshots are taken, and sent to members that fall behind, within a round."""
    return lambda m: ["--journal-compact-after", str(rng.choice((40, 5000)))]


def model_doc(key: str, value: str) -> dict[str, Any]:
    return {"name": key, "engine": "sim", "source": f"sim://{value}", "mode": "on-demand",
            "replicas": {"min": 0, "max": 1}}


def classify(response: httpx.Response | None, error: Exception | None) -> tuple[str, str]:
    """One try's answer: ("ok" | "nothing" | "unknown" | "refused", in words).

    "nothing": definitely not applied (nothing was sent, or the member said nothing was done);
    "unknown": it may have been applied (a timeout or a connection lost after sending, 503
    commit_unknown, a 5xx)."""
    if error is not None:
        if isinstance(error, (httpx.ConnectError, httpx.ConnectTimeout)):
            return "nothing", f"nothing: {type(error).__name__}"
        return "unknown", f"unknown: {type(error).__name__}"
    assert response is not None
    if 200 <= response.status_code < 300:
        return "ok", f"ok: {response.status_code}"
    try:
        code = str(response.json()["error"]["code"])
    except (ValueError, KeyError, TypeError):
        code = "?"
    if response.status_code == 503 and code in _NOTHING_DONE:
        return "nothing", f"nothing: 503 {code}"
    if 400 <= response.status_code < 500:
        return "refused", f"refused: {response.status_code} {code}: {response.text[:200]}"
    return "unknown", f"unknown: {response.status_code} {code}"


class Round:
    """One round's clients, fault and history. `run()` returns once every write has an answer."""

    def __init__(self, cluster: Cluster, number: int, rng: random.Random, config: RoundConfig,
                 fault: str | None = None) -> None:
        self.cluster = cluster
        self.number = number
        self.config = config
        self.rng = random.Random(rng.random())
        self.client_seeds = [rng.random() for _ in range(config.clients)]
        self.fault = fault or self.rng.choice(FAULTS)
        self.result = RoundResult(number, self.fault, [], [])
        self._ends = 0.0
        self._killed_at: float | None = None
        self._healed_at = 0.0
        self._clients_done = 0.0
        self._log_sizes: dict[str, int] = {}

    # -- one write, one read ------------------------------------------------------------------

    async def write(self, http: httpx.AsyncClient, rng: random.Random, client: int, key: str, value: str, *,
                    unique: bool, members: list[Member] | None = None) -> Write:
        w = Write(client, key, value, f"fc-{self.number}-{key}-{value}", time.monotonic(), unique)
        self.result.writes.append(w)
        body = model_doc(key, value)
        headers = {**self.cluster.headers, "Idempotency-Key": w.idem}
        give_up = max(self._ends, w.call) + self.config.resolve_s
        while True:
            m = rng.choice(members or self.cluster.members)
            response, error = None, None
            try:
                response = await http.post(m.url + "/api/v1/models", json=body, headers=headers,
                                           timeout=self.config.try_s)
            except httpx.HTTPError as e:
                error = e
            kind, words = classify(response, error)
            w.tries.append(f"{words} via {m.name}")
            if kind == "ok":
                w.ret, w.outcome = time.monotonic(), "ok"
                return w
            if kind == "refused":  # a valid definition is never refused: report it
                self.result.failures.append(f"write {key}={value} refused: {words} (tries: {w.tries})")
                w.outcome = "unknown" if w.unknown_tries else "refused"
                return w
            if time.monotonic() > give_up:
                w.outcome = "unknown" if w.unknown_tries else "refused"
                return w
            await trio.sleep(self.config.retry_s)

    async def read(self, http: httpx.AsyncClient, m: Member, client: int | str, key: str) -> None:
        call = time.monotonic()
        try:
            r = await http.get(m.url + f"/api/v1/models/{key}", headers=self.cluster.headers,
                               timeout=self.config.try_s)
        except httpx.HTTPError:
            return  # a read that got no answer took no effect: it is left out
        ret = time.monotonic()
        if r.status_code == 200:
            source = str(r.json()["model"]["source"])
            self.result.reads.append(Read(client, key, call, ret, source.removeprefix("sim://"), m.name))
        elif r.status_code == 404 and r.json().get("error", {}).get("code") == "model_not_found":
            self.result.reads.append(Read(client, key, call, ret, None, m.name))

    # -- the round -----------------------------------------------------------------------------

    def shared_key(self, k: int) -> str:
        return f"r{self.number}-{k}"

    async def client(self, n: int) -> None:
        rng = random.Random(self.client_seeds[n])
        written = 0
        mine: list[str] = []
        async with httpx.AsyncClient() as http:
            while time.monotonic() < self._ends or self._healed_at == 0.0:  # through the whole fault
                if rng.random() < self.config.reads:
                    key = (self.shared_key(rng.randrange(self.config.shared_keys)) if not mine or rng.random() < 0.7
                           else rng.choice(mine))
                    await self.read(http, rng.choice(self.cluster.members), n, key)
                else:
                    written += 1
                    unique = rng.random() >= self.config.shared
                    if unique:
                        key = f"u{self.number}-{n}-{written}"
                        mine.append(key)
                    else:
                        key = self.shared_key(rng.randrange(self.config.shared_keys))
                    await self.write(http, rng, n, key, f"c{n}-{written}", unique=unique)
                await trio.sleep(rng.uniform(0, 0.02))

    async def inject(self) -> None:
        """The round's fault, at a random moment; healed (restarted, resumed, reconnected) before it
        returns, which is the moment "settled within N s of the last heal" counts from."""
        await trio.sleep(self.rng.uniform(0.15, 0.5) * self.config.seconds)
        kind = self.fault
        if kind == "restart-all":
            await trio.sleep(0)
            self.cluster.kill_all()
            await trio.sleep(self.rng.uniform(0.0, 0.3))
            for m in self.cluster.members:
                self.cluster.start_member(m)
        elif kind in ("kill-leader", "kill-standby", "pause-leader", "pause-standby", "stop-leader"):
            await self.process_fault(kind)
        else:
            await NET_FAULT_STEPS[kind](self)
        self._healed_at = time.monotonic()

    async def target(self, role: str) -> Member:
        """The leader ("leader": when there is none, mid-election, any member, and the round's fault
        is renamed for what it hit), or a member that does not lead ("standby")."""
        c = self.cluster
        leader = await c.leader()
        if role == "leader":
            if leader is not None:
                return leader
            self.fault = self.result.fault = self.fault.replace("leader", "standby")
            return self.rng.choice(c.members)
        return self.rng.choice([m for m in c.members if m is not leader])

    async def process_fault(self, kind: str) -> None:
        c, rng = self.cluster, self.rng
        target = await self.target(kind.partition("-")[2])
        if kind.startswith("kill"):
            c.kill(target)
            async with trio.open_nursery() as nursery:
                if self.result.fault == "kill-leader":
                    self.start_failover_probe(nursery, target)
                await trio.sleep(rng.uniform(0.2, 1.0))
                c.start_member(target)
        elif kind.startswith("stop"):  # a planned stop (SIGTERM): a leader hands leadership over first
            async with trio.open_nursery() as nursery:
                if self.result.fault == "stop-leader":
                    self.start_failover_probe(nursery, target)
                await trio.to_thread.run_sync(target.stop)
                await trio.sleep(rng.uniform(0.2, 1.0))
                c.start_member(target)
        else:
            c.pause(target)
            await trio.sleep(rng.uniform(0.3, 2.5))
            c.resume(target)

    def start_failover_probe(self, nursery: trio.Nursery, lost: Member) -> None:
        self._killed_at = time.monotonic()
        nursery.start_soon(self.probe_failover, [m for m in self.cluster.members if m is not lost])

    # -- the faults that need each member in a namespace of its own, with failpoints ---------------

    def hold_s(self) -> float:
        """How long a partition or a flaky network lasts: a third of the rounds longer than
        pysyncobj's connection timeout (3.5 s), so that connections are dropped and redialled."""
        return self.rng.uniform(3.6, 6.5) if self.rng.random() < 1 / 3 else self.rng.uniform(0.3, 3.0)

    @property
    def fabric(self) -> Fabric:
        assert self.cluster.fabric is not None, f"{self.fault} needs a cluster in network namespaces"
        return self.cluster.fabric

    async def partition(self, role: str, one_way: str | None = None) -> None:
        """`role`'s member cut off from the others (both ways, or `one_way` "in"/"out")."""
        c = self.cluster
        target = await self.target(role)
        others = [m for m in c.members if m is not target]
        self.fabric.isolate(target.host, [m.host for m in others], one_way=one_way)
        self.note(f"cut {target.name} off{'' if one_way is None else f' ({one_way}going only)'}")
        async with trio.open_nursery() as nursery:
            if self.result.fault == "partition-leader":
                self.start_failover_probe(nursery, target)
            await trio.sleep(self.hold_s())
            self.fabric.heal()

    async def partition_bridge(self) -> None:
        """Two members cut apart; the third still reaches both (Jepsen's bridge, for three)."""
        a, b = self.rng.sample(self.cluster.members, 2)
        self.fabric.cut(a.host, b.host)
        self.note(f"cut {a.name} and {b.name} apart")
        await trio.sleep(self.hold_s())
        self.fabric.heal()

    async def net_flaky(self) -> None:
        """Raft messages dropped and delayed (so also reordered), on every member's sends."""
        drop, delay = self.rng.uniform(0.05, 0.3), self.rng.uniform(0.01, 0.15)
        rule = {"*": {"drop": drop, "delay_s": [0.0, delay]}}
        for m in self.cluster.members:
            self.cluster.set_failpoints(m, send=rule)
        self.note(f"drop {drop:.0%}, delay up to {delay * 1000:.0f} ms")
        await trio.sleep(self.hold_s())
        for m in self.cluster.members:
            self.cluster.set_failpoints(m)

    async def clock_jump(self) -> None:
        """A member's store clock jumps forward or back by 2-30 s (and stays there)."""
        m = self.rng.choice(self.cluster.members)
        jump = self.rng.choice((-1, 1)) * self.rng.uniform(2, 30)
        self.cluster.set_failpoints(m, clock_offset_s=m.clock_offset_s + jump)
        self.note(f"{m.name}'s clock {jump:+.1f} s")

    async def power_loss(self) -> None:
        """One member (a quarter of the rounds: all at once) loses power: what it had not flushed is gone."""
        c = self.cluster
        targets = list(c.members) if self.rng.random() < 0.25 else [self.rng.choice(c.members)]
        for m in targets:  # every SIGKILL first: as close to "at once" as signals get
            if m.proc is not None and m.proc.poll() is None:
                m.proc.send_signal(signal.SIGKILL)
        for m in targets:
            self.note(f"{m.name} lost power: " + ("; ".join(c.power_loss(m)) or "every write was flushed"))
        await trio.sleep(self.rng.uniform(0.1, 1.0))
        for m in targets:
            c.start_member(m)

    async def bitflip(self) -> None:
        """A standby stopped, one bit of its journal or snapshot flipped, started: it must refuse, naming
        the file; then it is rejoined from the others' copy (removed, started with --rejoin, added)."""
        c = self.cluster
        m = await self.target("standby")
        c.kill(m)
        files = [f for f in (m.raft_dir / "journal.bin", m.raft_dir / "snapshot.json") if f.exists()]
        victim = self.rng.choice(files)
        data = bytearray(victim.read_bytes())
        at = self.rng.randrange(len(data))
        data[at] ^= 1 << self.rng.randrange(8)
        victim.write_bytes(bytes(data))
        self.note(f"{m.name}: flipped a bit of {victim.name} at byte {at} of {len(data)}")
        size = m.log.stat().st_size
        c.start_member(m)
        with trio.move_on_after(30):
            while m.running:
                await trio.sleep(0.05)
        if m.running:
            self.result.failures.append(f"{m.name} started on {victim.name} with a flipped bit at byte {at}")
            c.kill(m)
        else:
            said = m.log.read_text(errors="replace")[size:]
            if victim.name not in said:
                self.result.failures.append(f"{m.name} refused {victim.name} with a flipped bit at byte {at} "
                                            f"without naming it: {said[-500:]!r}")
        await self.rejoin(m)

    async def member_change(self) -> None:
        """A standby removed and added back (rejoined empty) while Raft messages are dropped and delayed."""
        c = self.cluster
        rule = {"*": {"drop": self.rng.uniform(0.02, 0.15), "delay_s": [0.0, self.rng.uniform(0.01, 0.08)]}}
        for m in c.members:
            c.set_failpoints(m, send=rule)
        m = await self.target("standby")
        m.stop()
        await self.rejoin(m)
        for o in c.members:
            c.set_failpoints(o)

    async def overlap(self) -> None:
        """The leader cut off longer than the connection timeout, and meanwhile another member loses
        power and comes back: for a while no majority can be formed."""
        c, rng = self.cluster, self.rng
        leader = await self.target("leader")
        others = [m for m in c.members if m is not leader]
        self.fabric.isolate(leader.host, [m.host for m in others])
        hold = rng.uniform(3.6, 6.5)
        await trio.sleep(hold / 3)
        victim = rng.choice(others)
        self.note(f"cut {leader.name} off for {hold:.1f} s; {victim.name} lost power: "
                  + ("; ".join(c.power_loss(victim)) or "every write was flushed"))
        await trio.sleep(rng.uniform(0.3, 1.5))
        c.start_member(victim)
        await trio.sleep(max(0.0, hold * 2 / 3 - 1.5))
        self.fabric.heal()

    async def rejoin(self, m: Member) -> None:
        """docs/ha.md, "A damaged journal": remove `m` (stopped) through the others, start it with
        --rejoin, add it again; returns once it is a voting member again."""
        c = self.cluster
        others = [o for o in c.members if o is not m]
        await self.admin_until_done("DELETE", f"/api/v1/cluster/members/{m.raft_addr}", None, others)
        c.start_member(m, extra=["--rejoin"])
        await self.admin_until_done("POST", "/api/v1/cluster/members", {"raft_addr": m.raft_addr}, others)
        self.note(f"{m.name} rejoined")

    async def admin_until_done(self, method: str, path: str, body: Any, via: list[Member]) -> None:
        """One membership change, retried (same Idempotency-Key) until a member acknowledges it."""
        headers = {**self.cluster.headers, "Idempotency-Key": f"fc-{self.number}-{method}-{path}"}
        async with httpx.AsyncClient() as http:
            for _ in range(600):
                m = self.rng.choice(via)
                try:
                    r = await http.request(method, m.url + path, json=body, headers=headers, timeout=5)
                    if r.status_code < 300:
                        self.result.changes += 1  # a membership change is a revision of its own
                        return
                except httpx.HTTPError:
                    pass
                await trio.sleep(0.1)
        self.result.failures.append(f"{method} {path} was not acknowledged in 60 s")

    def note(self, words: str) -> None:
        self.result.notes.append(words)

    async def probe_failover(self, survivors: list[Member]) -> None:
        """Write through the survivors until one write is acknowledged: failover is its return
        time less the kill's (SIGKILL of the leader -> the next committed write)."""
        assert self._killed_at is not None
        rng = random.Random(self.rng.random())
        async with httpx.AsyncClient() as http:
            w = await self.write(http, rng, -1, f"f{self.number}", "probe", unique=True, members=survivors)
        if w.outcome == "ok" and w.ret is not None:
            self.result.failover_s = w.ret - self._killed_at

    async def run(self) -> RoundResult:
        self._log_sizes = {m.name: m.log.stat().st_size if m.log.exists() else 0 for m in self.cluster.members}
        started = time.monotonic()
        self._ends = started + self.config.seconds
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.inject)
            async with trio.open_nursery() as clients:
                for n in range(self.config.clients):
                    clients.start_soon(self.client, n)
            self._clients_done = time.monotonic()
        self.result.seconds = time.monotonic() - started
        return self.result

    # -- the checks ----------------------------------------------------------------------------

    def keys(self) -> set[str]:
        return {w.key for w in self.result.writes} | {self.shared_key(k) for k in range(self.config.shared_keys)}

    async def verify(self, revision_before: int) -> int:
        """The round's checks (failures go to `result.failures`); returns the settled revision."""
        c = self.cluster
        rows = await c.wait_settled(self.config.settle_s)
        self.result.settle_s = time.monotonic() - max(self._healed_at, self._clients_done)
        if self.result.settle_s > self.config.settle_bound_s:
            self.result.failures.append(f"not settled within {self.config.settle_bound_s:g} s of the last heal "
                                        f"({self.result.settle_s:.1f} s)")
        # The final reads, through the leader, go into the history too.
        leader = c.by_addr(next(r["id"] for r in rows.values() if r["role"] == "leader"))
        assert leader is not None
        async with httpx.AsyncClient() as http:
            for key in sorted(self.keys()):
                await self.read(http, leader, "final", key)
        said: dict[str, list[str]] = {}
        for m in c.members:
            with m.log.open("rb") as f:
                f.seek(self._log_sizes.get(m.name, 0))
                said[m.name] = f.read().decode(errors="replace").splitlines()
        return judge(self.result, rows, revision_before, self.keys(), said, self.config)

    async def cleanup(self) -> None:
        """Remove the round's models (through the leader, a few at once): the next rounds stay small."""
        leader = await self.cluster.leader()
        if leader is None:
            return
        keys = sorted(self.keys())
        async with httpx.AsyncClient() as http:
            async def remove(chunk: list[str]) -> None:
                for key in chunk:
                    try:
                        await http.delete(leader.url + f"/api/v1/models/{key}", headers=self.cluster.headers,
                                          timeout=self.config.try_s)
                    except httpx.HTTPError:
                        pass
            async with trio.open_nursery() as nursery:
                for i in range(4):
                    nursery.start_soon(remove, keys[i::4])


NET_FAULT_STEPS: dict[str, Callable[[Round], Awaitable[None]]] = {
    "partition-leader": lambda r: r.partition("leader"),
    "partition-standby": lambda r: r.partition("standby"),
    "partition-one-way": lambda r: r.partition(r.rng.choice(("leader", "standby")), r.rng.choice(("in", "out"))),
    "partition-bridge": Round.partition_bridge,
    "net-flaky": Round.net_flaky,
    "clock-jump": Round.clock_jump,
    "power-loss": Round.power_loss,
    "bitflip": Round.bitflip,
    "member-change": Round.member_change,
    "overlap": Round.overlap,
}
assert set(NET_FAULT_STEPS) == set(NET_FAULTS)


def judge(res: RoundResult, rows: dict[str, dict[str, Any]], revision_before: int, keys: set[str],
          said: dict[str, list[str]], config: RoundConfig) -> int:
    """The checks of a round whose members settled as `rows` (`GET /api/v1/cluster/members`), with
    the final reads (client "final") in `res.reads` and what each member logged (`said`) during
    it. Failures go to `res.failures`; returns the settled revision."""
    revision = int(next(iter(rows.values()))["revision"])
    if len({r["state_hash"] for r in rows.values()}) != 1:
        res.failures.append(f"members at revision {revision} differ: "
                            + ", ".join(f"{a}: {r['state_hash']}" for a, r in sorted(rows.items())))
    final = {r.key: r.value for r in res.reads if r.client == "final"}
    missing = sorted(keys - set(final))
    if missing:
        res.failures.append(f"final reads got no answer for {missing[:5]}")
    for w in res.writes:
        if w.unique:
            got = final.get(w.key, "(no answer)")
            if w.outcome == "ok" and got != w.value:
                res.failures.append(f"LOST: acknowledged write {w.key}={w.value} reads {got!r} at the end "
                                    f"(tries: {w.tries})")
            if w.outcome == "refused" and got is not None:
                res.failures.append(f"a write refused at every try is there: {w.key}={got!r} (tries: {w.tries})")
    if res.unknown:
        res.failures.append(f"{res.unknown} writes stayed of unknown outcome after {config.resolve_s:g} s of "
                            f"retries: " + "; ".join(f"{w.key}={w.value} {w.tries}" for w in res.writes
                                                     if w.outcome == "unknown")[:2000])
    res.revision_delta = revision - revision_before
    # A membership change (remove, add) may move the revision or not: the member's record goes when it is
    # removed, and a rejoined member announces itself again only if its record says otherwise.
    own = sum(1 for lines in said.values() for line in lines if any(w in line for w in _OWN_WRITES))
    low, high = res.acked, res.acked + 2 * res.changes + res.unknown + own
    if not low <= res.revision_delta <= high:
        what = "DUPLICATED" if res.revision_delta > high else "LOST"
        res.failures.append(f"{what}: the revision moved by {res.revision_delta} ({revision_before} -> {revision}) "
                            f"for {res.acked} acknowledged writes, {res.changes} membership changes, {own} of the "
                            f"members' own writes and {res.unknown} writes of unknown outcome; the acknowledged: "
                            + "; ".join(f"{w.key}={w.value} {w.tries}" for w in res.writes if w.outcome == "ok")[:3000])
    for name, lines in sorted(said.items()):  # what pysyncobj says when a follower cut entries it had applied
        cut = [line for line in lines if _DIVERGED in line]
        if cut:
            res.failures.append(f"member {name} truncated applied entries ({len(cut)} times): {cut[0]}")
    verdict = check(KV_MODEL, res.history(), timeout=config.check_s)
    if verdict.verdict is not Verdict.OK:
        res.failures.append(f"linearizability: {verdict.explanation}")
    return revision


@dataclass
class FaultTally:
    """One fault kind's rounds in a campaign."""

    rounds: int = 0
    acked: int = 0
    reads: int = 0
    lost: int = 0
    duplicated: int = 0
    nonlinearizable: int = 0
    diverged: int = 0
    unsettled: int = 0
    failed: int = 0
    settle: list[float] = field(default_factory=list)
    failovers: list[float] = field(default_factory=list)


def _kind(failure: str) -> str:
    for prefix, kind in (("LOST", "lost"), ("DUPLICATED", "duplicated"), ("linearizability", "nonlinearizable"),
                         ("members at revision", "diverged"), ("not settled", "unsettled")):
        if failure.startswith(prefix):
            return kind
    return ""


@dataclass
class Summary:
    rounds: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    acked: int = 0
    reads: int = 0
    lost: int = 0
    duplicated: int = 0
    unknown: int = 0  # writes whose outcome stayed unknown
    unknown_tries: int = 0  # tries of unknown outcome, resolved by a retry under the same key
    nonlinearizable: int = 0
    diverged: int = 0
    unsettled: int = 0
    failovers: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    by_fault: dict[str, FaultTally] = field(default_factory=dict)

    def add(self, res: RoundResult) -> None:
        tally = self.by_fault.setdefault(res.fault, FaultTally())
        self.rounds += 1
        tally.rounds += 1
        self.faults[res.fault] += 1
        self.acked += res.acked
        tally.acked += res.acked
        self.reads += len(res.reads)
        tally.reads += len(res.reads)
        self.unknown += res.unknown
        self.unknown_tries += sum(w.unknown_tries for w in res.writes)
        for f in res.failures:
            kind = _kind(f)
            if kind:
                setattr(self, kind, getattr(self, kind) + 1)
                setattr(tally, kind, getattr(tally, kind) + 1)
        tally.failed += bool(res.failures)
        if res.failover_s is not None:
            self.failovers.append(res.failover_s)
            tally.failovers.append(res.failover_s)
        if res.settle_s is not None:
            tally.settle.append(res.settle_s)
        self.failures += [f"round {res.number} ({res.fault}): {f}" for f in res.failures]

    def to_doc(self) -> dict[str, Any]:
        """The summary as JSON-able data (a runner's child hands it to its parent this way)."""
        # not asdict(self): it rebuilds a Counter from (key, value) pairs, counting the pairs
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "faults": dict(self.faults),
                "by_fault": {k: asdict(v) for k, v in self.by_fault.items()}}

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> Summary:
        return cls(**{**doc, "faults": Counter(doc["faults"]),
                      "by_fault": {k: FaultTally(**v) for k, v in doc["by_fault"].items()}})

    def merge(self, other: Summary) -> None:
        """Fold another campaign's summary (another cluster, another seed) into this one."""
        for name in ("rounds", "acked", "reads", "lost", "duplicated", "unknown", "unknown_tries",
                     "nonlinearizable", "diverged", "unsettled"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.faults.update(other.faults)
        self.failovers += other.failovers
        self.failures += other.failures
        for kind, theirs in other.by_fault.items():
            mine = self.by_fault.setdefault(kind, FaultTally())
            for name, value in asdict(theirs).items():
                setattr(mine, name, getattr(mine, name) + value)

    def lines(self) -> list[str]:
        fo = sorted(self.failovers)
        failover = (f"p50 {statistics.median(fo):.2f} s, p99 {pct(fo, 0.99):.2f} s, max {fo[-1]:.2f} s over "
                    f"{len(fo)} leader kills and cuts" if fo else "no leader was killed or cut")
        return [
            f"rounds:                    {self.rounds}",
            "faults:                    " + ", ".join(f"{k} {n}" for k, n in sorted(self.faults.items())),
            f"acknowledged writes:       {self.acked}",
            f"reads:                     {self.reads}",
            f"lost:                      {self.lost}",
            f"duplicated:                {self.duplicated}",
            f"unknown outcomes:          {self.unknown} (tries of unknown outcome resolved by a retry: "
            f"{self.unknown_tries})",
            f"not linearizable:          {self.nonlinearizable}",
            f"diverged state hashes:     {self.diverged}",
            f"not settled in time:       {self.unsettled}",
            f"failover (fault -> commit): {failover}",
        ]

    def table(self) -> list[str]:
        """A row per fault kind: rounds, what was checked, and the times (markdown)."""
        def times(values: list[float]) -> str:
            return f"{statistics.median(values):.2f} / {max(values):.2f}" if values else "-"

        rows = ["| fault | rounds | acknowledged | reads | lost | duplicated | not linearizable | diverged | "
                "failed rounds | settle after heal p50 / max (s) | failover p50 / max (s) |",
                "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for kind, t in sorted(self.by_fault.items()):
            rows.append(f"| {kind} | {t.rounds} | {t.acked} | {t.reads} | {t.lost} | {t.duplicated} | "
                        f"{t.nonlinearizable} | {t.diverged} | {t.failed} | {times(t.settle)} | {times(t.failovers)} |")
        return rows


async def campaign(cluster: Cluster, rounds: int, seed: int, config: RoundConfig = RoundConfig(), *,
                   stop_at_failure: bool = True, on_round: Callable[[RoundResult], None] | None = None,
                   faults: tuple[str, ...] = FAULTS) -> Summary:
    """Run `rounds` rounds on a started cluster (the same `seed`, the same faults and operations in
    the same order); `on_round(result)` is called after each. Stops after a failed round unless
    `stop_at_failure` is false; the failures are in the summary. `faults`: the kinds drawn from
    (NET_FAULTS need a cluster made with a Fabric and failpoints)."""
    rng = random.Random(seed)
    summary = Summary()
    revision = int(next(iter((await cluster.wait_settled(config.settle_s)).values()))["revision"])
    kinds: list[str] = []
    for number in range(1, rounds + 1):
        if not kinds:  # every kind of fault as often as the others, in a shuffled order
            kinds = rng.sample(faults, len(faults))
        rnd = Round(cluster, number, rng, config, fault=kinds.pop())
        res = await rnd.run()
        await rnd.verify(revision)
        summary.add(res)
        if on_round is not None:
            on_round(res)
        if res.failures and stop_at_failure:
            break
        if config.cleanup:
            await rnd.cleanup()
        revision = int(next(iter((await cluster.wait_settled(config.settle_s)).values()))["revision"])
    return summary


