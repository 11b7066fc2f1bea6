"""A small cluster of real processes for restarting under load, shared by the e2e test and the bench
(tests/bench/restart_load.py): one `llmgw control`, one `llmgw agent` (sim engines), and two gateways, `gw-a`
(one process) and `gw-b` (`--workers 2`); and `Load`, client threads sending chat completions, plain and
streamed, through both gateways, each request's outcome and latency recorded."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.support.processes import free_port, kill_engines_under, until
from tests.support.trust import ca_root_args, create_token, test_ca_root

ADMIN = "sk-restart-admin"
CLIENT = "sk-restart-client"
MODEL = "demo"
GATEWAYS = ("gw-a", "gw-b")  # gw-b runs --workers 2: listed as gw-b-w1, gw-b-w2


@dataclass
class RestartCluster:
    root: Path
    admin_url: str
    gateway_urls: dict[str, str]  # name -> http://127.0.0.1:PORT (the API under /v1)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    argv: dict[str, list[str]] = field(default_factory=dict)  # each process's `llmgw` arguments

    @property
    def env(self) -> dict[str, str]:
        """What `llmgw restart` / `llmgw ctl` run with to reach this cluster."""
        return {**os.environ, "LLMGW_URL": self.admin_url, "LLMGW_KEY": ADMIN,
                "LLMGW_CA_FILE": str(self.root / "control" / "tls" / "ca.pem")}

    def api(self) -> httpx.Client:
        return httpx.Client(base_url=self.admin_url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30)

    def gateways(self) -> dict[str, dict[str, Any]]:
        """`GET /api/v1/gateways`, by name."""
        with self.api() as api:
            return {g["name"]: g for g in api.get("/api/v1/gateways").json()["gateways"]}

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-6000:]}"
                         for p in sorted(self.root.glob("*.log")))

    def restart(self) -> subprocess.CompletedProcess[str]:
        """`llmgw restart`, as an operator runs it."""
        return subprocess.run([sys.executable, "-m", "llmgw", "restart"], capture_output=True, text=True,
                              env=self.env, timeout=900)

    def start(self, name: str, args: list[str], env: dict[str, str] | None = None) -> None:
        self.argv[name] = args
        with (self.root / f"{name}.log").open("ab") as out:
            self.procs[name] = subprocess.Popen([sys.executable, "-m", "llmgw", *args], stdout=out,
                                                stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})

    def stop_start(self, name: str) -> None:
        """What restarting a gateway was before it could restart in place (`llmgw service restart gateway`):
        SIGTERM, then the same command again; until it follows the leader again."""
        def mine() -> dict[str, dict[str, Any]]:
            return {n: g for n, g in self.gateways().items() if n == name or n.startswith(name + "-w")}

        before = {n: g["started_at"] for n, g in mine().items()}
        old = self.procs[name]
        old.send_signal(signal.SIGTERM)
        old.wait(60)
        self.start(name, self.argv[name])
        until(f"{name} follows the leader again", lambda: _alive(self) and (now := mine()).keys() == before.keys()
              and all(g["connected"] and g["started_at"] != before[n] for n, g in now.items()), limit=120)


@contextmanager
def restart_cluster(root: Path, *, tokens_per_s: float = 400.0) -> Iterator[RestartCluster]:
    """The cluster, serving `demo` (a sim model answering `tokens_per_s`) through both gateways; stopped with
    SIGTERM on exit, and any engine left under `root` killed."""
    test_ca_root()  # the tests' CA: a script (the bench) trusts it too
    admin_port = free_port()
    cluster = RestartCluster(root, f"https://127.0.0.1:{admin_port}",
                             {name: f"http://127.0.0.1:{free_port()}" for name in GATEWAYS})

    start = cluster.start
    try:
        start("control", ["control", "--state-dir", str(root / "control"), "--raft-addr", f"127.0.0.1:{free_port()}",
                          "--admin-addr", f"127.0.0.1:{admin_port}", *ca_root_args()],
              {"LLMGW_ADMIN_KEY": ADMIN, "LLMGW_CLIENT_KEY": CLIENT})
        tokens = {name: create_token(cluster.admin_url, ADMIN, role, name, wait_s=60, proc=cluster.procs["control"])
                  for role, name in (("agent", "worker-1"), ("gateway", "gw-a"), ("gateway", "gw-b"))}
        start("agent", ["agent", "--stop-engines-on-exit", "--control", cluster.admin_url, "--state-dir",
                        str(root / "agent"), "--node", "worker-1", "--join-token", tokens["worker-1"]["token"]])
        for name in GATEWAYS:
            workers = ["--workers", "2"] if name == "gw-b" else []
            start(name, ["gateway", *workers, "--control", cluster.admin_url, "--listen",
                         cluster.gateway_urls[name].removeprefix("http://"), "--state-dir", str(root / name),
                         "--name", name, "--join-token", tokens[name]["token"]])
        with cluster.api() as api:
            model = {"name": MODEL, "engine": "sim", "source": f"sim://{MODEL}",
                     "args": ["--tokens-per-s", f"{tokens_per_s:g}"]}
            until("the model taken", lambda: _alive(cluster) and api.post("/api/v1/models", json=model).status_code
                  in (200, 201, 409))
        for url in cluster.gateway_urls.values():
            until(f"{url} answers a chat completion", functools.partial(_alive_and_answers, cluster, url), limit=120)
        until("every gateway process follows the leader", lambda: _alive(cluster) and all(
            g["connected"] for g in cluster.gateways().values()) and len(cluster.gateways()) == 3)
        yield cluster
    except AssertionError as e:
        raise AssertionError(f"{e}\n{cluster.logs()}") from None
    finally:
        for p in cluster.procs.values():
            p.send_signal(signal.SIGTERM)
        for p in cluster.procs.values():
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        kill_engines_under(root)


def _alive(cluster: RestartCluster) -> bool:
    dead = [name for name, p in cluster.procs.items() if p.poll() is not None]
    assert not dead, f"{', '.join(dead)} exited"
    return True


def _alive_and_answers(cluster: RestartCluster, url: str) -> bool:
    return _alive(cluster) and _answers(url)


def _answers(url: str) -> bool:
    try:
        r = httpx.post(url + "/v1/chat/completions", json=_chat(False), timeout=30,
                       headers={"Authorization": f"Bearer {CLIENT}"})
    except httpx.HTTPError:
        return False
    return r.status_code == 200


def _chat(stream: bool) -> dict[str, Any]:
    return {"model": MODEL, "stream": stream, "max_tokens": 16,
            "messages": [{"role": "user", "content": "say something while the cluster restarts"}]}


@dataclass(frozen=True)
class Outcome:
    started: float  # time.monotonic() when sent
    latency_s: float
    gateway: str
    stream: bool
    error: str | None  # None: answered whole (a 200, and a stream ended by [DONE])


class Load:
    """`clients` threads, each with its own pooled connections (as an SDK keeps them), sending one request
    after another, alternating plain and streamed chat completions and the gateways."""

    def __init__(self, gateway_urls: dict[str, str], clients: int = 4) -> None:
        self.urls = gateway_urls
        self.clients = clients
        self.outcomes: list[Outcome] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def __enter__(self) -> Load:
        for i in range(self.clients):
            thread = threading.Thread(target=self._client, args=(i,), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(120)

    def failed(self) -> list[Outcome]:
        with self._lock:
            return [o for o in self.outcomes if o.error is not None]

    def between(self, start: float, end: float) -> list[Outcome]:
        with self._lock:
            return [o for o in self.outcomes if start <= o.started < end]

    def _client(self, index: int) -> None:
        names = sorted(self.urls)
        # Generous: a request waits in a gateway's queue while it restarts, which is not a failure.
        timeout = httpx.Timeout(120.0, connect=60.0)
        with httpx.Client(timeout=timeout, headers={"Authorization": f"Bearer {CLIENT}"}) as http:
            n = index
            while not self._stop.is_set():
                name, stream = names[n % len(names)], (n // len(names)) % 2 == 1
                n += 1
                started = time.monotonic()
                error = _one(http, self.urls[name], stream)
                outcome = Outcome(started, time.monotonic() - started, name, stream, error)
                with self._lock:
                    self.outcomes.append(outcome)


def _one(http: httpx.Client, url: str, stream: bool) -> str | None:
    """One request; None when answered whole, else what went wrong."""
    try:
        if not stream:
            r = http.post(url + "/v1/chat/completions", json=_chat(False))
            if r.status_code != 200:
                return f"{r.status_code} {r.text[:200]}"
            return None if r.json().get("choices") else f"no choices: {r.text[:200]}"
        with http.stream("POST", url + "/v1/chat/completions", json=_chat(True)) as r:
            if r.status_code != 200:
                return f"{r.status_code} {r.read()[:200]!r}"
            lines = [line for line in r.iter_lines() if line.startswith("data: ")]
        if not lines or lines[-1] != "data: [DONE]":
            return f"stream cut: {lines[-1:]!r}"
        json.loads(lines[0].removeprefix("data: "))
        return None
    except (httpx.HTTPError, ValueError) as e:
        return repr(e)
