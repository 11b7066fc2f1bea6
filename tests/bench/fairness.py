"""Fairness benchmark (issue 22, point 2): one key floods a model at 10x its share; how long does another key's
request take, against its time with no flood? Prints a table.

Run: `.venv/bin/python tests/bench/fairness.py [--seconds 8] [--slots 4] [--service-ms 250] [--jitter 0.5]`

One trio program on loopback: the real gateway (`serve`, in process) in front of an in-process engine with
`--slots` parallel slots and `--service-ms` per answer, give or take `--jitter` of it (drawn from a seeded
generator: the same times in every run; answers' lengths vary, and with none at all the slots free in
lockstep, so a request that just missed them waits one whole answer: 2x by construction); beyond its slots
the engine queues first come first served, as llama.cpp and vLLM do. Two client keys of the same class: A opens requests at 10x its fair
share (half the replica's capacity: 5x the capacity in all), B at a steady quarter of the capacity, both
open loop (a request is sent on schedule whether or not the earlier ones were answered). Three runs:
- unloaded: B alone;
- FIFO (today's behaviour): the model leaves `limits.concurrency_per_replica` unset, so the gateway sends
  up to 256 requests at once and the engine's own first-come queue decides;
- fair queue: `limits.concurrency_per_replica` = the engine's slots, so the gateway holds the rest and serves
  keys by turns (llmgw/gateway/fairqueue.py).
B's figures are its whole request time (its wait for a slot plus the answer: with no flood the wait is ~0,
so the ratio is taken on the whole time); the goal is B's p99 with the flood within 2x of unloaded with the
fair queue. A's answered and refused (503 overloaded: its class's queue bound) are shown too.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from llmgw.domain import commands  # noqa: E402
from llmgw.domain.keys import hash_key  # noqa: E402
from llmgw.domain.model import ModelDef  # noqa: E402
from llmgw.domain.observed import Endpoint, ModelRoute  # noqa: E402
from llmgw.gateway.app import GatewayDeps, serve  # noqa: E402
from llmgw.gateway.router import Router  # noqa: E402
from llmgw.testing import MemoryStore  # noqa: E402
from llmgw.testing.scripted_engine import Reply, Request, ScriptedEngine  # noqa: E402
from llmgw.testing.scripted_engine import serving as scripted  # noqa: E402
from tests.support.figures import pct, print_table  # noqa: E402

A, B = "sk-bench-flood", "sk-bench-steady"
FLOOD_X = 10.0  # A's rate over its fair share
GOAL_RATIO = 2.0
ANSWER = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
                     "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()


@dataclass
class Run:
    name: str
    b_ms: list[float] = field(default_factory=list)
    a_ok: int = 0
    a_refused: int = 0
    other: int = 0  # anything else (should stay 0)


async def scenario(name: str, *, seconds: float, slots: int, service_s: float, jitter: float, flood: bool,
                   fair: bool) -> Run:
    run = Run(name)
    capacity = slots / service_s  # answers per second
    engine_slots = trio.Semaphore(slots)  # trio's semaphore is first come, first served: an engine's queue
    draw = random.Random(22)

    async def answer(request: Request, reply: Reply) -> None:
        async with engine_slots:
            await trio.sleep(service_s * (1 + jitter * (2 * draw.random() - 1)))
        try:
            await reply.whole(200, ANSWER)
        except trio.BrokenResourceError:  # the gateway let go of it (the run ended under it)
            pass

    async with trio.open_nursery() as nursery:
        limits = {"concurrency_per_replica": slots} if fair else {}
        store = MemoryStore()
        store.submit_nowait(commands.put_model(ModelDef.from_doc(
            {"name": "m", "engine": "sim", "source": "sim://m", "limits": limits}), at=0.0))
        store.submit_nowait(commands.add_key(hash_key(A), "flood", "client", 0.0))
        store.submit_nowait(commands.add_key(hash_key(B), "steady", "client", 0.0))
        router = Router()
        url = await scripted(nursery, ScriptedEngine(answer))
        router.update_routes({"m": ModelRoute("m", "chat", "ready", (Endpoint("m-r1", url),))})
        host, port = await nursery.start(partial(serve, "127.0.0.1", 0, GatewayDeps(router=router, state=store)))

        async def one(key: str) -> None:
            started = trio.current_time()
            status, answer = await post(host, port, key)
            if key == B and status == 200:
                run.b_ms.append((trio.current_time() - started) * 1000)
            elif key == A and status == 200:
                run.a_ok += 1
            elif key == A and status == 503 and b'"overloaded"' in answer:
                run.a_refused += 1
            else:
                run.other += 1

        async def steady(key: str, rate: float, clients: trio.Nursery) -> None:
            start = trio.current_time()
            n = 0
            while (at := start + n / rate) < start + seconds:
                await trio.sleep_until(at)
                clients.start_soon(one, key)
                n += 1

        async with trio.open_nursery() as clients:
            b_rate = capacity / 4
            if flood:
                a_rate = FLOOD_X * capacity / 2
                clients.start_soon(steady, A, a_rate, clients)
                await trio.sleep(min(1.0, seconds / 4))  # the flood's backlog builds first
            await steady(B, b_rate, clients)
            # B's last requests are answered; A's backlog is not waited for.
            while len(run.b_ms) < int(seconds * b_rate) - 1:
                await trio.sleep(0.05)
            clients.cancel_scope.cancel()
        nursery.cancel_scope.cancel()
    return run


BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()


async def post(host: str, port: int, key: str) -> tuple[int, bytes]:
    """One chat request on its own connection, closed after the answer: (status, the whole answer). A bare
    client, so the clients' cost stays flat with a thousand requests open (httpx's pool scans them all)."""
    stream = await trio.open_tcp_stream(host, port)
    async with stream:
        await stream.send_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer %s\r\n"
                              b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s"
                              % (key.encode(), len(BODY), BODY))
        data = bytearray()
        while chunk := await stream.receive_some(65536):
            data += chunk
    status = int(data[9:12]) if data.startswith(b"HTTP/1.1 ") else 0
    return status, bytes(data)


def measure(seconds: float, slots: int, service_s: float, jitter: float) -> dict[str, Run]:
    """The three runs, each on a fresh gateway and engine."""
    runs = {}
    for name, flood, fair in (("unloaded", False, True), ("FIFO (today)", True, False), ("fair queue", True, True)):
        runs[name] = trio.run(partial(scenario, name, seconds=seconds, slots=slots, service_s=service_s,
                                      jitter=jitter, flood=flood, fair=fair))
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=8.0, help="how long B sends in each run")
    ap.add_argument("--slots", type=int, default=4, help="the engine's parallel slots")
    ap.add_argument("--service-ms", type=float, default=250.0, help="each answer's mean time in a slot")
    ap.add_argument("--jitter", type=float, default=0.5, help="each answer's time varies by up to this share")
    args = ap.parse_args()
    runs = measure(args.seconds, args.slots, args.service_ms / 1000, args.jitter)
    base = pct(runs["unloaded"].b_ms, 0.99)
    rows = [["run", "B requests", "B p50 ms", "B p99 ms", "B p99 / unloaded", "A answered", "A refused", "other"]]
    for run in runs.values():
        p99 = pct(run.b_ms, 0.99)
        rows.append([run.name, str(len(run.b_ms)), f"{pct(run.b_ms, 0.5):.1f}", f"{p99:.1f}", f"{p99 / base:.2f}x",
                     str(run.a_ok), str(run.a_refused), str(run.other)])
    print(f"engine: {args.slots} slots, {args.service_ms:g} ms per answer (+-{args.jitter:.0%}); A floods at {FLOOD_X:g}x its share, "
          f"B at a quarter of the capacity; {args.seconds:g} s each")
    print_table(rows)
    ratio = pct(runs["fair queue"].b_ms, 0.99) / base
    print(("PASS" if ratio <= GOAL_RATIO else "FAIL") + f": with the fair queue B's p99 is {ratio:.2f}x its unloaded "
          f"p99 (goal <= {GOAL_RATIO:g}x)")


if __name__ == "__main__":
    main()
