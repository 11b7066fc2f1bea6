"""The gateway past its capacity: every request gets an answer (200, or `overloaded` 503 at once),
none times out, and the 503s stay fast.

One slow sim replica (each request ~0.2 s upstream), the gateway in its own process with
`gateway.upstream_connections_per_replica` = C and `gateway.upstream_queue_per_replica` = Q, and
`wrk` (Debian's C load generator) holding 4 x (C + Q) connections open: four times what the replica
and its queue can take. wrk is closed-loop, so a client refused at once asks again at once: the
refusals come far faster than 4x the capacity, a harsher test than an open-loop 4x load.

Latency per status comes from the gateway's own request log (each record has its status and its
latency inside the gateway, from request start to answer): wrk reports latency over all answers only.

    .venv/bin/python tests/bench/gateway_overload.py [--connections 8] [--queue 8] [--duration 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from functools import partial
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from gateway_concurrency import KEY, MODEL, _start, _wrk  # noqa: E402

GOAL_503_P99_MS = 50.0


async def _gateway_child(upstream: str, connections: int, queue: int, log_dir: str) -> None:
    from llmgw import logs
    from llmgw.domain import commands
    from llmgw.domain.keys import hash_key
    from llmgw.domain.model import ModelDef
    from llmgw.domain.observed import Endpoint, ModelRoute
    from llmgw.gateway.app import GatewayDeps, serve
    from llmgw.gateway.requestlog import RequestLog
    from llmgw.gateway.router import Router
    from llmgw.testing import MemoryStore

    logs.setup(level="WARNING")
    store = MemoryStore()
    store.submit_nowait(commands.put_model(ModelDef.from_doc({"name": MODEL, "engine": "sim", "source": "sim://b"}),
                                           at=0.0))
    store.submit_nowait(commands.add_key(hash_key(KEY), "bench", "client", 0.0))
    store.submit_nowait(commands.put_setting("gateway.upstream_connections_per_replica", connections, at=0.0))
    store.submit_nowait(commands.put_setting("gateway.upstream_queue_per_replica", queue, at=0.0))
    router = Router()
    router.update_routes({MODEL: ModelRoute(MODEL, "chat", "ready", (Endpoint("bench-r1", upstream),))})
    deps = GatewayDeps(router=router, state=store, requestlog=RequestLog(Path(log_dir), "bench"))
    async with trio.open_nursery() as nursery:
        host, port = await nursery.start(partial(serve, "127.0.0.1", 0, deps))
        print(f"READY http://{host}:{port}", flush=True)


def _records(log_dir: Path) -> list[dict[str, object]]:
    found = []
    for path in sorted(log_dir.rglob("*")):
        if not path.is_file():
            continue
        for line in path.read_bytes().splitlines():
            _, _, doc = line.partition(b" ")
            try:
                record = json.loads(doc)
            except ValueError:
                continue
            if isinstance(record, dict) and "status" in record:
                found.append(record)
    return found


def _p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98] if len(values) >= 2 else (values[0] if values else float("nan"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--queue", type=int, default=8)
    parser.add_argument("--duration", type=int, default=10)
    parser.add_argument("--clients", type=int, default=0, help="wrk connections (default: 4 x (connections + queue))")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        upstream, connections, queue, log_dir = args.child
        trio.run(_gateway_child, upstream, int(connections), int(queue), log_dir)
        return 0
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory() as tmp:
        log_dir = Path(tmp) / "log"
        engine, engine_url = _start([sys.executable, "-m", "llmgw.engines.sim", "--host", "127.0.0.1", "--port", "0",
                                     "--model", MODEL, "--tokens-per-s", "20"], "listening on ", "stderr", env)
        gateway, gateway_url = _start([sys.executable, __file__, "--child", engine_url, str(args.connections),
                                       str(args.queue), str(log_dir)], "READY ", "stdout", env)
        script = Path(tmp) / "post.lua"
        body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        script.write_text(f'wrk.method = "POST"\nwrk.body = {json.dumps(body)}\n'
                          f'wrk.headers["Content-Type"] = "application/json"\n'
                          f'wrk.headers["Authorization"] = "Bearer {KEY}"\n')
        clients = args.clients or 4 * (args.connections + args.queue)
        try:
            run = _wrk(gateway_url + "/v1/chat/completions", clients, args.duration, str(script), gateway.pid)
        finally:
            for proc in (gateway, engine):
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
        records = _records(log_dir)
    ok = [float(str(r["latency_ms"])) for r in records if r["status"] == 200]
    refused = [float(str(r["latency_ms"])) for r in records if r["status"] == 503 and r.get("error") == "overloaded"]
    other = len(records) - len(ok) - len(refused)
    print(f"\noverload: 1 sim replica (~0.2 s per request), {args.connections} connections + {args.queue} queued, "
          f"wrk -c{clients} for {args.duration} s (closed loop)")
    print(f"{'':<28}{'answers':>10}{'p50 ms':>10}{'p99 ms':>10}")
    print(f"{'200 (served)':<28}{len(ok):>10}{statistics.median(ok) if ok else float('nan'):>10.1f}{_p99(ok):>10.1f}")
    print(f"{'503 overloaded (refused)':<28}{len(refused):>10}"
          f"{statistics.median(refused) if refused else float('nan'):>10.2f}{_p99(refused):>10.2f}")
    print(f"{'anything else':<28}{other:>10}")
    print(f"wrk: {run.requests} answers, {run.timeouts} timeouts, {run.rps:.0f} req/s; gateway CPU "
          f"{run.cpu_ms:.2f} ms per answer (request log lines: {len(records)}; a full log queue drops, see docs)")
    passed = run.timeouts == 0 and other == 0 and refused and _p99(refused) < GOAL_503_P99_MS
    print(("PASS" if passed else "FAIL") + f": no timeout, only 200 or 503, p99 of the 503s under {GOAL_503_P99_MS:g} ms")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
