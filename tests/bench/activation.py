"""Activation overhead (issue 26, point 3): a streamed request for an on-demand model with no replica, until its
first token, against the same engine started by hand; where the difference goes, stage by stage.

Run: `.venv/bin/python tests/bench/activation.py [--trials 9] [--modes up,procs]`.

The engine is the sim (`llmgw engine sim`), a Python process that serves in about half a second: small enough
that the cluster's own share shows. Each trial asks a model nobody asked before (cold0, cold1, ...), so every
trial is a cold start of its own, with nothing placed:

- **by hand**: the engine's process spawned, its port tried every 2 ms, then the same streamed request: spawn to
  first token. Its median is the baseline.
- **up**: `llmgw up` (control, agent and gateway in one process) serving a catalog of on-demand sim models.
- **procs**: `llmgw control`, `llmgw agent` and `llmgw gateway` as three processes (TLS between them, as
  deployed), the models defined over the admin API.

Stages, from the client's clock and the agent's log lines (millisecond timestamps, one machine's clock):
**ask → start** (the request sent until the agent logs the engine's start: the gateway's ask, the reconciler's
plan, the placement committed, the start sent), **start → ready** (the engine's start until the agent logs it
ready, less the engine's own start by hand: the agent's health probing), **ready → first token** (the agent's
report, the route pushed to the gateway, the request on its way). **overhead** = request to first token minus the
baseline: the goal is 150 ms.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.support.processes import free_port  # noqa: E402

GOAL_MS = 150.0
PROMPT = {"messages": [{"role": "user", "content": "wake up"}], "stream": True, "max_tokens": 4}


def first_token(port: int, model: str, key: str | None, timeout_s: float = 60.0) -> float:
    """A streamed chat request to 127.0.0.1:port; the wall time (time.time) its first SSE event arrived."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    headers = {"content-type": "application/json"}
    if key:
        headers["authorization"] = f"Bearer {key}"
    conn.request("POST", "/v1/chat/completions", json.dumps({"model": model, **PROMPT}), headers)
    response = conn.getresponse()
    if response.status != 200:
        raise RuntimeError(f"{model}: HTTP {response.status}: {response.read()[:300]!r}")
    while True:
        line = response.fp.readline()
        if not line:
            raise RuntimeError(f"{model}: the stream ended before its first event")
        if line.startswith(b"data: {"):
            at = time.time()
            break
    conn.close()
    return at


