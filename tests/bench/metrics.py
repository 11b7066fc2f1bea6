"""What metrics cost: the gateway's CPU per request with its counters on and off, one `RequestMetrics.count`
alone, and one scrape of each role at fleet scale (1,000 nodes, 2,000 models). Prints a table.

Run: `.venv/bin/python tests/bench/metrics.py [--requests 20000] [--rounds 5] [--nodes 1000] [--models 2000]`.

The gateway is the real app (`make_app`), driven in-process through ASGI by a tight loop (no sockets: the
figure is the app's own CPU, where the counters live); requests are `GET /v1/models` with a client key and
a chat completion for an unknown model (404), both through the whole request path and the request log's
record. Rounds alternate off and on; each figure is the median over rounds. The control plane's scrape
builds the status summary from a state and observations made in memory, then its families and their text;
the gateway's copies its counters (on its loop) and renders them (in a worker thread), and the loop's
longest pause while it does is measured with a task that only yields.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from typing import Any

import trio

from llmgw.domain import commands, summary
from llmgw.domain.keys import hash_key
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import Gpu, NodeInfo, Observed, ReplicaObs
from llmgw.domain.state import ClusterState
from llmgw.domain.timeouts import TIMEOUTS
from llmgw.gateway.app import GatewayDeps, make_app
from llmgw.gateway.requestlog import RequestRecord
from llmgw.gateway.router import Router
from llmgw.metrics import control, gateway
from llmgw.metrics.expose import render
from llmgw.reconcile import ModelView
from llmgw.testing import MemoryStore

CLIENT = "sk-llmgw-bench-metrics"
GIB = 1 << 30


def _store(models: int) -> MemoryStore:
    store = MemoryStore()
    store.submit_nowait(commands.add_key(hash_key(CLIENT), "bench", "client", 0.0))
    for i in range(models):
        store.submit_nowait(commands.put_model(ModelDef.from_doc(
            {"name": f"m{i:04d}", "engine": "sim", "source": f"sim://m{i}"}), at=0.0))
    return store


async def _drive(app: Any, n: int) -> float:
    """CPU seconds per request over `n` requests, alternating a listing and a 404 chat."""
    auth = (b"authorization", f"Bearer {CLIENT}".encode())
    chat = json.dumps({"model": "absent", "messages": [{"role": "user", "content": "hi"}]}).encode()
    scopes = [
        ({"type": "http", "method": "GET", "path": "/v1/models", "raw_path": b"/v1/models", "headers": [auth]}, b""),
        ({"type": "http", "method": "POST", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
          "headers": [auth, (b"content-type", b"application/json"), (b"content-length", str(len(chat)).encode())]},
         chat),
    ]

    async def send(message: dict[str, Any]) -> None:
        return None

    start = time.process_time()
    for i in range(n):
        scope, body = scopes[i & 1]
        sent = False

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if sent:
                await trio.sleep_forever()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await app(scope, receive, send)
    app.log.take()  # the writer task is not running: keep its queue from growing
    return (time.process_time() - start) / n


def gateway_cost(requests: int, rounds: int) -> dict[str, float]:
    store = _store(3)
    on = make_app(GatewayDeps(router=Router(), state=store))
    off = make_app(GatewayDeps(router=Router(), state=store, metrics=None))
    runs: dict[str, list[float]] = {"on": [], "off": []}

    async def drive_all() -> None:
        await _drive(on, 500)  # warm both
        await _drive(off, 500)
        for _ in range(rounds):
            for name, app in (("off", off), ("on", on)):
                gc.collect()
                runs[name].append(await _drive(app, requests))

    trio.run(drive_all)
    m = gateway.RequestMetrics()
    record = RequestRecord("r", 0.0, "k", "m0001", 200, latency_ms=12.5, ttft_ms=3.2, tokens_in=30, tokens_out=80)
    start = time.process_time()
    for _ in range(200_000):
        m.count(record)
    count_us = (time.process_time() - start) / 200_000 * 1e6
    off_us, on_us = (statistics.median(runs[k]) * 1e6 for k in ("off", "on"))
    return {"off_us": off_us, "on_us": on_us, "count_us": count_us}


def big_fleet(nodes: int, models: int) -> tuple[ClusterState, Observed, dict[str, ModelView]]:
    """`nodes` nodes of 8 GPUs (a few unhealthy), two engines each; `models` models of one replica each."""
    store = _store(models)
    infos = {}
    for n in range(nodes):
        name = f"node{n:04d}"
        gpus = tuple(Gpu(i, f"GPU-{n}-{i}", "H100", "h100-80g" if n % 4 else "a100-80g", 80 * GIB, 0,
                         i != 7 or n % 50 != 0) for i in range(8))
        infos[name] = NodeInfo(name, name, 64, 512 * GIB, gpus, ("sim", "vllm"), f"ib-{n % 8}",
                               engine_versions={"sim": "", "vllm": "0.9.1"})
    for i in range(models):
        name = f"m{i:04d}"
        store.submit_nowait(commands.add_placement(name, f"node{(i // 2) % nodes:04d}", (i % 8,),
                                                   store.snapshot().models[name].launch_hash(), 0.0))
    replicas = {p.replica_id: ReplicaObs(p.replica_id, p.model, p.node, "failed" if p.model.endswith("7") else "ready")
                for p in store.snapshot().placements.values()}
    views = {f"m{i:04d}": ModelView(f"m{i:04d}", 1, 1, 1 if i % 9 else 0, 0, "ready" if i % 9 else "starting", "")
             for i in range(models)}
    return store.snapshot(), Observed(nodes=infos, replicas=replicas, demand={}, lost={"gone": 1.0}), views


async def _loop_pause(exporter: gateway.Exporter) -> float:
    """The longest the loop went without running a task while one scrape was answered."""
    sys.setswitchinterval(TIMEOUTS.gateway_gil_switch_s)  # as the gateway sets it
    longest, done = 0.0, False

    async def ticker() -> None:
        nonlocal longest
        last = time.perf_counter()
        while not done:
            await trio.sleep(0)
            now = time.perf_counter()
            longest, last = max(longest, now - last), now

    async def send(message: dict[str, Any]) -> None:
        return None

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticker)
        await trio.sleep(0.01)
        await exporter.answer(send)
        done = True
    return longest


def scrape_cost(nodes: int, models: int, rounds: int) -> dict[str, float]:
    state, observed, views = big_fleet(nodes, models)
    raft = {"ready": True, "leader": "a:1", "is_leader": True, "term": 3, "commit_index": 10, "last_applied": 10,
            "partners": {"b:1": 2, "c:1": 2}, "match_index": {"b:1": 10, "c:1": 9}}
    builds, families, sizes = [], [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        built = summary.summarize(state, observed, views, {}, 100.0)
        t1 = time.perf_counter()
        text = render(control.registry_for(lambda: control.Scrape("a:1", True, raft, built, {})))
        builds.append(t1 - t0)
        families.append(time.perf_counter() - t1)
        sizes.append(len(text))
    m = gateway.RequestMetrics()
    for i in range(models):
        for status, code in ((200, ""), (404, "model_not_found"), (502, "upstream_error")):
            m.count(RequestRecord("r", 0.0, "", f"m{i:04d}", status, error=code, latency_ms=i % 900, ttft_ms=5.0))
    exporter = gateway.Exporter(m)
    gc.freeze()  # as the gateway does once it serves: the collector scans what requests leave, not the fleet
    copies, renders, pauses, gw_text = [], [], [], b""
    for _ in range(rounds):
        t0 = time.perf_counter()
        frozen = exporter.frozen()  # the part on the loop
        t1 = time.perf_counter()
        gw_text = render(frozen)  # the part in a worker thread
        copies.append(t1 - t0)
        renders.append(time.perf_counter() - t1)
        pauses.append(trio.run(_loop_pause, exporter))
    return {"summary_ms": statistics.median(builds) * 1e3, "families_ms": statistics.median(families) * 1e3,
            "control_kib": statistics.median(sizes) / 1024, "gateway_ms": statistics.median(renders) * 1e3,
            "gateway_copy_ms": statistics.median(copies) * 1e3, "gateway_kib": len(gw_text) / 1024,
            "pause_ms": statistics.median(pauses) * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--models", type=int, default=2000)
    args = ap.parse_args()
    g = gateway_cost(args.requests, args.rounds)
    s = scrape_cost(args.nodes, args.models, max(args.rounds // 2, 1))
    added = g["on_us"] - g["off_us"]
    rows = [
        ("gateway CPU per request, counters off", f"{g['off_us']:.1f} µs"),
        ("gateway CPU per request, counters on", f"{g['on_us']:.1f} µs"),
        ("  added by counting", f"{added:+.2f} µs ({added / g['off_us'] * 100:+.1f} %)"),
        ("one RequestMetrics.count alone", f"{g['count_us']:.2f} µs"),
        (f"control scrape, {args.nodes} nodes / {args.models} models: summary", f"{s['summary_ms']:.1f} ms"),
        ("  families and text", f"{s['families_ms']:.1f} ms ({s['control_kib']:.0f} KiB)"),
        (f"gateway scrape, {args.models} models x 3 codes: copy on the loop", f"{s['gateway_copy_ms']:.2f} ms"),
        ("  families and text (worker thread)", f"{s['gateway_ms']:.1f} ms ({s['gateway_kib']:.0f} KiB)"),
        ("  longest pause of the gateway's loop meanwhile", f"{s['pause_ms']:.2f} ms"),
    ]
    width = max(len(r[0]) for r in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")


if __name__ == "__main__":
    main()
