"""`llmgw control` and `llmgw agent` as separate processes (S14): the agent joins over
the network protocol, and a model served through the admin API runs on it; a start
that cannot finish stops on SIGTERM; a state dir in use is refused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.support.processes import alive, children_of, free_port
from tests.support.trust import ca_root_args, create_token

pytestmark = pytest.mark.slow

ADMIN = "sk-roles-admin"


def start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, "-m", "llmgw", *args], stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, **env})


def test_control_and_agent_processes(tmp_path: Path) -> None:
    admin_port = free_port()
    admin_url = f"https://127.0.0.1:{admin_port}"
    control = start(["control", "--state-dir", str(tmp_path / "control"), "--raft-addr", f"127.0.0.1:{free_port()}",
                     "--admin-addr", f"127.0.0.1:{admin_port}", *ca_root_args()], {"LLMGW_ADMIN_KEY": ADMIN},
                    tmp_path / "control.log")
    # The agent joins as an operator joins a machine: a token made with the admin key, the CA pinned by its hash.
    try:
        token = create_token(admin_url, ADMIN, "agent", "worker-1", wait_s=60, proc=control)
    except AssertionError as e:
        control.kill()
        raise AssertionError(f"{e}\n{(tmp_path / 'control.log').read_text()}") from None
    agent = start(["agent", "--stop-engines-on-exit", "--control", admin_url, "--state-dir", str(tmp_path / "agent"),
                   "--node", "worker-1", "--join-token", token["token"], "--ca-hash", token["ca_hash"]],
                  {}, tmp_path / "agent.log")
    engines: set[int] = set()
    try:
        with httpx.Client(base_url=admin_url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=5) as api:
            deadline = time.monotonic() + 30
            nodes: list[dict[str, object]] = []
            while time.monotonic() < deadline:
                try:
                    nodes = api.get("/api/v1/nodes").json()["nodes"]
                except httpx.HTTPError:
                    nodes = []
                if nodes:
                    break
                time.sleep(0.2)
            assert [(n["node"], n["connected"]) for n in nodes] == [("worker-1", True)], (tmp_path / "agent.log").read_text()

            r = api.post("/api/v1/models", json={"name": "remote", "engine": "sim", "source": "sim://remote"})
            assert r.status_code == 201
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                status = api.get("/api/v1/models/remote").json()["model"]["status"]
                if status["ready"] == 1:
                    break
                time.sleep(0.2)
            assert status["ready"] == 1, status
            url = status["replicas"][0]["url"]
            reply = httpx.post(f"{url}/v1/chat/completions", json={"model": "remote", "messages": [
                {"role": "user", "content": "on a worker"}]}).json()
            assert reply["choices"][0]["message"]["content"] == "sim says: on a worker"
            engines = children_of(agent.pid)
            assert engines
    finally:
        for proc in (agent, control):
            proc.send_signal(signal.SIGTERM)
        for proc in (agent, control):
            proc.wait(15)
    assert (agent.returncode, control.returncode) == (0, 0), "a stop signal is a clean stop"
    time.sleep(0.3)
    assert not any(alive(p) for p in engines), "the agent's engines outlived it"


def wait_for_line(log: Path, text: str, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text():
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, f"no {text!r} in:\n{log.read_text()}"
        time.sleep(0.05)


def test_a_start_that_cannot_finish_stops_on_sigterm_and_says_why(tmp_path: Path) -> None:
    """A two-member group whose other member never comes has no leader, so the store never
    becomes ready: SIGTERM must still stop the process, within 10 s, saying what it waited for."""
    missing = f"127.0.0.1:{free_port()}"
    log = tmp_path / "control.log"
    control = start(["control", "--state-dir", str(tmp_path / "control"), "--raft-addr", f"127.0.0.1:{free_port()}",
                     "--admin-addr", f"127.0.0.1:{free_port()}", "--peer", missing],
                    {"LLMGW_ADMIN_KEY": ADMIN}, log)
    try:
        wait_for_line(log, "raft member", control)
        t0 = time.monotonic()
        control.send_signal(signal.SIGTERM)
        status = control.wait(10)
        elapsed = time.monotonic() - t0
    finally:
        control.kill()
        control.wait()
    text = log.read_text()
    assert status == 1, text
    assert elapsed < 10
    assert "stopped before ready: the Raft store did not become ready (no leader among 2 members" in text
    assert missing in text and "Traceback" not in text


@pytest.mark.parametrize("role", ["control", "agent"])
def test_a_role_refuses_a_state_dir_in_use(tmp_path: Path, role: str) -> None:
    from llmgw import statedir

    state = tmp_path / "state"
    args = {"control": ["control", "--raft-addr", f"127.0.0.1:{free_port()}", "--admin-addr", f"127.0.0.1:{free_port()}"],
            "agent": ["agent", "--control", f"https://127.0.0.1:{free_port()}", "--join-token", "unused"]}[role]
    with statedir.acquire(state, "llmgw up"):
        out = subprocess.run([sys.executable, "-m", "llmgw", *args, "--state-dir", str(state)], capture_output=True,
                             text=True, timeout=60, env={**os.environ, "LLMGW_ADMIN_KEY": ADMIN})
        assert out.returncode == 1
        assert out.stderr.strip() == (f"error: state dir {state.resolve()} is in use by pid {os.getpid()} (llmgw up); "
                                      "stop it first or use --state-dir")
        assert [p.name for p in state.iterdir()] == ["lock"]


def test_control_names_a_busy_admin_port_and_its_flag(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "llmgw", "control", "--state-dir", str(tmp_path / "c"),
             "--raft-addr", f"127.0.0.1:{free_port()}", "--admin-addr", f"127.0.0.1:{port}"],
            env={**os.environ, "LLMGW_ADMIN_KEY": ADMIN}, capture_output=True, text=True, timeout=60,
        )
    assert done.returncode == 1, done.stderr
    assert (f"cannot start: the admin API port 127.0.0.1:{port} is already in use (another llmgw up?); "
            "pick another with --admin-addr") in done.stderr
    assert "Traceback" not in done.stderr
