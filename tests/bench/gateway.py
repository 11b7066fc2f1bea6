"""Gateway overhead benchmark: the same requests straight to a raw upstream, through llmgw's gateway and
through LiteLLM's proxy; added latency, req/s, streaming time to first chunk, streams at load (answers of
`--stream-chunks` chunks at `--concurrency`: streams/s and CPU per stream), CPU per request by stage, and the
gateway's own time on a stream's way to its first chunk, timed inside one more gateway (`--path-samples`: _path.py).

Run: `.venv/bin/python tests/bench/gateway.py [--rounds 5] [--quick] [--litellm | --no-litellm]`
(needs `wrk`: `apt-get install -y wrk`; LiteLLM goes into .bench/litellm-venv, made on first use).

Processes: the upstream (tests/bench/_upstream.py, raw asyncio: its own req/s is the "direct" column),
the gateway (`serve` with a client key, a route and the request log on, as in production), a second
gateway of two processes sharing one port (SO_REUSEPORT), LiteLLM's proxy, and wrk (C, one thread) as
the load generator, and three trio relays (tests/bench/_relay.py, in the TTFC runs only): one copying bytes (the
floor under any trio proxy's stream figures), one reading each request and answer head with httptools first (the
floor under any HTTP gateway in trio), and llmgw's own server under a minimal ASGI app (the floor under any app
llmgw's server runs: no key, checks, routing or pool). Rounds interleave direct, llmgw and LiteLLM runs, so drift on
a busy machine hits each; every figure is the median over rounds of that round's figure (added = via - direct, per
round). CPU per request is /proc's, over the c=32 runs; the stages come from one more gateway run under cProfile.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import pstats
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _litellm  # noqa: E402
import _path  # noqa: E402
import _probe  # noqa: E402
import _stages  # noqa: E402
import _wrk  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MODEL = "bench"
KEY_ENV = "LLMGW_BENCH_KEY"
MESSAGES = [{"role": "user", "content": "how fast is the gateway today"}]
CHAT: dict[str, object] = {"model": MODEL, "messages": MESSAGES, "max_tokens": 16}
STREAM: dict[str, object] = {**CHAT, "stream": True}
PATH = "/v1/chat/completions"
# Point 10's goals for one gateway process, and the 25x against LiteLLM.
GOAL_ADDED_P50_MS, GOAL_ADDED_P99_MS, GOAL_RPS, GOAL_TTFC_MS, GOAL_HANDLER_CPU_MS, GOAL_VS_LITELLM = (
    1.0, 3.0, 1000.0, 1.0, 0.4, 25.0)
GOAL_TTFC_26_MS = 0.3  # issue 26's goal for what the stream's first chunk adds at c=1


# --- child: one gateway process -------------------------------------------------------------


def _throwaway_tls(directory: Path) -> Any:
    """A server context as a gateway's /v1 gets one (`llmgw.trust.tls.server_context` with the cluster's CA:
    client certificates asked for, not required), from a throwaway CA: an ECDSA P-256 cert for 127.0.0.1."""
    from llmgw.trust import ca, tls
    from llmgw.trust.files import write_private

    now = time.time()
    root = ca.make_root("bench", now)
    inter = ca.make_intermediate(root, now)
    key = ca.new_key_pem()
    cert = ca.sign_request(ca.make_request(key, "gateway", "bench"), inter, role="gateway", name="bench",
                           hosts=("127.0.0.1",), now=now)
    directory.mkdir(parents=True, exist_ok=True)
    write_private(directory / "tls.pem", cert + inter.cert_pem)
    write_private(directory / "tls.key", key)
    write_private(directory / "ca.pem", root.cert_pem)
    return tls.server_context(directory / "tls.pem", directory / "tls.key", directory / "ca.pem")


async def _gateway_child(upstream: str, port: int, reuse_port: bool, log_dir: str, tls: bool = False) -> None:
    from llmgw import logs
    from llmgw.domain import commands
    from llmgw.domain.keys import hash_key
    from llmgw.domain.model import ModelDef
    from llmgw.domain.observed import Endpoint, ModelRoute
    from llmgw.gateway.app import GatewayDeps, serve
    from llmgw.gateway.requestlog import RequestLog
    from llmgw.gateway.router import Router
    from llmgw.testing import MemoryStore

    logs.setup(level="INFO")  # as `llmgw gateway` runs by default: one access line per request (stderr: /dev/null)
    store = MemoryStore()
    store.submit_nowait(commands.put_model(ModelDef.from_doc({"name": MODEL, "engine": "sim", "source": "sim://b"}),
                                           at=0.0))
    store.submit_nowait(commands.add_key(hash_key(os.environ[KEY_ENV]), "bench", "client", 0.0))
    router = Router()
    router.update_routes({MODEL: ModelRoute(MODEL, "chat", "ready", (Endpoint("bench-r1", upstream),))})
    deps = GatewayDeps(router=router, state=store, requestlog=RequestLog(Path(log_dir), "bench"))
    kwargs: dict[str, Any] = {"reuse_port": True} if reuse_port else {}  # older serve() had no reuse_port
    if tls:  # the certificate beside the request log (the parent's temporary directory)
        kwargs["tls"] = _throwaway_tls(Path(log_dir + "-tls"))
    import trio

    async with trio.open_nursery() as nursery:
        host, bound = await nursery.start(partial(serve, "127.0.0.1", port, deps, **kwargs))
        print(f"READY {'https' if tls else 'http'}://{host}:{bound}", flush=True)


def _run_child(opts: argparse.Namespace) -> None:
    import trio

    from llmgw.cli import _collector

    _collector.settle()  # the garbage collector as `llmgw gateway` sets it
    if opts.trace:
        _path.record(opts.trace)

    run = partial(trio.run, _gateway_child, opts.child_gateway, opts.port, opts.reuse_port, opts.log_dir, opts.tls)
    if not opts.profile:
        run()
        return
    import cProfile

    # cProfile's own clock: a custom CPU-time timer (time.thread_time_ns) made profiling 12x slower than
    # the code it measured (3x with this one) and skewed the shares toward many-call code. The clock is
    # wall time, so `_stages` leaves out the event loop's idle waits (epoll). Only the main thread is
    # profiled: the request log's writer thread is in /proc's whole-process figure.
    profiler = cProfile.Profile()

    def dump(*_: object) -> None:
        profiler.disable()
        profiler.dump_stats(opts.profile + ".tmp")
        os.replace(opts.profile + ".tmp", opts.profile)

    signal.signal(signal.SIGUSR1, lambda *_: profiler.enable())
    signal.signal(signal.SIGUSR2, dump)
    run()


def reuse_port_supported() -> bool:
    from llmgw.gateway.app import serve

    return "reuse_port" in inspect.signature(serve).parameters


# --- parent: processes -----------------------------------------------------------------------


@dataclass
class Procs:
    all: list[subprocess.Popen[str]] = field(default_factory=list)

    def start(self, args: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], str]:
        """A child started, and the URL from its `READY url` line."""
        proc = subprocess.Popen(args, cwd=ROOT, text=True, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL)
        self.all.append(proc)
        assert proc.stdout is not None
        timer = threading.Timer(60, proc.kill)  # a child that never says READY ends the pipe (and this wait)
        timer.start()
        for line in proc.stdout:
            if line.startswith("READY "):
                timer.cancel()
                threading.Thread(target=proc.stdout.read, daemon=True).start()  # never block it on a full pipe
                return proc, line.split()[1]
        timer.cancel()
        raise RuntimeError(f"{args[1:3]} did not start (exit {proc.wait()})")

    def stop(self, proc: subprocess.Popen[str]) -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def stop_all(self) -> None:
        """Stop every child, then close the pipes their lines came through."""
        for proc in reversed(self.all):
            self.stop(proc)
        for proc in self.all:
            if proc.stdout is not None:
                proc.stdout.close()


def _gateway_args(upstream: str, log_dir: Path, *, port: int = 0, reuse_port: bool = False,
                  profile: Path | None = None, tls: bool = False, trace: Path | None = None) -> list[str]:
    args = [sys.executable, str(Path(__file__).resolve()), "--child-gateway", upstream, "--port", str(port),
            "--log-dir", str(log_dir)]
    return (args + (["--reuse-port"] if reuse_port else []) + (["--profile", str(profile)] if profile else [])
            + (["--tls"] if tls else []) + (["--trace", str(trace)] if trace else []))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- parent: measuring -------------------------------------------------------------------------


@dataclass
class Target:
    name: str
    url: str  # http://host:port
    script: Path  # wrk script (the key this target takes)
    key: str
    pids: list[int]  # whose CPU a run costs (with their children)
    seq: list[_wrk.WrkRun] = field(default_factory=list)
    load: list[_wrk.WrkRun] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)  # per request, c=32 runs, whole process tree
    main_ms: list[float] = field(default_factory=list)  # per request, c=32 runs, main thread only (one pid)
    ttfc: list[list[float]] = field(default_factory=list)


def _cpu(pids: list[int]) -> float:
    return sum(_probe.tree_cpu_s(p) or 0.0 for p in pids)


def _main_cpu(pids: list[int]) -> float | None:
    got = _probe.threads_cpu_s(pids[0]) if len(pids) == 1 else None
    return None if got is None else got[0]


def _load(t: Target, opts: argparse.Namespace, failures: list[str]) -> None:
    before, main_before = _cpu(t.pids), _main_cpu(t.pids)
    run = _wrk.run(t.url + PATH, t.script, connections=opts.concurrency, seconds=opts.load_s)
    cpu, main_after = _cpu(t.pids) - before, _main_cpu(t.pids)
    t.load.append(run)
    t.cpu_ms.append(cpu * 1000 / max(run.requests, 1))
    if main_before is not None and main_after is not None:
        t.main_ms.append((main_after - main_before) * 1000 / max(run.requests, 1))
    if run.errors:
        failures.append(f"{t.name}: {run.errors} errors of {run.requests} requests at c={opts.concurrency}")


def _seq(t: Target, opts: argparse.Namespace, failures: list[str]) -> None:
    run = _wrk.run(t.url + PATH, t.script, connections=1, seconds=opts.seq_s)
    t.seq.append(run)
    if run.errors:
        failures.append(f"{t.name}: {run.errors} errors of {run.requests} sequential requests")


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def _rounds(direct: Target, gw: Target, gw2: Target | None, lite: Target | None, relays: list[Target],
            streams: tuple[Target, Target] | None, opts: argparse.Namespace, failures: list[str]) -> None:
    seq = [t for t in (direct, gw, lite) if t]
    load = [t for t in (direct, gw, gw2, lite, *(streams or ())) if t]
    for t in load:  # warm connections, caches and code paths
        _wrk.run(t.url + PATH, t.script, connections=opts.concurrency, seconds=1)
    for i in range(opts.rounds):
        for t in seq:
            _seq(t, opts, failures)
        for t in load:
            _load(t, opts, failures)
        for t in [*seq, *relays]:
            n = opts.ttfc_samples if t is not lite else max(10, opts.ttfc_samples // 4)  # LiteLLM: ~25 ms each
            try:
                t.ttfc.append(_probe.ttfc_samples(t.url + PATH, t.key, STREAM, n))
            except OSError as e:
                raise RuntimeError(f"{t.name}'s streamed requests failed: {e}") from e
        print(f"  round {i + 1}/{opts.rounds}: p50 " + ", ".join(f"{t.name} {t.seq[-1].p50_ms:.2f} ms" for t in seq)
              + "; req/s " + ", ".join(f"{t.name} {t.load[-1].rps:.0f}" for t in load), file=sys.stderr, flush=True)


def _profile(upstream: str, tmp: Path, procs: Procs, script: Path, opts: argparse.Namespace,
             env: dict[str, str]) -> tuple[dict[str, float], int]:
    """Stage seconds from one profiled gateway run at c=32, and how many requests it served."""
    out = tmp / "gateway.prof"
    proc, url = procs.start(_gateway_args(upstream, tmp / "log-prof", profile=out), env)
    _wrk.run(url + PATH, script, connections=opts.concurrency, seconds=1)  # warm up, unprofiled
    proc.send_signal(signal.SIGUSR1)
    run = _wrk.run(url + PATH, script, connections=opts.concurrency, seconds=opts.profile_s)
    proc.send_signal(signal.SIGUSR2)
    written = _written(out)
    procs.stop(proc)
    if not written:
        raise RuntimeError("the profiled gateway wrote no profile")
    if opts.save_profile:
        opts.save_profile.write_bytes(out.read_bytes())
    return _stages.by_stage(pstats.Stats(str(out))), run.requests


def _written(path: Path, within_s: float = 60.0) -> bool:
    """Whether a child wrote `path` (on its own loop, once signalled) within `within_s`."""
    deadline = time.monotonic() + within_s
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    return path.exists()


def _own_path(upstream: str, tmp: Path, procs: Procs, opts: argparse.Namespace,
              env: dict[str, str]) -> _path.OwnTime:
    """The gateway's own time on the first chunk's path: one more gateway, its sockets timestamped (_path.py),
    over `--path-samples` streamed requests at c=1 (after as many unrecorded ones)."""
    out = tmp / "path.json"
    proc, url = procs.start(_gateway_args(upstream, tmp / "log-path", trace=out), env)
    try:
        _probe.ttfc_samples(url + PATH, env[KEY_ENV], STREAM, opts.path_samples)
        proc.send_signal(signal.SIGUSR1)
        time.sleep(0.2)  # (the handler runs on the child's loop: let it before the recorded requests)
        _probe.ttfc_samples(url + PATH, env[KEY_ENV], STREAM, opts.path_samples)
        proc.send_signal(signal.SIGUSR2)
        written = _written(out)
    finally:
        procs.stop(proc)
    if not written:
        raise RuntimeError("the traced gateway wrote no socket events")
    events = json.loads(out.read_text())
    return _path.own_time(events, urlsplit(url).port or 0, urlsplit(upstream).port or 0)


# --- report ------------------------------------------------------------------------------------


def _med(values: list[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def _fmt(x: float | None, digits: int = 2) -> str:
    return "n/a" if x is None or x != x else f"{x:.{digits}f}"


def _report(direct: Target, gw: Target, gw2: Target | None, gw2_note: str, lite: Target | None, relays: list[Target],
            streams: tuple[Target, Target] | None, stages: tuple[dict[str, float], int] | None,
            own: _path.OwnTime | None,
            opts: argparse.Namespace) -> None:
    def added(t: Target, f: str) -> float:
        return _med([getattr(v, f) - getattr(d, f) for v, d in zip(t.seq, direct.seq)])

    def ttfc(t: Target, p: float) -> float:
        return _med([_pct(s, p) for s in t.ttfc])

    def ttfc_added(t: Target, p: float) -> float:
        return _med([_pct(s, p) - _pct(d, p) for s, d in zip(t.ttfc, direct.ttfc)])

    rows: list[list[str]] = []

    def row(figure: str, d: float | None, g: float | None, g_added: float | None, goal: str,
            l_val: float | None, l_added: float | None, lower_better: bool, digits: int = 2) -> None:
        ratio = vs = None
        if lite is not None and g_added is not None and l_added:
            ratio = g_added / l_added
        cells = [figure, _fmt(d, digits), _fmt(g, digits), _fmt(g_added, digits), goal, _fmt(l_val, digits),
                 _fmt(l_added, digits)]
        if ratio is None:
            cells += ["n/a", "n/a"]
        else:
            vs = ratio <= 1 / GOAL_VS_LITELLM if lower_better else ratio >= GOAL_VS_LITELLM
            shown = (f"1/{1 / ratio:.1f}" if ratio > 0 else f"{ratio:.3f}") if lower_better else f"{ratio:.1f}x"
            cells += [shown, _verdict(vs)]
        rows.append(cells)

    a50, a99 = added(gw, "p50_ms"), added(gw, "p99_ms")
    l50 = added(lite, "p50_ms") if lite else None
    l99 = added(lite, "p99_ms") if lite else None
    rows_seq = [("latency p50, c=1 (ms)", "p50_ms", a50, l50, GOAL_ADDED_P50_MS),
                ("latency p99, c=1 (ms)", "p99_ms", a99, l99, GOAL_ADDED_P99_MS)]
    for name, f, a, la, goal in rows_seq:
        row(name, _med([getattr(r, f) for r in direct.seq]), _med([getattr(r, f) for r in gw.seq]), a,
            f"added <= {goal:g}: {_verdict(a <= goal)}", _med([getattr(r, f) for r in lite.seq]) if lite else None,
            la, True)
    rps = _med([r.rps for r in gw.load])
    d_rps = _med([r.rps for r in direct.load])
    l_rps = _med([r.rps for r in lite.load]) if lite else None
    # For req/s the "added" column is the share of the direct figure, and the ratio is llmgw / LiteLLM.
    row(f"req/s, c={opts.concurrency}, 1 process", d_rps, rps, rps / d_rps, f">= {GOAL_RPS:g}: {_verdict(rps >= GOAL_RPS)}",
        l_rps, (l_rps / d_rps) if l_rps else None, False, 0)
    rows[-1][3] = f"x{rps / d_rps:.2f} of direct"
    rows[-1][6] = f"x{l_rps / d_rps:.3f} of direct" if l_rps else "n/a"
    if l_rps:
        rows[-1][7], rows[-1][8] = f"{rps / l_rps:.1f}x", _verdict(rps / l_rps >= GOAL_VS_LITELLM)
    if gw2 is not None:
        rps2 = _med([r.rps for r in gw2.load])
        rows.append([f"req/s, c={opts.concurrency}, 2 processes (SO_REUSEPORT)", _fmt(d_rps, 0), _fmt(rps2, 0),
                     f"x{rps2 / rps:.2f} of 1 process", "", "", "", f"{rps2 / l_rps:.1f}x" if l_rps else "n/a", ""])
    else:
        rows.append([f"req/s, c={opts.concurrency}, 2 processes", "", gw2_note, "", "", "", "", "", ""])
    if streams is not None:
        # Whole streams at load: what the gateway costs per stream, and what share of the engine's own rate it keeps.
        s_direct, s_gw = streams
        s_rps, s_d_rps = _med([r.rps for r in s_gw.load]), _med([r.rps for r in s_direct.load])
        rows.append([f"streams/s, c={opts.concurrency}, answers of {opts.stream_chunks} chunks {opts.gap_ms:g} ms apart",
                     _fmt(s_d_rps, 0), _fmt(s_rps, 0), f"x{s_rps / s_d_rps:.2f} of direct", "", "", "", "", ""])
        rows.append([f"CPU ms/stream, c={opts.concurrency}, the same streams (/proc)", _fmt(_med(s_direct.cpu_ms), 3),
                     _fmt(_med(s_gw.cpu_ms), 3), "", "", "", "", "", ""])
    goals: tuple[tuple[int, float | None], ...] = ((50, GOAL_TTFC_MS), (99, None))
    for p, t_goal in goals:
        t_add = ttfc_added(gw, p)
        goal = (f"added <= {t_goal:g}: {_verdict(t_add <= t_goal)}; issue 26: <= {GOAL_TTFC_26_MS:g}: "
                f"{_verdict(t_add <= GOAL_TTFC_26_MS)}") if t_goal else ""
        row(f"stream TTFC p{p}, c=1 (ms)", ttfc(direct, p), ttfc(gw, p), t_add, goal, ttfc(lite, p) if lite else None,
            ttfc_added(lite, p) if lite else None, True)
    # The floors: what a proxy that only copies bytes adds (two more loopback hops and their wake-ups), one that
    # also reads each request and answer head as HTTP, and llmgw's own server under a minimal app; the gateway's own
    # share of its TTFC figure above each.
    for relay, what, said in zip(relays, ("a bare trio byte relay", "a trio relay reading HTTP (httptools)",
                                          "llmgw's server under a minimal app"), (", the floor", "", "")):
        if relay.ttfc:
            floor = ttfc_added(relay, 50)
            rows.append([f"stream TTFC p50, c=1: {what}{said} (ms)", _fmt(ttfc(direct, 50)), _fmt(ttfc(relay, 50)),
                         _fmt(floor), "", "", "", "", ""])
            rows.append([f"stream TTFC p50, c=1: llmgw's own, above {what} (ms)", "", "",
                         _fmt(ttfc_added(gw, 50) - floor), "", "", "", "", ""])
    if own is not None:  # the same share, timed inside the gateway's process (_path.py): free of the hops
        for what, us in (("the request's bytes -> the engine's request written", own.request_us),
                         ("the engine's first bytes -> the client's first write", own.answer_us),
                         ("both halves", own.total_us)):
            rows.append([f"stream first chunk, c=1, inside llmgw: {what}, p50 of {own.requests} (ms)", "",
                         _fmt(us / 1000, 3), "", "", "", "", "", ""])
    g_cpu, u_cpu = _med(gw.cpu_ms), _med(direct.cpu_ms)
    l_cpu = _med(lite.cpu_ms) if lite else None
    row(f"CPU ms/request, c={opts.concurrency} (/proc)", u_cpu, g_cpu, g_cpu, "", l_cpu, l_cpu, True, 3)
    rows[-1][3] = f"{1000 / g_cpu:.0f} req/s per core"
    rows[-1][6] = f"{1000 / l_cpu:.0f} req/s per core" if l_cpu else "n/a"
    handler = None
    if stages is not None:
        seconds, n = stages
        main_ms = _med(gw.main_ms) if gw.main_ms else g_cpu
        total = sum(seconds.values()) or 1.0
        handler = sum(seconds[s] for s in _stages.HANDLER) / total * main_ms
        rows.append(["in-handler CPU ms/request (profile, scaled)", "", _fmt(handler, 3), "",
                     f"<= {GOAL_HANDLER_CPU_MS:g}: {_verdict(handler <= GOAL_HANDLER_CPU_MS)}", "", "", "", ""])

    head = ["figure", "direct (upstream)", "llmgw", "llmgw added", "point 10 goal", f"LiteLLM {_litellm.PIN}",
            "LiteLLM added", "llmgw / LiteLLM", "25x goal"]
    print()
    print(f"load generator: {_wrk.version()} (C), one thread: -c1 for latency, -c{opts.concurrency} for req/s; "
          f"{opts.rounds} round(s) of {opts.seq_s:g} s + {opts.load_s:g} s runs, {opts.ttfc_samples} TTFC samples "
          f"(LiteLLM: a quarter); {os.cpu_count()} CPUs shared with the upstream, wrk and other work: noisy. "
          f"Medians over rounds; 'added' per round against the direct run of that round.")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        print("| " + " | ".join(r) + " |")
    if stages is not None:
        seconds, n = stages
        total = sum(seconds.values()) or 1.0
        main_ms = _med(gw.main_ms) if gw.main_ms else g_cpu
        print()
        print(f"llmgw CPU per request by stage: cProfile (idle epoll waits left out) over {n} requests at c={opts.concurrency}, "
              f"main thread; profiling inflates every figure, so 'scaled' spreads the un-profiled main-thread CPU "
              f"({main_ms:.3f} ms/req, /proc) in the same shares. Whole process: {g_cpu:.3f} ms/req "
              f"(the rest: the request log's writer and other threads).")
        print("| stage | profiled ms/req | share | scaled ms/req |")
        print("|---|---|---|---|")
        for stage, s in seconds.items():
            print(f"| {stage} | {s * 1000 / n:.3f} | {s / total:.0%} | {s / total * main_ms:.3f} |")
        print(f"| in handler ({' + '.join(_stages.HANDLER)}) | | | {handler:.3f} |")


# --- main -------------------------------------------------------------------------------------


def _options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="1 round, short runs, no LiteLLM unless --litellm")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--seq-s", type=float, default=3.0, help="seconds per sequential (c=1) wrk run")
    parser.add_argument("--load-s", type=float, default=3.0, help="seconds per wrk run at --concurrency")
    parser.add_argument("--ttfc-samples", type=int, default=200, help="sequential streamed requests per round")
    parser.add_argument("--gap-ms", type=float, default=1.0,
                        help="the upstream's pause between two streamed chunks (0: back to back; docs/performance.md, "
                             "'The stream's first chunk')")
    parser.add_argument("--stream-chunks", type=int, default=32,
                        help="chunks per answer of the streams at load (another upstream; 0: no such runs)")
    parser.add_argument("--profile-s", type=float, default=4.0, help="seconds of the profiled gateway run (0: none)")
    parser.add_argument("--path-samples", type=int, default=300,
                        help="streamed requests timed inside one more gateway, its own time to the first chunk "
                             "(0: none; tests/bench/_path.py)")
    parser.add_argument("--save-profile", type=Path, help="keep the gateway's cProfile here (for pstats/snakeviz)")
    lite = parser.add_mutually_exclusive_group()
    lite.add_argument("--litellm", action="store_true", default=None, help="run LiteLLM too (sets up its venv)")
    lite.add_argument("--no-litellm", dest="litellm", action="store_false")
    parser.add_argument("--child-gateway", metavar="UPSTREAM", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tls", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--log-dir", help=argparse.SUPPRESS)
    parser.add_argument("--profile", help=argparse.SUPPRESS)
    parser.add_argument("--trace", help=argparse.SUPPRESS)
    if "--quick" in sys.argv:  # shorter defaults; flags given beside --quick still win
        parser.set_defaults(rounds=1, seq_s=2.0, load_s=2.0, ttfc_samples=100, profile_s=2.0, path_samples=100)
    opts = parser.parse_args()
    if opts.quick:
        opts.litellm = bool(opts.litellm)
    elif opts.litellm is None:
        opts.litellm = _litellm.installed()  # on by default once its venv exists
    return opts


def main() -> int:
    opts = _options()
    if opts.child_gateway:
        _run_child(opts)
        return 0
    if _wrk.available() is None:
        print("error: this benchmark needs wrk, a C load generator (apt-get install -y wrk): a Python load "
              "generator on the same cores would cost more per request than the gateway it measures.",
              file=sys.stderr)
        return 2
    from llmgw.domain.keys import new_key

    key = new_key()
    env = {**os.environ, KEY_ENV: key, "PYTHONPATH": str(ROOT)}
    procs, failures = Procs(), []
    lite_proc = None
    try:
        with tempfile.TemporaryDirectory(prefix="llmgw-bench-") as tmp_name:
            tmp = Path(tmp_name)
            up_proc, upstream = procs.start([sys.executable, str(Path(__file__).parent / "_upstream.py"),
                                             f"--gap-ms={opts.gap_ms:g}"])
            script = _wrk.write_script(tmp, "chat", CHAT, key)
            gw_proc, gw_url = procs.start(_gateway_args(upstream, tmp / "log-1"), env)
            direct = Target("direct", upstream, script, key, [up_proc.pid])
            gw = Target("llmgw", gw_url, script, key, [gw_proc.pid])
            gw2, gw2_note = None, "n/a: serve() has no reuse_port yet"
            if reuse_port_supported():
                port = _free_port()
                a, url2 = procs.start(_gateway_args(upstream, tmp / "log-2a", port=port, reuse_port=True), env)
                b, _ = procs.start(_gateway_args(upstream, tmp / "log-2b", port=port, reuse_port=True), env)
                gw2 = Target("llmgw x2", url2, script, key, [a.pid, b.pid])
            lite = None
            if opts.litellm:
                lite_proc, lite_url = _litellm.start(upstream, MODEL, _free_port(), tmp)
                lite = Target("LiteLLM", lite_url, _wrk.write_script(tmp, "litellm", CHAT, _litellm.MASTER_KEY),
                              _litellm.MASTER_KEY, [lite_proc.pid])
            for t in (direct, gw, gw2, lite):
                if t is not None:  # one checked answer each before any load: a wrong setup fails here
                    doc = _probe.check(t.url + PATH, t.key, CHAT)
                    if not isinstance(doc.get("usage"), dict):
                        failures.append(f"{t.name}: answer without usage: {doc}")
            print(f"upstream {upstream}, llmgw {gw_url}" + (f", 2 processes {gw2.url}" if gw2 else "")
                  + (f", LiteLLM {lite.url}" if lite else ""), file=sys.stderr, flush=True)
            relays = []
            for mode in ((), ("--http",), ("--front",)):
                relay_proc, relay_url = procs.start([sys.executable, str(Path(__file__).parent / "_relay.py"), *mode,
                                                     upstream])
                relays.append(Target("relay" + "".join(mode), relay_url, script, key, [relay_proc.pid]))
            streams = None
            if opts.stream_chunks > 0:  # longer streams at load: an upstream of their own, and a gateway before it
                long_proc, long_upstream = procs.start([sys.executable, str(Path(__file__).parent / "_upstream.py"),
                                                        f"--gap-ms={opts.gap_ms:g}", f"--chunks={opts.stream_chunks}"])
                long_gw, long_url = procs.start(_gateway_args(long_upstream, tmp / "log-streams"), env)
                stream_script = _wrk.write_script(tmp, "stream", STREAM, key)
                streams = (Target("direct streams", long_upstream, stream_script, key, [long_proc.pid]),
                           Target("llmgw streams", long_url, stream_script, key, [long_gw.pid]))
            _rounds(direct, gw, gw2, lite, relays, streams, opts, failures)
            procs.stop(gw_proc)  # the traced and the profiled gateway run alone
            own = _own_path(upstream, tmp, procs, opts, env) if opts.path_samples > 0 else None
            stages = _profile(upstream, tmp, procs, script, opts, env) if opts.profile_s > 0 else None
            _report(direct, gw, gw2, gw2_note, lite, relays, streams, stages, own, opts)
    except (RuntimeError, OSError, subprocess.SubprocessError, ValueError) as e:
        failures.append(f"{type(e).__name__}: {e}")
    finally:
        if lite_proc is not None:
            _litellm.stop(lite_proc)
        procs.stop_all()
    for f in failures:
        print(f"FAILED: {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
