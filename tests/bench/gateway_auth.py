"""What an invalid-key flood costs a gateway: req/s and the gateway's CPU µs per request for requests
refused at the door (no key, a wrong key, an admin key) beside valid ones (a model listing, a chat
completion through a sim engine).

Run: `.venv/bin/python tests/bench/gateway_auth.py [--requests 3000] [--clients 4]`.

The gateway runs in its own process (access log on, as in production); its CPU is read from
/proc before and after each case, so the figure is the gateway's alone. The load generator is
`--clients` processes, each one keep-alive connection sending requests one after another over a
bare socket (a few µs per request of its own); on a small machine they share the cores with the
gateway, so req/s is the machine's, the CPU per request the gateway's.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import socket
import subprocess
import sys
import threading
import time
from functools import partial
from pathlib import Path

import trio

CLIENT, ADMIN = "sk-llmgw-bench-client", "sk-llmgw-bench-admin"
MODEL = "bench"
ROOT = Path(__file__).resolve().parents[2]
CHAT = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "is this key any good"}],
                   "max_tokens": 8}).encode()
_LENGTH = re.compile(rb"content-length: *(\d+)", re.IGNORECASE)


async def _gateway_child(upstream: str) -> None:
    from llmgw import logs
    from llmgw.domain import commands
    from llmgw.domain.keys import hash_key
    from llmgw.domain.model import ModelDef
    from llmgw.domain.observed import Endpoint, ModelRoute
    from llmgw.gateway.app import GatewayDeps, serve
    from llmgw.gateway.router import Router
    from llmgw.testing import MemoryStore

    logs.setup(level="INFO")
    store = MemoryStore()
    store.submit_nowait(commands.put_model(ModelDef.from_doc({"name": MODEL, "engine": "sim",
                                                              "source": "sim://bench"}), at=0.0))
    store.submit_nowait(commands.add_key(hash_key(CLIENT), "bench", "client", 0.0))
    store.submit_nowait(commands.add_key(hash_key(ADMIN), "ops", "admin", 0.0))
    for i in range(10_000):  # a big table: the check must not care
        store.submit_nowait(commands.add_key(hash_key(f"sk-other-{i}"), f"k{i}", "client", 0.0))
    router = Router()
    router.update_routes({MODEL: ModelRoute(MODEL, "chat", "ready", (Endpoint("bench-r1", upstream),))})
    async with trio.open_nursery() as nursery:
        host, port = await nursery.start(partial(serve, "127.0.0.1", 0, GatewayDeps(router=router, state=store)))
        print(f"READY http://{host}:{port}", flush=True)


def _start(args: list[str], ready: str, stream: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(args, cwd=ROOT, text=True,
                            stdout=subprocess.PIPE if stream == "stdout" else subprocess.DEVNULL,
                            stderr=subprocess.PIPE if stream == "stderr" else subprocess.DEVNULL)
    pipe = proc.stdout if stream == "stdout" else proc.stderr
    assert pipe is not None
    for line in pipe:
        if ready in line:
            threading.Thread(target=pipe.read, daemon=True).start()  # never block a chatty child
            return proc, line.split(ready, 1)[1].split()[0]
    raise RuntimeError(f"{args[:4]} exited before it was ready")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _request(method: str, path: str, key: str | None, body: bytes) -> bytes:
    auth = f"authorization: Bearer {key}\r\n" if key else ""
    framing = f"content-type: application/json\r\ncontent-length: {len(body)}\r\n" if method == "POST" else ""
    return f"{method} {path} HTTP/1.1\r\nhost: bench\r\n{auth}{framing}\r\n".encode() + body


def _client(address: tuple[str, int], request: bytes, n: int, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    """One keep-alive connection, `n` requests in a row; puts (statuses seen, seconds, reconnects)."""
    sock = socket.create_connection(address)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf, statuses, reconnects = b"", set(), 0
    start = time.perf_counter()
    for _ in range(n):
        sock.sendall(request)
        while True:
            end = buf.find(b"\r\n\r\n")
            if end >= 0:
                length = _LENGTH.search(buf, 0, end)
                total = end + 4 + (int(length.group(1)) if length else 0)
                if len(buf) >= total:
                    statuses.add(int(buf[9:12]))
                    buf = buf[total:]
                    break
            chunk = sock.recv(65536)
            if not chunk:  # the server closed: start over on a new connection
                sock = socket.create_connection(address)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                buf = b""
                reconnects += 1
                sock.sendall(request)
                continue
            buf += chunk
    out.put((sorted(statuses), time.perf_counter() - start, reconnects))
    sock.close()


def _case(address: tuple[str, int], pid: int, request: bytes, total: int,
          clients: int) -> tuple[float, float, list[int], int]:
    """(req/s, gateway CPU µs per request, statuses, connections the server closed) of `total`
    requests over `clients` connections."""
    out: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
    each = total // clients
    procs = [multiprocessing.Process(target=_client, args=(address, request, each, out)) for _ in range(clients)]
    cpu0, t0 = _cpu_s(pid), time.perf_counter()
    for p in procs:
        p.start()
    results = [out.get() for _ in procs]
    for p in procs:
        p.join()
    wall, cpu = time.perf_counter() - t0, _cpu_s(pid) - cpu0
    statuses = sorted({s for r in results for s in r[0]})
    return each * clients / wall, cpu / (each * clients) * 1e6, statuses, sum(r[2] for r in results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000, help="requests per case")
    parser.add_argument("--clients", type=int, default=4, help="client processes, one connection each")
    parser.add_argument("--child-gateway", metavar="UPSTREAM", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child_gateway:
        trio.run(_gateway_child, opts.child_gateway)
        return
    py = sys.executable
    engine = gateway = None
    try:
        engine, upstream = _start([py, "-m", "llmgw.engines.sim", "--host", "127.0.0.1", "--port", "0",
                                   "--model", MODEL], "listening on ", "stderr")
        gateway, url = _start([py, str(Path(__file__).resolve()), "--child-gateway", upstream], "READY ", "stdout")
        host, port = url.removeprefix("http://").rsplit(":", 1)
        address = (host, int(port))
        cases = [
            ("refused: no key", _request("POST", "/v1/chat/completions", None, CHAT)),
            ("refused: unknown key", _request("POST", "/v1/chat/completions", "sk-llmgw-" + "x" * 32, CHAT)),
            ("refused: admin key", _request("POST", "/v1/chat/completions", ADMIN, CHAT)),
            ("valid: GET /v1/models", _request("GET", "/v1/models", CLIENT, b"")),
            ("valid: chat via engine", _request("POST", "/v1/chat/completions", CLIENT, CHAT)),
        ]
        _case(address, gateway.pid, cases[3][1], 200, 1)  # warm up
        print(f"gateway {url} (10,002 keys in its table), {opts.clients} client processes, "
              f"{opts.requests} requests per case, {os.cpu_count()} cores")
        print(f"{'case':<26}{'req/s':>10}{'gw CPU µs/req':>16}{'closed':>8}  statuses")
        figures = {}
        for name, request in cases:
            rate, cpu_us, statuses, closed = _case(address, gateway.pid, request, opts.requests, opts.clients)
            figures[name] = cpu_us
            print(f"{name:<26}{rate:>10.0f}{cpu_us:>16.0f}{closed:>8}  {statuses}")
        refused = figures["refused: unknown key"]
        print(f"an unknown key costs {refused / figures['valid: GET /v1/models']:.2f}x a valid model listing and "
              f"{refused / figures['valid: chat via engine']:.2f}x a valid chat completion (gateway CPU)")
    finally:
        for proc in (gateway, engine):
            if proc is not None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()


if __name__ == "__main__":
    main()
