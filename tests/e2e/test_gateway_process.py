"""`llmgw gateway` as its own process (S14), beside `llmgw control` and `llmgw agent`: a chat
request through it is answered by an engine the agent runs; `/health` says whom it follows
and how old its table is; SIGTERM stops it cleanly; its state dir is locked."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.support.processes import free_port
from tests.support.trust import ca_root_args, join_token, offline_credentials

pytestmark = pytest.mark.slow

ADMIN = "sk-gwproc-admin"
CLIENT = "sk-gwproc-client"  # /v1 takes client keys only


def start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, "-m", "llmgw", *args], stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, **env})


def test_a_gateway_process_serves_through_the_leader(tmp_path: Path) -> None:
    admin_port, gw_port = free_port(), free_port()
    admin_url, gw_url = f"https://127.0.0.1:{admin_port}", f"http://127.0.0.1:{gw_port}"
    logs = {name: tmp_path / f"{name}.log" for name in ("control", "agent", "gateway")}

    def said() -> str:
        return "\n".join(f"--- {n}\n{p.read_text()}" for n, p in logs.items() if p.exists())

    control = start(["control", "--state-dir", str(tmp_path / "control"), "--raft-addr", f"127.0.0.1:{free_port()}",
                     "--admin-addr", f"127.0.0.1:{admin_port}", *ca_root_args()],
                    {"LLMGW_ADMIN_KEY": ADMIN, "LLMGW_CLIENT_KEY": CLIENT}, logs["control"])
    try:  # each machine joins with a token of its own (it trusts the test root, as the system's store)
        tokens = {role: join_token(admin_url, ADMIN, role, name, wait_s=60, proc=control)
                  for role, name in (("agent", "worker-1"), ("gateway", "gw-1"))}
    except AssertionError as e:
        control.kill()
        raise AssertionError(f"{e}\n{said()}") from None
    agent = start(["agent", "--stop-engines-on-exit", "--control", admin_url, "--state-dir", str(tmp_path / "agent"),
                   "--node", "worker-1", "--join-token", tokens["agent"]], {}, logs["agent"])
    # The first --control URL is dead: the gateway joins through, and moves on to, the one that answers.
    gateway = start(["gateway", "--control", f"https://127.0.0.1:{free_port()}", "--control", admin_url,
                     "--listen", f"127.0.0.1:{gw_port}", "--state-dir", str(tmp_path / "gateway"), "--name", "gw-1",
                     "--join-token", tokens["gateway"]], {}, logs["gateway"])
    procs = (gateway, agent, control)

    try:
        with httpx.Client(base_url=admin_url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=5) as api, \
                httpx.Client(base_url=gw_url, headers={"Authorization": f"Bearer {CLIENT}"}, timeout=10) as gw:
            deadline = time.monotonic() + 30
            while True:
                assert all(p.poll() is None for p in procs), said()
                assert time.monotonic() < deadline, said()
                try:
                    if api.post("/api/v1/models", json={"name": "remote", "engine": "sim",
                                                        "source": "sim://remote"}).status_code in (200, 201):
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
            deadline = time.monotonic() + 40
            reply = None
            while time.monotonic() < deadline:
                try:
                    r = gw.post("/v1/chat/completions", json={"model": "remote", "messages": [
                        {"role": "user", "content": "via a gateway process"}]})
                    if r.status_code == 200:
                        reply = r.json()
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
            assert reply is not None, said()
            assert reply["choices"][0]["message"]["content"] == "sim says: via a gateway process"
            health = gw.get("/health").json()
            assert health["status"] == "ok" and health["leader"] == admin_url, health
            assert isinstance(health["table_age_s"], (int, float)) and health["table_age_s"] < 5, health
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(15)
    assert [p.returncode for p in procs] == [0, 0, 0], said()
    text = logs["gateway"].read_text()
    assert f"following the leader at {admin_url}" in text and "Traceback" not in text, text
    assert (tmp_path / "gateway" / "logs" / "gateway.log").exists()


def test_a_gateway_refuses_a_state_dir_in_use(tmp_path: Path) -> None:
    from llmgw import statedir

    state = tmp_path / "state"
    with statedir.acquire(state, "llmgw up"):
        out = subprocess.run([sys.executable, "-m", "llmgw", "gateway", "--control", f"https://127.0.0.1:{free_port()}",
                              "--listen", f"127.0.0.1:{free_port()}", "--state-dir", str(state), "--join-token", "unused"],
                             capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert out.stderr.strip() == (f"error: state dir {state.resolve()} is in use by pid {os.getpid()} (llmgw up); "
                                  "stop it first or use --state-dir")


def test_a_gateway_names_a_busy_listen_port_and_its_flag(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # A gateway that joined before: it gets past its credential to its port without a cluster.
        offline_credentials(tmp_path / "gw", "gateway", "gw-busy")
        out = subprocess.run([sys.executable, "-m", "llmgw", "gateway", "--control", f"https://127.0.0.1:{free_port()}",
                              "--listen", f"127.0.0.1:{port}", "--state-dir", str(tmp_path / "gw"), "--name", "gw-busy"],
                             capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out.stderr
    assert (f"cannot start: the gateway port 127.0.0.1:{port} is already in use (another llmgw up?); "
            "pick another with --listen") in out.stderr
    assert "Traceback" not in out.stderr
