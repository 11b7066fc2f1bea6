"""Engines never depend on the agent's working directory: a folder named `llmgw` there (or on
PYTHONPATH) once shadowed the package and killed every engine at import. Started by the argv
`launch_spec` builds, from such a directory, the sim engine still serves."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from llmgw.engines import launch_spec
from llmgw.engines.base import _BOOT, _package_root
from tests.support.processes import free_port

pytestmark = pytest.mark.slow

START_S = 30.0


@pytest.fixture
def hostile(tmp_path: Path) -> Path:
    """A directory whose `llmgw` package raises on import."""
    (tmp_path / "llmgw").mkdir()
    (tmp_path / "llmgw" / "__init__.py").write_text("raise SystemExit('the shadowing llmgw was imported')\n")
    (tmp_path / "llmgw" / "__main__.py").write_text("raise SystemExit('the shadowing llmgw was run')\n")
    return tmp_path


def serves(argv: list[str], env: dict[str, str], cwd: Path, port: int) -> None:
    log = cwd / "engine.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"engine exited with {proc.returncode}: {log.read_text(errors='replace')}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        pytest.fail("engine not healthy in time")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_a_shadowing_llmgw_in_the_cwd_or_pythonpath_is_ignored(hostile: Path) -> None:
    port = free_port("127.0.0.1")
    launch = launch_spec("sim", model="demo", role="chat", source="sim://demo", host="127.0.0.1", port=port,
                         args=[], cwd=str(hostile / "llmgw"))
    assert launch.argv[1] == "-I"
    # Started in the hostile directory itself (not launch.cwd), with it on PYTHONPATH too.
    env = {**os.environ, **launch.env, "PYTHONPATH": str(hostile)}
    serves(launch.argv, env, hostile, port)


def test_the_shadowing_folder_does_kill_a_plain_start(hostile: Path) -> None:
    # The bug itself: without -I the hostile package wins. Proves the test above can fail.
    done = subprocess.run([sys.executable, "-m", "llmgw", "--help"], cwd=hostile, capture_output=True, text=True,
                          timeout=START_S, check=False)
    assert "the shadowing llmgw was run" in done.stderr or "shadowing" in done.stdout + done.stderr


def test_the_bootstrap_for_a_package_isolation_cannot_find(hostile: Path) -> None:
    # A source checkout run from its directory: `-I -m llmgw` would not find it, so the package's own
    # root goes first on sys.path explicitly.
    port = free_port("127.0.0.1")
    argv = [sys.executable, "-I", "-c", _BOOT, _package_root(), "engine", "sim", "--host", "127.0.0.1",
            "--port", str(port), "--model", "demo"]
    serves(argv, {**os.environ, "PYTHONPATH": str(hostile)}, hostile, port)
