"""TLS on the gateway's hot path: added latency (p50/p99), req/s and the gateway process's CPU per request,
TLS on against off, over kept-alive connections at c=1 and c=32; and what a handshake per request would cost.

Run: `.venv/bin/python tests/bench/gateway_tls.py [--rounds 3] [--seconds 5] [--concurrency 1 32] [--quick]`
(needs `wrk`: `apt-get install -y wrk`; wrk speaks TLS through OpenSSL and keeps its connections alive).

Processes, all tests/bench/gateway.py's: the raw upstream (its own figures are the "direct" ones), one gateway
serving plain HTTP and one serving TLS (`serve(..., tls=)` with `llmgw.trust.tls.server_context` as
`llmgw gateway` builds it: an ECDSA P-256 certificate from a throwaway CA, the CA's clients asked for a
certificate, none required), and wrk (C, one thread). Every round runs every target at every concurrency,
interleaved, so drift on a busy machine hits each; figures are medians over rounds, 'added' per round against
the direct (kept-alive) run of that round at the same concurrency; CPU is /proc's, the gateway's whole process.
The `Connection: close` rows make wrk open a new connection per request (TCP, and for TLS a handshake): what
keep-alive saves. wrk times a request from when it writes it, after the connect and handshake, so those show
in "c / req/s" (the mean time each connection spends per request, all of it: Little's law) and in CPU. wrk keeps the last connection's TLS session and offers it again, so those handshakes may be
resumptions (a TLS 1.3 ticket, as browsers do); a client that never resumes pays a full handshake, more.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _probe  # noqa: E402
import _wrk  # noqa: E402
import gateway as bench  # noqa: E402  (its gateway child, processes, wrk runs with /proc CPU)

PLAIN, TLS = "plain", "TLS"


def close_script(directory: Path, key: str) -> Path:
    """gateway.py's wrk script, each request asking the server to close its connection after the answer."""
    path = directory / "chat-close.lua"
    path.write_text(_wrk.lua_script(bench.CHAT, key) + "wrk.headers[\"Connection\"] = \"close\"\n")
    return path


def tls_ca(log_dir: Path) -> Path:
    """The throwaway CA a `--tls` gateway child made beside its request log (bench._gateway_child)."""
    return Path(str(log_dir) + "-tls") / "ca.pem"


def check_tls(url: str, ca: Path, key: str, requests: int = 2, pause_s: float = 0.0) -> None:
    """`requests` chat requests on one TLS connection, the certificate verified against `ca` for 127.0.0.1:
    each answered 200 with `usage`, and all on the connection (and handshake) of the first: keep-alive.
    `pause_s` between them: a quiet client, whose connection's watcher stops reading between requests."""
    from urllib.parse import urlsplit

    from llmgw.trust import tls

    parts = urlsplit(url)
    conn = http.client.HTTPSConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30,
                                       context=tls.client_context(ca))
    try:
        first = None
        for i in range(requests):
            if i and pause_s:
                time.sleep(pause_s)
            conn.request("POST", bench.PATH, json.dumps(bench.CHAT),
                         {"content-type": "application/json", "authorization": f"Bearer {key}"})
            answer = conn.getresponse()
            body = answer.read()
            if answer.status != 200 or not isinstance(json.loads(body).get("usage"), dict):
                raise RuntimeError(f"{url} answered {answer.status}: {body[:300]!r}")
            first = first or conn.sock
            if conn.sock is None or conn.sock is not first:
                raise RuntimeError(f"{url} did not keep the TLS connection alive between requests")
    finally:
        conn.close()


def _targets(upstream: str, up_pid: int, gws: dict[str, tuple[int, str]], scripts: dict[bool, Path], key: str,
             concurrency: list[int]) -> dict[tuple[int, str], bench.Target]:
    """One target per (concurrency, row): direct, plain and TLS kept alive, plain and TLS closed per request."""
    out: dict[tuple[int, str], bench.Target] = {}
    for c in concurrency:
        out[c, "direct"] = bench.Target(f"direct c={c}", upstream, scripts[True], key, [up_pid])
        for close in (False, True):
            for kind in (PLAIN, TLS):
                pid, url = gws[kind]
                row = f"{kind}, {'Connection: close' if close else 'keep-alive'}"
                out[c, row] = bench.Target(f"{row} c={c}", url, scripts[not close], key, [pid])
    return out


def measure(targets: dict[tuple[int, str], bench.Target], rounds: int, seconds: float,
            failures: list[str]) -> None:
    for t in targets.values():  # warm connections, caches and code paths
        _wrk.run(t.url + bench.PATH, t.script, connections=max(c for c, _ in targets), seconds=1)
    for i in range(rounds):
        for (c, _row), t in targets.items():
            bench._load(t, argparse.Namespace(concurrency=c, load_s=seconds), failures)
        print(f"  round {i + 1}/{rounds}: " + ", ".join(f"{t.name} {t.load[-1].rps:.0f} req/s"
                                                       for t in targets.values()), file=sys.stderr, flush=True)