def by_hand(trials: int, tmp: Path) -> list[float]:
    """Spawn to first token of the sim engine started by hand, ms."""
    out = []
    for i in range(trials):
        port = free_port()
        t0 = time.time()
        proc = subprocess.Popen([sys.executable, "-m", "llmgw", "engine", "sim", "--host", "127.0.0.1", "--port",
                                 str(port), "--model", f"hand{i}", "--role", "chat"], cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if proc.poll() is not None:
                        raise RuntimeError("the sim engine exited before serving") from None
                    time.sleep(0.002)
            out.append((first_token(port, f"hand{i}", None) - t0) * 1000)
        finally:
            proc.terminate()
            proc.wait(10)
    return out


def _catalog(trials: int) -> list[dict[str, Any]]:
    return [{"name": f"cold{i}", "engine": "sim", "role": "chat", "source": f"sim://cold{i}", "mode": "on-demand",
             "replicas": {"min": 0, "max": 1}} for i in range(trials)]


def _toml(models: list[dict[str, Any]]) -> str:
    out = []
    for m in models:
        out.append("[[models]]")
        for k, v in m.items():
            if isinstance(v, dict):
                v = "{ " + ", ".join(f"{a} = {b}" for a, b in v.items()) + " }"
            else:
                v = json.dumps(v)
            out.append(f"{k} = {v}")
        out.append("")
    return "\n".join(out)


def _stamp(line: str) -> float | None:
    """The wall time of a log line (`2026-12-06T20:15:31.228Z ...`), or None."""
    head = line.split(" ", 1)[0]
    try:
        return datetime.fromisoformat(head.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _agent_times(log_text: str, model: str) -> tuple[float | None, float | None]:
    """When the agent logged the start and the readiness of `model`'s first replica."""
    start = ready = None
    for line in log_text.splitlines():
        if f"replica {model}-r" not in line:
            continue
        if " starting: " in line and start is None:
            start = _stamp(line)
        elif " ready at " in line and ready is None:
            ready = _stamp(line)
    return start, ready


def _wait_port(port: int, proc: subprocess.Popen[Any], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not start") from None
            time.sleep(0.05)


def _trial(port: int, key: str, model: str, read_log: Any) -> dict[str, float]:
    t0 = time.time()
    first = first_token(port, model, key)
    deadline = time.monotonic() + 10
    while True:  # the agent's log lines are written by now, give or take a flush
        start, ready = _agent_times(read_log(), model)
        if (start is not None and ready is not None) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if start is None or ready is None:
        raise RuntimeError(f"{model}: the agent's log does not say when it started and became ready")
    return {"total": (first - t0) * 1000, "ask_start": (start - t0) * 1000, "start_ready": (ready - start) * 1000,
            "ready_first": (first - ready) * 1000}


def run_up(trials: int, tmp: Path) -> list[dict[str, float]]:
    catalog = tmp / "up-catalog.toml"
    catalog.write_text(_toml(_catalog(trials)))
    gw, admin = free_port(), free_port()
    log = tmp / "up.log"
    key = "sk-bench-" + secrets.token_hex(8)
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "llmgw", "up", "--state-dir", str(tmp / "up"),
                                 f"--gateway-port={gw}", f"--admin-port={admin}", f"--catalog={catalog}"],
                                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env={**os.environ,
                                                                                  "LLMGW_CLIENT_KEY": key})
    try:
        _wait_port(gw, proc, "llmgw up")
        time.sleep(1.0)  # the agent connects and reports: a start now is not held for its first report
        return [_trial(gw, key, f"cold{i}", log.read_text) for i in range(trials)]
    finally:
        proc.terminate()
        proc.wait(20)


def run_procs(trials: int, tmp: Path) -> list[dict[str, float]]:
    import httpx

    from tests.support.trust import ca_root_args, join_token

    admin_key, key = "sk-admin-" + secrets.token_hex(8), "sk-bench-" + secrets.token_hex(8)
    admin, gw = free_port(), free_port()
    url = f"https://127.0.0.1:{admin}"
    logs = {role: tmp / f"{role}.log" for role in ("control", "agent", "gateway")}
    procs: list[subprocess.Popen[bytes]] = []

    def start(role: str, args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        with logs[role].open("wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "llmgw", role, *args], cwd=ROOT, stdout=out,
                                    stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        procs.append(proc)
        return proc

    try:
        control = start("control", ["--state-dir", str(tmp / "control"), f"--raft-addr=127.0.0.1:{free_port()}",
                                    f"--admin-addr=127.0.0.1:{admin}", *ca_root_args()],
                        {"LLMGW_ADMIN_KEY": admin_key, "LLMGW_CLIENT_KEY": key})
        _wait_port(admin, control, "llmgw control")
        start("agent", ["--control", url, "--state-dir", str(tmp / "agent"), "--node", "n1", "--stop-engines-on-exit",
                        f"--join-token={join_token(url, admin_key, 'agent', 'n1', wait_s=60)}"])
        gateway = start("gateway", ["--control", url, f"--listen=127.0.0.1:{gw}", "--name", "gw1", "--state-dir",
                                    str(tmp / "gateway"),
                                    f"--join-token={join_token(url, admin_key, 'gateway', 'gw1', wait_s=60)}"])
        with httpx.Client(base_url=url, verify=False, headers={"authorization": f"Bearer {admin_key}"}) as c:
            for model in _catalog(trials):
                c.post("/api/v1/models", json=model).raise_for_status()
        _wait_port(gw, gateway, "llmgw gateway")
        time.sleep(2.0)  # the agent and the gateway follow the leader and get its table
        return [_trial(gw, key, f"cold{i}", logs["agent"].read_text) for i in range(trials)]
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            proc.wait(20)


def _med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=9, help="cold starts per mode (and engines started by hand)")
    parser.add_argument("--modes", default="up,procs", help="comma-separated: up, procs")
    opts = parser.parse_args()
    modes = [m for m in opts.modes.split(",") if m]
    with tempfile.TemporaryDirectory(prefix="llmgw-activation-") as d:
        tmp = Path(d)
        hand = by_hand(opts.trials, tmp)
        base = _med(hand)
        results = {m: (run_up if m == "up" else run_procs)(opts.trials, tmp) for m in modes}
    engine_up = base  # spawn to first token, by hand
    print(f"\nactivation of an on-demand sim model, {opts.trials} trials per mode; medians (ms); baseline: the sim "
          f"engine started by hand, spawn to first token: {base:.0f} ms (min {min(hand):.0f}, max {max(hand):.0f})")
    print("| mode | request → first token | ask → start | start → ready | ready → first token "
          f"| overhead (total − by hand) | goal ≤ {GOAL_MS:g} ms |")
    print("|---|---|---|---|---|---|---|")
    worst = 0.0
    for mode, trials in results.items():
        over = _med([t["total"] - engine_up for t in trials])
        worst = max(worst, over)
        print(f"| {mode} | {_med([t['total'] for t in trials]):.0f} | {_med([t['ask_start'] for t in trials]):.0f} "
              f"| {_med([t['start_ready'] for t in trials]):.0f} | {_med([t['ready_first'] for t in trials]):.0f} "
              f"| {over:.0f} | {'PASS' if over <= GOAL_MS else 'MISS'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
