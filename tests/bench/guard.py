"""Guard benchmark: what a guard policy adds to a request, beside the gateway's own no-policy figures.

Run: `.venv/bin/python tests/bench/guard.py [--requests 2000]`

One trio program: the gateway (`serve`, in process) in front of a sim chat engine, and a sim judge
(`llmgw engine sim --role guard --unsafe bomb=S9`), both separate processes on loopback. The gateway's
columns share one httpx client (its cost is the same in each); the judge's columns use the gateway's own
kept-alive HTTP/1.1 client (pool.py) both straight to the judge and through `Guard`.
Figures (medians, and p99 where it matters):
- no policy: a request through the gateway with guards on but no policy for its model (the hot path), and
  `Guard.plan`'s cost alone (one identity check and one dict lookup; goal: < 1 us, nothing measurable
  beside the gateway's ~1 ms a request);
- cache hit: the same request under a prompt policy whose verdict is cached (goal: < 100 us added), and
  the check alone (`Checks.check_prompt` on a hit: conversation, prompt, sha256, lookup);
- judge call: a check that asks the sim judge (unique texts: every one a miss) against the judge's own
  time (the same body sent straight to it over the same kind of connection); goal: < 2 ms beyond it.
tests/bench/gateway.py has the gateway's absolute figures against a raw upstream and LiteLLM.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import httpx
import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from llmgw.domain import commands  # noqa: E402
from llmgw.domain.commands import set_policy  # noqa: E402
from llmgw.domain.guard import GuardPolicy  # noqa: E402
from llmgw.domain.keys import hash_key  # noqa: E402
from llmgw.domain.model import ModelDef  # noqa: E402
from llmgw.domain.observed import Endpoint, ModelRoute  # noqa: E402
from llmgw.domain.state import ApiKey  # noqa: E402
from llmgw.domain.timeouts import TIMEOUTS  # noqa: E402
from llmgw.gateway import upstream  # noqa: E402
from llmgw.gateway.app import GatewayDeps, serve  # noqa: E402
from llmgw.gateway.guard import Guard  # noqa: E402
from llmgw.gateway.pool import Pool  # noqa: E402
from llmgw.gateway.router import Router  # noqa: E402
from llmgw.guard.prompt import USER, build, judge_request  # noqa: E402
from llmgw.testing import MemoryStore  # noqa: E402

KEY = "sk-bench-guard"
GOAL_PLAN_NS, GOAL_HIT_US, GOAL_JUDGE_MS = 1000.0, 100.0, 2.0


@dataclass
class _Facts:  # a request's facts (interfaces.RequestFacts), as the app's exchange has them
    request_id: str = "req-bench-0000000000000000"
    key: ApiKey | None = None
    model: str = "demo"
    replica: str = "-"
    node: str = ""
    error: str = ""
    tokens_in: int | None = None
    tokens_out: int | None = None
    ttft: float | None = None
    guard_rule: str = ""
    served: str = ""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _sim(name: str, role: str, port: int, *extra: str) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "llmgw", "engine", "sim", "--port", str(port), "--model", name, "--role", role,
            *extra]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)


async def _ready(url: str) -> None:
    async with httpx.AsyncClient() as http:
        with trio.fail_after(30):
            while True:
                try:
                    if (await http.get(url + "/health")).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                await trio.sleep(0.05)


async def _times(n: int, call: Callable[[int], Awaitable[None]]) -> list[float]:
    for i in range(min(50, n)):  # warm: connections, caches
        await call(-1 - i)
    out = []
    for i in range(n):
        started = time.perf_counter()
        await call(i)
        out.append(time.perf_counter() - started)
    return out


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _post(pool: Pool, url: str, path: str, body: bytes) -> bytes:
    response = await upstream.send(pool, url, path, body, "req-bench", limit=64, queue=64)
    try:
        data = await response.read()
        if response.status != 200:
            raise RuntimeError(f"{path}: HTTP {response.status}: {data[:200]!r}")
        return data
    finally:
        response.close()


async def bench(n: int) -> int:
    judge_port, chat_port = _port(), _port()
    procs = [_sim("lg", "guard", judge_port, "--unsafe", "bomb=S9"), _sim("demo", "chat", chat_port)]
    judge_url, chat_url = f"http://127.0.0.1:{judge_port}", f"http://127.0.0.1:{chat_port}"
    try:
        await _ready(judge_url)
        await _ready(chat_url)
        store = MemoryStore()
        for name, role in (("demo", "chat"), ("free", "chat"), ("lg", "guard")):
            store.submit_nowait(commands.put_model(ModelDef.from_doc(
                {"name": name, "engine": "sim", "source": f"sim://{name}", "role": role}), at=0.0))
        store.submit_nowait(commands.add_key(hash_key(KEY), "bench", "client", 0.0))
        router = Router()
        router.update_routes({"demo": ModelRoute("demo", "chat", "ready", (Endpoint("demo-r1", chat_url),)),
                              "free": ModelRoute("free", "chat", "ready", (Endpoint("free-r1", chat_url),)),
                              "lg": ModelRoute("lg", "guard", "ready", (Endpoint("lg-r1", judge_url),))})
        async with trio.open_nursery() as nursery:
            host, port = await nursery.start(partial(serve, "127.0.0.1", 0, GatewayDeps(router=router, state=store)))
            gateway = f"http://{host}:{port}"
            async with httpx.AsyncClient(base_url=gateway, headers={"authorization": f"Bearer {KEY}"},
                                         timeout=30) as http:

                async def through(model: str, text: str) -> float:
                    started = time.perf_counter()
                    got = await http.post("/v1/chat/completions", json={
                        "model": model, "max_tokens": 8, "messages": [{"role": "user", "content": text}]})
                    if got.status_code != 200:
                        raise RuntimeError(got.text)
                    return time.perf_counter() - started

                # "free" has no policy, "demo" one: interleaved, so the machine's drift hits both alike.
                store.submit_nowait(set_policy(GuardPolicy(name="bench", judge="lg", models=("demo",)), at=1.0))
                same = "how fast is the gateway today"
                no_policy, hit, miss = [], [], []
                for i in range(-50, n):
                    free_s, hit_s = await through("free", same), await through("demo", same)
                    if i >= 0:
                        no_policy.append(free_s)
                        hit.append(hit_s)
                    if i % 4 == 0:
                        miss_s = await through("demo", f"{same}, take {i}")
                        if i >= 0:
                            miss.append(miss_s)

            # The pieces, without the client: the same Router and a pool of their own.
            pool = Pool(TIMEOUTS)
            guard = Guard(router, pool)
            state = store.snapshot()
            body = {"model": "demo", "messages": [{"role": "user", "content": "how fast is the gateway today"}]}
            facts = _Facts()
            none_state = store.snapshot()
            loops = 200_000
            started = time.perf_counter()
            for _ in range(loops):
                guard.plan(none_state, "free", "chat", body, facts)  # a model no policy names
            plan_ns = (time.perf_counter() - started) / loops * 1e9
            first = guard.plan(state, "demo", "chat", body, facts)
            assert first is not None
            await first.check_prompt()  # the miss that fills the cache
            started = time.perf_counter()
            for _ in range(20_000):  # what a request pays: its plan, then the check that hits
                checks = guard.plan(state, "demo", "chat", body, facts)
                assert checks is not None
                await checks.check_prompt()
            hit_check_us = (time.perf_counter() - started) / 20_000 * 1e6

            async def direct(i: int) -> None:
                await _post(pool, judge_url, "/v1/completions", judge_request("lg", build([(USER, f"t {i}")], USER)))

            async def asked(i: int) -> None:
                policy = GuardPolicy(name="bench", judge="lg", models=("demo",))
                await guard.verdict(policy, build([(USER, f"t {i} {time.perf_counter_ns()}")], USER), "req-bench")

            judge_own = await _times(max(n // 2, 100), direct)
            judge_via = await _times(max(n // 2, 100), asked)
            pool.close()
            nursery.cancel_scope.cancel()
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=10)

    med = statistics.median
    ms = 1000.0
    print(f"guard benchmark: {n} requests per column, loopback, sims as processes")
    print(f"{'':34}{'p50 ms':>10}{'p99 ms':>10}")
    for name, values in (("gateway, no policy for the model", no_policy), ("gateway, policy, cached verdict", hit),
                         ("gateway, policy, judge asked", miss), ("sim judge alone (its own time)", judge_own),
                         ("guard check asking the judge", judge_via)):
        print(f"{name:34}{med(values) * ms:>10.3f}{_p(values, 0.99) * ms:>10.3f}")
    hit_added_us = (med(hit) - med(no_policy)) * 1e6
    judge_added_ms = (med(judge_via) - med(judge_own)) * ms
    print()
    print(f"no policy: Guard.plan costs {plan_ns:.0f} ns a request (goal < {GOAL_PLAN_NS:.0f} ns): "
          f"{'ok' if plan_ns < GOAL_PLAN_NS else 'MISSED'}")
    print(f"cache hit: the check alone {hit_check_us:.1f} us; through the gateway +{hit_added_us:.0f} us at p50 "
          f"(goal < {GOAL_HIT_US:.0f} us): {'ok' if hit_check_us < GOAL_HIT_US else 'MISSED'}")
    print(f"judge call: +{judge_added_ms:.3f} ms beyond the judge's own time at p50 (goal < {GOAL_JUDGE_MS:g} ms): "
          f"{'ok' if judge_added_ms < GOAL_JUDGE_MS else 'MISSED'}")
    return 0 if plan_ns < GOAL_PLAN_NS and hit_check_us < GOAL_HIT_US and judge_added_ms < GOAL_JUDGE_MS else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000)
    opts = parser.parse_args()
    return trio.run(bench, opts.requests)


if __name__ == "__main__":
    sys.exit(main())