def _med(values: list[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def _ratio(tls: float, plain: float, digits: int = 2) -> str:
    if tls != tls or plain != plain:
        return "n/a"
    diff = f"{tls - plain:+.{digits}f}"
    return f"x{tls / plain:.2f} ({diff})" if plain > 0 else f"({diff})"


def table(targets: dict[tuple[int, str], bench.Target]) -> list[list[str]]:
    """The report's rows, the header first."""
    rows = [["c", "connections", "p50 ms", "p99 ms", "added p50 ms", "added p99 ms", "c / req/s ms", "req/s",
             "CPU ms/req"]]
    for c in sorted({c for c, _ in targets}):
        direct = targets[c, "direct"]

        def figures(t: bench.Target) -> dict[str, float]:
            return {"p50": _med([r.p50_ms for r in t.load]), "p99": _med([r.p99_ms for r in t.load]),
                    "a50": _med([r.p50_ms - d.p50_ms for r, d in zip(t.load, direct.load)]),
                    "a99": _med([r.p99_ms - d.p99_ms for r, d in zip(t.load, direct.load)]),
                    "rps": _med([r.rps for r in t.load]), "cpu": _med(t.cpu_ms),
                    "cycle": _med([c * 1000 / r.rps for r in t.load])}

        d = figures(direct)
        rows.append([str(c), "direct (upstream), keep-alive", f"{d['p50']:.2f}", f"{d['p99']:.2f}", "", "",
                     f"{d['cycle']:.2f}", f"{d['rps']:.0f}", f"{d['cpu']:.3f} (upstream)"])
        for how in ("keep-alive", "Connection: close"):
            plain, tls = figures(targets[c, f"{PLAIN}, {how}"]), figures(targets[c, f"{TLS}, {how}"])
            for kind, f in ((PLAIN, plain), (TLS, tls)):
                rows.append([str(c), f"{kind}, {how}", f"{f['p50']:.2f}", f"{f['p99']:.2f}", f"{f['a50']:.2f}",
                             f"{f['a99']:.2f}", f"{f['cycle']:.2f}", f"{f['rps']:.0f}", f"{f['cpu']:.3f}"])
            rows.append([str(c), f"TLS / plain, {how}", _ratio(tls["p50"], plain["p50"]),
                         _ratio(tls["p99"], plain["p99"]), _ratio(tls["a50"], plain["a50"]),
                         _ratio(tls["a99"], plain["a99"]), _ratio(tls["cycle"], plain["cycle"]),
                         f"x{tls['rps'] / plain['rps']:.2f}",
                         _ratio(tls["cpu"], plain["cpu"], 3)])
        kept, closed = figures(targets[c, f"{TLS}, keep-alive"]), figures(targets[c, f"{TLS}, Connection: close"])
        rows.append([str(c), "TLS: close / keep-alive", _ratio(closed["p50"], kept["p50"]),
                     _ratio(closed["p99"], kept["p99"]), "", "", _ratio(closed["cycle"], kept["cycle"]),
                     f"x{closed['rps'] / kept['rps']:.2f}",
                     _ratio(closed["cpu"], kept["cpu"], 3)])
    return rows


def _options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds per wrk run")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32], help="wrk connections (each run)")
    parser.add_argument("--quick", action="store_true", help="1 round of 2 s runs")
    if "--quick" in sys.argv:  # shorter defaults; flags given beside --quick still win
        parser.set_defaults(rounds=1, seconds=2.0)
    return parser.parse_args()


def main() -> int:
    opts = _options()
    if _wrk.available() is None:
        print("error: this benchmark needs wrk (apt-get install -y wrk)", file=sys.stderr)
        return 2
    from llmgw.domain.keys import new_key

    key = new_key()
    env = {**os.environ, bench.KEY_ENV: key, "PYTHONPATH": str(bench.ROOT)}
    procs, failures = bench.Procs(), list[str]()
    try:
        with tempfile.TemporaryDirectory(prefix="llmgw-bench-tls-") as tmp_name:
            tmp = Path(tmp_name)
            up_proc, upstream = procs.start([sys.executable, str(Path(__file__).parent / "_upstream.py")])
            scripts = {True: _wrk.write_script(tmp, "chat", bench.CHAT, key), False: close_script(tmp, key)}
            plain_proc, plain_url = procs.start(bench._gateway_args(upstream, tmp / "log-plain"), env)
            tls_proc, tls_url = procs.start(bench._gateway_args(upstream, tmp / "log-tls", tls=True), env)
            for url in (upstream, plain_url):  # one checked answer each before any load
                if not isinstance(_probe.check(url + bench.PATH, key, bench.CHAT).get("usage"), dict):
                    failures.append(f"{url}: answer without usage")
            check_tls(tls_url, tls_ca(tmp / "log-tls"), key)
            print(f"upstream {upstream}, plain {plain_url}, TLS {tls_url}", file=sys.stderr, flush=True)
            targets = _targets(upstream, up_proc.pid, {PLAIN: (plain_proc.pid, plain_url),
                                                       TLS: (tls_proc.pid, tls_url)}, scripts, key, opts.concurrency)
            measure(targets, opts.rounds, opts.seconds, failures)
            print()
            print(f"load generator: {_wrk.version()}, one thread, {opts.rounds} round(s) of {opts.seconds:g} s runs "
                  f"per row; {os.cpu_count()} CPUs shared by the upstream, the gateways and wrk. Medians over rounds; "
                  f"'added' against the direct kept-alive run of the round; CPU: the gateway process (/proc); "
                  f"ratio cells: TLS / plain (TLS - plain). wrk times a request from its write, after any connect "
                  f"and handshake: those show in c / req/s (each request's whole turn) and CPU, not in p50/p99.")
            rows = table(targets)
            print("| " + " | ".join(rows[0]) + " |")
            print("|" + "---|" * len(rows[0]))
            for r in rows[1:]:
                print("| " + " | ".join(r) + " |")
    except (RuntimeError, OSError, subprocess.SubprocessError, ValueError) as e:
        failures.append(f"{type(e).__name__}: {e}")
    finally:
        procs.stop_all()
    for f in failures:
        print(f"FAILED: {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
