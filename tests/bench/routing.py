"""What one routing decision costs the gateway at 64 replicas, affinity and priorities on (issue 22, point 7:
at most 20 µs), beside the decision the gateway made before them, in the same run.

Run: `.venv/bin/python tests/bench/routing.py [--replicas 64] [--decisions 20000] [--rounds 5]`.

A decision, as the request path makes it once it has the model (llmgw/gateway/app.py):
- "before (least-outstanding, first come first served)": the router's pick and the pool's slot on that
  replica (`Router.acquire`, `Pool.acquire` without a ticket), then both released;
- "affinity + priority, a slot free": the request's affinity key (a chat request with a 1,500-character
  system prompt, `affinity_key`), the ring's pick with bounded load, and the pool's slot taken with the
  request's ticket (its key and class), then both released;
- "affinity + priority, replica full": the same, but the replica's slots are all busy and `--waiting`
  requests of four classes and `--keys` keys wait in its fair queue: the request takes its turn there and a
  release hands the slot to the next by class and turn (`FairQueue.push` and `pop`, what `Pool` does),
  measured per request queued and granted (trio's wake-up of a waiting task, the same in a first-come
  queue, is not counted).

Each figure is the median over `--rounds` of the mean over `--decisions`; a quarter of the replicas' worth
of requests is in flight throughout, spread by their own keys. The machine is shared: the ratios to the
first row are what to compare across runs.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from llmgw.domain.observed import Endpoint, ModelRoute  # noqa: E402
from llmgw.domain.priority import CLASSES  # noqa: E402
from llmgw.domain.timeouts import TIMEOUTS  # noqa: E402
from llmgw.gateway.affinity import affinity_key  # noqa: E402
from llmgw.gateway.fairqueue import FairQueue  # noqa: E402
from llmgw.gateway.pool import Pool, Ticket  # noqa: E402
from llmgw.gateway.router import Router  # noqa: E402
from tests.support.figures import print_table  # noqa: E402

GOAL_US = 20.0
DEADLINE = 1e9  # never reached: every replica is ready
WORDS = ("the of and to in is that for it as with was on be by at this which from or have an are not but "
         "had his they you were her she there been one all we their has would when if more no out so what").split()


def _text(rng: random.Random, chars: int) -> str:
    words = []
    while sum(len(w) + 1 for w in words) < chars:
        words.append(rng.choice(WORDS))
    return " ".join(words)[:chars]


def _router(replicas: int) -> Router:
    router = Router()
    endpoints = tuple(Endpoint(f"m-r{i}", f"http://127.0.0.{1 + i // 250}:{20000 + i}") for i in range(replicas))
    router.update_routes({"m": ModelRoute("m", "chat", "ready", endpoints)})
    return router


async def _decisions(replicas: int, decisions: int, keys: int, mode: str, waiting: int) -> float:
    """Microseconds per decision in `mode`: "before", "free" or "full"."""
    rng = random.Random(11)
    router = _router(replicas)
    pool = Pool()
    system = _text(rng, 1500)
    bodies = [{"model": "m", "messages": [{"role": "system", "content": system},
                                          {"role": "user", "content": f"conversation {i}: " + _text(rng, 200)}]}
              for i in range(256)]
    tickets = [Ticket(f"key_{i % keys}", i % len(CLASSES)) for i in range(256)]
    held = []  # some load: a quarter of the replicas' worth in flight
    for i in range(replicas // 4):
        lease = router.acquire("m", deadline=DEADLINE, affinity=affinity_key("chat", bodies[i], 4096))
        held.append((lease, await lease.__aenter__()))
    limit = 1 << 30
    if mode == "full":
        return _queued(router, bodies, tickets, decisions, waiting)
    start = time.perf_counter()
    for i in range(decisions):
        if mode == "before":
            lease = router.acquire("m", deadline=DEADLINE)
            endpoint = await lease.__aenter__()
            conn = await pool.acquire(endpoint.url, limit, 1024)
        else:
            body = bodies[i & 255]
            lease = router.acquire("m", deadline=DEADLINE, affinity=affinity_key("chat", body, 4096))
            endpoint = await lease.__aenter__()
            conn = await pool.acquire(endpoint.url, limit, (1024,) * len(CLASSES), tickets[i & 255])
        pool.release(conn, keep=False)
        await lease.__aexit__(None, None, None)
    return (time.perf_counter() - start) / decisions * 1e6


def _queued(router: Router, bodies: list[dict[str, object]], tickets: list[Ticket], decisions: int,
            waiting: int) -> float:
    """Per request on a full replica: its key, the ring's pick, its turn in the replica's fair queue (kept
    `waiting` long, four classes, the tickets' keys) and the grant that a release makes (`pop`): the
    scheduling work a queued request adds to the one it had in a first-come queue (trio's wake-up of
    the waiting task is the same either way, and not counted)."""
    queue: FairQueue[int] = FairQueue(TIMEOUTS.priority_promote_s, (1 << 30,) * len(CLASSES))
    now = 0.0
    for i in range(waiting):
        ticket = tickets[i & 255]
        queue.push(i, ticket.key, ticket.rank, now)
    start = time.perf_counter()
    for i in range(decisions):
        ticket = tickets[i & 255]
        slot = router._pick_nowait("m", None, affinity_key("chat", bodies[i & 255], 4096))
        assert slot is not None
        queue.push(i, ticket.key, ticket.rank, now)
        granted = queue.pop(now)
        assert granted is not None
        slot.release()
        now += 1e-4
    return (time.perf_counter() - start) / decisions * 1e6


def measure(replicas: int = 64, decisions: int = 20_000, keys: int = 50, rounds: int = 5,
            waiting: int = 1000) -> dict[str, float]:
    """Median microseconds per decision of each kind."""
    runs: dict[str, list[float]] = {"before": [], "free": [], "full": []}
    for _ in range(rounds):
        for mode in runs:  # interleaved: a slow moment of the machine falls on every kind alike
            runs[mode].append(trio.run(_decisions, replicas, decisions, keys, mode, waiting))
    return {mode: statistics.median(values) for mode, values in runs.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=64)
    parser.add_argument("--decisions", type=int, default=20_000, help="decisions timed per kind and round")
    parser.add_argument("--keys", type=int, default=50, help="distinct client keys among the requests")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--waiting", type=int, default=1000, help="requests queued on the full replica")
    opts = parser.parse_args(argv)
    result = measure(opts.replicas, opts.decisions, opts.keys, opts.rounds, opts.waiting)
    base = result["before"]
    names = {"before": "before (least-outstanding, first come first served)",
             "free": "affinity + priority, a slot free", "full": "affinity + priority, replica full (queued)"}
    rows = [["decision", "µs each", "vs before", f"goal ≤ {GOAL_US:g} µs"]]
    for mode, us in result.items():
        rows.append([names[mode], f"{us:.1f}", f"x{us / base:.2f}", "ok" if us <= GOAL_US else "OVER"])
    print(f"routing decision at {opts.replicas} replicas, {opts.keys} keys, median of {opts.rounds} rounds")
    print_table(rows)


if __name__ == "__main__":
    main()
