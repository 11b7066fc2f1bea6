"""The gateway's upstream client alone: CPU per call of httpx (one AsyncClient, as the gateway had) against the
pool over h11 (llmgw/gateway/pool.py), on the same sim engine, at concurrency 1 and 256.

Run: `.venv/bin/python tests/bench/gateway_client.py [--calls 3000]`. The sim engine runs in its own process;
this process's CPU time (time.process_time) over the calls, divided by their number, is the client's cost.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import trio

from llmgw.gateway.pool import Pool
from llmgw.gateway.upstream import send

ROOT = Path(__file__).resolve().parents[2]
PATH = "/v1/chat/completions"
BODY = b'{"model":"bench","messages":[{"role":"user","content":"how fast is the client"}],"max_tokens":4}'


async def _run(calls: int, concurrency: int, one: Callable[[], Awaitable[None]]) -> float:
    remaining = calls

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            await one()

    cpu = time.process_time()
    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker)
    return (time.process_time() - cpu) * 1000 / calls


async def _bench(url: str, calls: int) -> None:
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=1000)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        async def via_httpx() -> None:
            request = client.build_request("POST", url + PATH, content=BODY,
                                           headers={"content-type": "application/json"})
            response = await client.send(request, stream=True)
            await response.aread()
            await response.aclose()

        pool = Pool()

        async def via_pool() -> None:
            response = await send(pool, url, PATH, BODY, "req-bench", limit=1000, queue=1000)
            await response.read()
            response.close()

        print(f"{'client CPU ms per call':<26}{'c=1':>8}{'c=256':>8}")
        for name, one in (("httpx.AsyncClient", via_httpx), ("pool.py over h11", via_pool)):
            await _run(200, 16, one)  # warm up
            figures = [await _run(calls, c, one) for c in (1, 256)]
            print(f"{name:<26}" + "".join(f"{f:>8.3f}" for f in figures))
        pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    opts = parser.parse_args()
    engine = subprocess.Popen([sys.executable, "-m", "llmgw.engines.sim", "--host", "127.0.0.1", "--port", "0",
                               "--model", "bench"], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        assert engine.stderr is not None
        url = next(line.split("listening on ", 1)[1].split()[0] for line in engine.stderr if "listening on " in line)
        trio.run(_bench, url, opts.calls)
    finally:
        engine.terminate()
        engine.wait(10)


if __name__ == "__main__":
    main()
