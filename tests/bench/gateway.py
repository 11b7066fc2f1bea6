"""Gateway overhead benchmark (S12): the same requests straight to a sim engine and through the gateway.
Prints a table of latency percentiles, the latency the gateway adds, and req/s at a given concurrency.

Run: `.venv/bin/python tests/bench/gateway.py [--rounds N] [--requests N] [--concurrency 32]`.

The engine, the gateway and the load generator are three processes: a load
generator sharing the gateway's event loop would queue behind it and charge
its own cost to the gateway. Rounds interleave direct and gateway runs, so
drift on a busy machine hits both; each figure is the median over rounds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import httpx
import trio

KEY = "sk-bench"
MODEL = "bench"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "how fast is the gateway today"}], "max_tokens": 16}
ROOT = Path(__file__).resolve().parents[2]


# --- child: the gateway in its own process -------------------------------------------


async def _gateway_child(upstream: str, access_log: bool) -> None:
    from llmgw import logs
    from llmgw.domain import commands
    from llmgw.domain.keys import hash_key
    from llmgw.domain.model import ModelDef
    from llmgw.domain.observed import Endpoint, ModelRoute
    from llmgw.gateway.app import GatewayDeps, serve
    from llmgw.gateway.router import Router
    from llmgw.testing import MemoryStore

    # As in production: one INFO line per request (to stderr, which the parent discards).
    logs.setup(level="INFO" if access_log else "WARNING")
    store = MemoryStore()
    model = ModelDef.from_doc({"name": MODEL, "engine": "sim", "source": "sim://bench"})
    store.submit_nowait(commands.put_model(model, at=0.0))
    store.submit_nowait(commands.add_key(hash_key(KEY), "bench", "client", 0.0))
    router = Router()
    router.update_routes({MODEL: ModelRoute(MODEL, "chat", "ready", (Endpoint("bench-r1", upstream),))})
    async with trio.open_nursery() as nursery:
        host, port = await nursery.start(partial(serve, "127.0.0.1", 0, GatewayDeps(router=router, state=store)))
        print(f"READY http://{host}:{port}", flush=True)


# --- parent: processes and load ------------------------------------------------------------


def _start(args: list[str], ready_prefix: str, stream: str) -> tuple[subprocess.Popen[str], str]:
    """Start a child and return it with the URL from its first line starting `ready_prefix`."""
    proc = subprocess.Popen(
        args,
        cwd=ROOT,
        text=True,
        stdout=subprocess.PIPE if stream == "stdout" else subprocess.DEVNULL,
        stderr=subprocess.PIPE if stream == "stderr" else subprocess.DEVNULL,
    )
    pipe = proc.stdout if stream == "stdout" else proc.stderr
    assert pipe is not None
    deadline = time.monotonic() + 30
    for line in pipe:
        if ready_prefix in line:
            url = line.split(ready_prefix, 1)[1].split()[0]
            # Keep draining so a chatty child never blocks on a full pipe.
            threading.Thread(target=pipe.read, daemon=True).start()
            return proc, url
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise SystemExit(f"child {args} did not start")


@dataclass
class Round:
    direct: list[float]
    gateway: list[float]
    direct_rps: float
    gateway_rps: float
    engine_cpu_ms: float | None  # CPU time per request, from /proc (None where there is none)
    gateway_cpu_ms: float | None


def _cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _latencies(client: httpx.AsyncClient, url: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        response = await client.post(url, json=BODY)
        out.append((time.perf_counter() - t0) * 1000)
        if response.status_code != 200:
            raise SystemExit(f"{url} answered {response.status_code}: {response.text[:200]}")
    return out


async def _throughput(client: httpx.AsyncClient, url: str, n: int, concurrency: int) -> float:
    remaining = n
    failures = 0

    async def worker() -> None:
        nonlocal remaining, failures
        while remaining > 0:
            remaining -= 1
            response = await client.post(url, json=BODY)
            failures += response.status_code != 200

    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker)
    elapsed = time.perf_counter() - t0
    if failures:
        raise SystemExit(f"{failures} of {n} requests to {url} failed")
    return n / elapsed


def _per_request_ms(before: float | None, after: float | None, n: int) -> float | None:
    return None if before is None or after is None else (after - before) * 1000 / n


async def _load(direct: str, gateway: str, pids: tuple[int, int], opts: argparse.Namespace) -> list[Round]:
    limits = httpx.Limits(max_connections=opts.concurrency + 4, max_keepalive_connections=opts.concurrency + 4)
    headers = {"authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(limits=limits, headers=headers, timeout=30) as client:
        d_url, g_url = direct + "/v1/chat/completions", gateway + "/v1/chat/completions"
        for url in (d_url, g_url):  # warm connections, caches and code paths
            await _throughput(client, url, 4 * opts.concurrency, opts.concurrency)
        rounds = []
        for i in range(opts.rounds):
            d_lat = await _latencies(client, d_url, opts.requests)
            g_lat = await _latencies(client, g_url, opts.requests)
            d_rps = await _throughput(client, d_url, opts.load_requests, opts.concurrency)
            # The gateway run also loads the engine: its CPU per request is measured here, once per request.
            e_cpu, g_cpu = _cpu_s(pids[0]), _cpu_s(pids[1])
            g_rps = await _throughput(client, g_url, opts.load_requests, opts.concurrency)
            e_ms = _per_request_ms(e_cpu, _cpu_s(pids[0]), opts.load_requests)
            g_ms = _per_request_ms(g_cpu, _cpu_s(pids[1]), opts.load_requests)
            rounds.append(Round(d_lat, g_lat, d_rps, g_rps, e_ms, g_ms))
            print(
                f"  round {i + 1}/{opts.rounds}: p50 direct {_pct(d_lat, 50):.2f} ms,"
                f" gateway {_pct(g_lat, 50):.2f} ms; {d_rps:.0f} / {g_rps:.0f} req/s",
                file=sys.stderr,
                flush=True,
            )
        return rounds


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def _report(rounds: list[Round], opts: argparse.Namespace) -> None:
    def med(f: object) -> float:
        return statistics.median(f(r) for r in rounds)  # type: ignore[operator]

    d50, d99 = med(lambda r: _pct(r.direct, 50)), med(lambda r: _pct(r.direct, 99))
    g50, g99 = med(lambda r: _pct(r.gateway, 50)), med(lambda r: _pct(r.gateway, 99))
    a50 = med(lambda r: _pct(r.gateway, 50) - _pct(r.direct, 50))
    a99 = med(lambda r: _pct(r.gateway, 99) - _pct(r.direct, 99))
    d_rps, g_rps = med(lambda r: r.direct_rps), med(lambda r: r.gateway_rps)
    print()
    print(
        f"gateway overhead: {opts.rounds} rounds x {opts.requests} sequential requests,"
        f" {opts.load_requests} at concurrency {opts.concurrency}; {os.cpu_count()} CPUs; median of round figures"
    )
    print(f"{'':<22}{'p50 ms':>10}{'p99 ms':>10}")
    print(f"{'direct to engine':<22}{d50:>10.2f}{d99:>10.2f}")
    print(f"{'via gateway':<22}{g50:>10.2f}{g99:>10.2f}")
    print(f"{'added by gateway':<22}{a50:>10.2f}{a99:>10.2f}")
    print()
    print(f"{'req/s at c=' + str(opts.concurrency):<22}{'direct':>10}{'gateway':>10}{'ratio':>10}")
    print(f"{'':<22}{d_rps:>10.0f}{g_rps:>10.0f}{g_rps / d_rps:>10.2f}")
    if all(r.engine_cpu_ms is not None and r.gateway_cpu_ms is not None for r in rounds):
        # Less sensitive to a busy machine than wall-clock figures: what one request costs each process.
        e_cpu, g_cpu = med(lambda r: r.engine_cpu_ms), med(lambda r: r.gateway_cpu_ms)
        print()
        print(f"{'CPU ms per request':<22}{'engine':>10}{'gateway':>10}{'gw req/s':>10}")
        print(f"{'':<22}{e_cpu:>10.2f}{g_cpu:>10.2f}{1000 / g_cpu:>10.0f}  (gw req/s: one core's worth)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=200, help="sequential requests per round and side (latency)")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--load-requests", type=int, default=400, help="requests per round and side at --concurrency")
    parser.add_argument("--no-access-log", action="store_true", help="run the gateway at WARNING (no request lines)")
    parser.add_argument("--child-gateway", metavar="UPSTREAM", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child_gateway:
        trio.run(_gateway_child, opts.child_gateway, not opts.no_access_log)
        return

    py = sys.executable
    engine, gateway = None, None
    try:
        engine, direct = _start(
            [py, "-m", "llmgw.engines.sim", "--host", "127.0.0.1", "--port", "0", "--model", MODEL],
            "listening on ",
            "stderr",
        )
        child = [py, str(Path(__file__).resolve()), "--child-gateway", direct]
        if opts.no_access_log:
            child.append("--no-access-log")
        gateway, via = _start(child, "READY ", "stdout")
        print(f"engine {direct}, gateway {via}", file=sys.stderr)
        rounds = trio.run(_load, direct, via, (engine.pid, gateway.pid), opts)
    finally:
        for proc in (gateway, engine):
            if proc is not None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
    _report(rounds, opts)


if __name__ == "__main__":
    main()
