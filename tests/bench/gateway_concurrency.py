"""Gateway under concurrency: CPU per request and req/s at concurrency 32, 256 and 1,024 against a SLOW
upstream (the sim at a low tokens/s), straight to the engine and through the gateway, side by side.

Run: `.venv/bin/python tests/bench/gateway_concurrency.py [--concurrency 32 256 1024] [--duration 10]
[--code /tmp/before]` (needs `wrk`: `apt-get install -y wrk`).

Three processes: the sim engine, the gateway (`serve` with the production defaults, in a process of its
own, so /proc/<pid>/stat is its CPU alone) and `wrk`, a C load generator, so the client is never what
limits the figures (wrk used ~0.03 ms of CPU per request here: one thread would drive ~30,000 req/s). For each
concurrency a direct run and a gateway run alternate, `--rounds` times; figures are medians over rounds.
`--code DIR` runs the gateway from another source tree (a `git worktree` of an older commit): the
before/after figures in docs/performance.md come from that.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import trio

KEY = "sk-bench"
MODEL = "bench"
ROOT = Path(__file__).resolve().parents[2]
# 4 completion tokens at 5 tokens/s: each request takes ~0.8 s upstream, and the sim serves them all at once.
BODY = '{"model":"bench","messages":[{"role":"user","content":"how busy is the gateway today"}],"max_tokens":4}'
LUA = f"""wrk.method = "POST"
wrk.body = '{BODY}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer {KEY}"
"""


# --- child: the gateway in its own process --------------------------------------------


async def _gateway_child(upstream: str, connections: int) -> None:
    import llmgw
    from llmgw import logs
    from llmgw.domain import commands
    from llmgw.domain.keys import hash_key
    from llmgw.domain.model import ModelDef
    from llmgw.domain.observed import Endpoint, ModelRoute
    from llmgw.domain.settings import SETTINGS
    from llmgw.gateway.app import GatewayDeps, serve
    from llmgw.gateway.router import Router
    from llmgw.testing import MemoryStore

    logs.setup(level="WARNING")  # request lines off: this measures the proxy, not the log handler
    store = MemoryStore()
    store.submit_nowait(commands.put_model(ModelDef.from_doc({"name": MODEL, "engine": "sim", "source": "sim://b"}), at=0.0))
    store.submit_nowait(commands.add_key(hash_key(KEY), "bench", "client", 0.0))
    setting = "gateway.upstream_connections_per_replica"
    known = setting in SETTINGS  # the code before the pool had no such setting (and no such limit)
    if known:
        store.submit_nowait(commands.put_setting(setting, connections, at=0.0))
    router = Router()
    router.update_routes({MODEL: ModelRoute(MODEL, "chat", "ready", (Endpoint("bench-r1", upstream),))})
    async with trio.open_nursery() as nursery:
        host, port = await nursery.start(partial(serve, "127.0.0.1", 0, GatewayDeps(router=router, state=store)))
        where = Path(llmgw.__file__).parent.parent
        print(f"READY http://{host}:{port} code={where} limit={connections if known else 'none'}", flush=True)


# --- parent ------------------------------------------------------------------------------


def _start(args: list[str], ready: str, stream: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(args, cwd=ROOT, text=True, env=env,
                            stdout=subprocess.PIPE if stream == "stdout" else subprocess.DEVNULL,
                            stderr=subprocess.PIPE if stream == "stderr" else subprocess.DEVNULL)
    pipe = proc.stdout if stream == "stdout" else proc.stderr
    assert pipe is not None
    for line in pipe:
        if ready in line:
            threading.Thread(target=pipe.read, daemon=True).start()  # never block the child on a full pipe
            print(line.strip(), file=sys.stderr)
            return proc, line.split(ready, 1)[1].split()[0]
    proc.kill()
    raise SystemExit(f"child {args} did not start")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Run:
    rps: float
    requests: int
    p50_ms: float
    p99_ms: float
    timeouts: int
    errors: int  # socket errors other than timeouts, and non-2xx answers
    cpu_ms: float  # CPU of the measured process (engine or gateway) per request


_UNIT = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}


def _ms(text: str) -> float:
    found = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)  # wrk prints e.g. "-nanus" when nothing completed
    return float(found.group(1)) * _UNIT[found.group(2)] if found else float("nan")


def _wrk(url: str, concurrency: int, duration: int, script: str, pid: int) -> Run:
    before = _cpu_s(pid)
    out = subprocess.run(
        ["wrk", "-t1", f"-c{concurrency}", f"-d{duration}s", "--timeout", "5s", "--latency", "-s", script, url],
        capture_output=True, text=True, check=True).stdout
    cpu = _cpu_s(pid) - before
    requests = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    p50 = _ms(re.search(r"50%\s+(\S+)", out).group(1))  # type: ignore[union-attr]
    p99 = _ms(re.search(r"99%\s+(\S+)", out).group(1))  # type: ignore[union-attr]
    sock = re.search(r"connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    timeouts = int(sock.group(4)) if sock else 0
    errors = sum(int(sock.group(i)) for i in (1, 2, 3)) if sock else 0
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors += int(non2xx.group(1)) if non2xx else 0
    return Run(rps, requests, p50, p99, timeouts, errors, cpu * 1000 / max(requests, 1))


def _median(runs: list[Run]) -> Run:
    def med(f: str) -> float:
        return float(statistics.median(getattr(r, f) for r in runs))

    return Run(med("rps"), int(med("requests")), med("p50_ms"), med("p99_ms"), sum(r.timeouts for r in runs),
               sum(r.errors for r in runs), med("cpu_ms"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[32, 256, 1024])
    parser.add_argument("--duration", type=int, default=10, help="seconds per wrk run")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--tokens-per-s", type=float, default=5.0, help="the sim's speed (slow: requests overlap)")
    parser.add_argument("--connections", type=int, default=0,
                        help="gateway.upstream_connections_per_replica (default: the largest --concurrency)")
    parser.add_argument("--code", type=Path, help="run the gateway from this source tree (e.g. a worktree of HEAD~)")
    parser.add_argument("--child-gateway", metavar="UPSTREAM", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    connections = opts.connections or max(opts.concurrency)
    if opts.child_gateway:
        trio.run(_gateway_child, opts.child_gateway, connections)
        return
    py = sys.executable
    env = dict(os.environ)
    if opts.code:
        env["PYTHONPATH"] = str(opts.code.resolve())
    engine = gateway = None
    results: dict[int, tuple[Run, Run]] = {}
    try:
        engine, direct = _start([py, "-m", "llmgw.engines.sim", "--host", "127.0.0.1", "--port", "0", "--model", MODEL,
                                 "--tokens-per-s", str(opts.tokens_per_s)], "listening on ", "stderr")
        gateway, via = _start([py, str(Path(__file__).resolve()), "--child-gateway", direct,
                               "--connections", str(connections)], "READY ", "stdout", env)
        with tempfile.NamedTemporaryFile("w", suffix=".lua") as script:
            script.write(LUA)
            script.flush()
            path = "/v1/chat/completions"
            for c in opts.concurrency:
                d_runs, g_runs = [], []
                for _ in range(opts.rounds):
                    d_runs.append(_wrk(direct + path, c, opts.duration, script.name, engine.pid))
                    g_runs.append(_wrk(via + path, c, opts.duration, script.name, gateway.pid))
                    time.sleep(1)  # let closed connections drain between runs
                results[c] = (_median(d_runs), _median(g_runs))
                d, g = results[c]
                print(f"  c={c}: direct {d.rps:.0f} req/s, gateway {g.rps:.0f} req/s, "
                      f"gateway CPU {g.cpu_ms:.2f} ms/req", file=sys.stderr, flush=True)
    finally:
        for proc in (gateway, engine):
            if proc is not None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
    print()
    print(f"wrk -t1, {opts.duration:g} s per run, {opts.rounds} round(s); sim at {opts.tokens_per_s:g} tokens/s, "
          f"max_tokens 4; {os.cpu_count()} CPUs; gateway.upstream_connections_per_replica {connections} "
          f"(where the gateway has it)")
    head = ["conc", "direct req/s", "gw req/s", "ratio", "direct p50", "gw p50", "gw p99", "timeouts", "errors",
            "gw CPU ms/req", "engine CPU ms/req"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for c, (d, g) in results.items():
        row = [str(c), f"{d.rps:.0f}", f"{g.rps:.0f}", f"{g.rps / d.rps:.2f}", f"{d.p50_ms:.0f} ms",
               f"{g.p50_ms:.0f} ms", f"{g.p99_ms:.0f} ms", f"{d.timeouts} / {g.timeouts}", f"{d.errors} / {g.errors}",
               f"{g.cpu_ms:.2f}", f"{d.cpu_ms:.2f}"]
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
