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
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
import trio

from tests.support.cluster import Cluster, Member
from tests.support.linearizability import KV_MODEL, KvInput, KvOutput, Operation, Verdict, check, get, put

FAULTS = ("kill-leader", "kill-standby", "pause-leader", "pause-standby", "restart-all")
Outcome = Literal["ok", "refused", "unknown"]
_DIVERGED = "state machine may have diverged"  # pysyncobj's word for a follower that cut applied entries
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
            self.result.reads.append(Read(client, key, call, ret, source.removeprefix("sim://")))
        elif r.status_code == 404 and r.json().get("error", {}).get("code") == "model_not_found":
            self.result.reads.append(Read(client, key, call, ret, None))

    # -- the round -----------------------------------------------------------------------------

    def shared_key(self, k: int) -> str:
        return f"r{self.number}-{k}"

    async def client(self, n: int) -> None:
        rng = random.Random(self.client_seeds[n])
        written = 0
        mine: list[str] = []
        async with httpx.AsyncClient() as http:
            while time.monotonic() < self._ends:
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
        """The round's fault, at a random moment; healed (restarted, resumed) before it returns."""
        c, rng = self.cluster, self.rng
        await trio.sleep(rng.uniform(0.15, 0.5) * self.config.seconds)
        kind = self.fault
        if kind == "restart-all":
            await trio.sleep(0)
            c.kill_all()
            await trio.sleep(rng.uniform(0.0, 0.3))
            for m in c.members:
                c.start_member(m)
            return
        leader = await c.leader()
        if kind.endswith("-leader"):
            target = leader
            if target is None:  # mid-election: any member, named for what it was
                target = rng.choice(c.members)
                self.fault = self.result.fault = kind.replace("leader", "standby")
        else:
            others = [m for m in c.members if m is not leader]
            target = rng.choice(others)
        if kind.startswith("kill"):
            c.kill(target)
            if self.result.fault == "kill-leader":
                self._killed_at = time.monotonic()
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self.probe_failover, [m for m in c.members if m is not target])
                    await trio.sleep(rng.uniform(0.2, 1.0))
                    c.start_member(target)
            else:
                await trio.sleep(rng.uniform(0.2, 1.0))
                c.start_member(target)
        else:
            c.pause(target)
            await trio.sleep(rng.uniform(0.3, 2.5))
            c.resume(target)

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
            for n in range(self.config.clients):
                nursery.start_soon(self.client, n)
        self.result.seconds = time.monotonic() - started
        return self.result

    # -- the checks ----------------------------------------------------------------------------

    def keys(self) -> set[str]:
        return {w.key for w in self.result.writes} | {self.shared_key(k) for k in range(self.config.shared_keys)}

    async def verify(self, revision_before: int) -> int:
        """The round's checks (failures go to `result.failures`); returns the settled revision."""
        c = self.cluster
        rows = await c.wait_settled(self.config.settle_s)
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
    low, high = res.acked, res.acked + res.unknown
    if not low <= res.revision_delta <= high:
        what = "DUPLICATED" if res.revision_delta > high else "LOST"
        res.failures.append(f"{what}: the revision moved by {res.revision_delta} ({revision_before} -> {revision}) "
                            f"for {res.acked} acknowledged writes and {res.unknown} of unknown outcome")
    for name, lines in sorted(said.items()):  # what pysyncobj says when a follower cut entries it had applied
        cut = [line for line in lines if _DIVERGED in line]
        if cut:
            res.failures.append(f"member {name} truncated applied entries ({len(cut)} times): {cut[0]}")
    verdict = check(KV_MODEL, res.history(), timeout=config.check_s)
    if verdict.verdict is not Verdict.OK:
        res.failures.append(f"linearizability: {verdict.explanation}")
    return revision


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
    failovers: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def add(self, res: RoundResult) -> None:
        self.rounds += 1
        self.faults[res.fault] += 1
        self.acked += res.acked
        self.reads += len(res.reads)
        self.unknown += res.unknown
        self.unknown_tries += sum(w.unknown_tries for w in res.writes)
        for f in res.failures:
            self.lost += f.startswith("LOST")
            self.duplicated += f.startswith("DUPLICATED")
            self.nonlinearizable += f.startswith("linearizability")
            self.diverged += f.startswith("members at revision")
        if res.failover_s is not None:
            self.failovers.append(res.failover_s)
        self.failures += [f"round {res.number} ({res.fault}): {f}" for f in res.failures]

    def lines(self) -> list[str]:
        fo = sorted(self.failovers)
        failover = (f"p50 {statistics.median(fo):.2f} s, max {fo[-1]:.2f} s over {len(fo)} leader kills"
                    if fo else "no leader was killed")
        return [
            f"rounds:                    {self.rounds}",
            "faults:                    " + ", ".join(f"{k} {self.faults[k]}" for k in FAULTS),
            f"acknowledged writes:       {self.acked}",
            f"reads:                     {self.reads}",
            f"lost:                      {self.lost}",
            f"duplicated:                {self.duplicated}",
            f"unknown outcomes:          {self.unknown} (tries of unknown outcome resolved by a retry: "
            f"{self.unknown_tries})",
            f"not linearizable:          {self.nonlinearizable}",
            f"diverged state hashes:     {self.diverged}",
            f"failover (kill -> commit): {failover}",
        ]


async def campaign(cluster: Cluster, rounds: int, seed: int, config: RoundConfig = RoundConfig(), *,
                   stop_at_failure: bool = True, on_round: Callable[[RoundResult], None] | None = None) -> Summary:
    """Run `rounds` rounds on a started cluster (the same `seed`, the same faults and operations in
    the same order); `on_round(result)` is called after each. Stops after a failed round unless
    `stop_at_failure` is false; the failures are in the summary."""
    rng = random.Random(seed)
    summary = Summary()
    revision = int(next(iter((await cluster.wait_settled(config.settle_s)).values()))["revision"])
    kinds: list[str] = []
    for number in range(1, rounds + 1):
        if not kinds:  # every kind of fault as often as the others, in a shuffled order
            kinds = rng.sample(FAULTS, len(FAULTS))
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


