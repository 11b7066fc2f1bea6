"""`llmgw up` on a port another process holds: it stops at once, naming the port and the
flag that picks another (the gateway's case is in test_up.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(("flag", "what"), [("--admin-port", "admin API"), ("--raft-port", "Raft")])
def test_a_busy_port_names_itself_and_its_flag(tmp_path: Path, flag: str, what: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ports = {"--gateway-port": "0", "--admin-port": "0", flag: str(port)}
        out = subprocess.run([sys.executable, "-m", "llmgw", "up", "--state-dir", str(tmp_path / "s"),
                              *(word for pair in ports.items() for word in pair)],
                             capture_output=True, text=True, timeout=60,
                             env={k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")})
    assert out.returncode == 1, out.stderr
    assert (f"cannot start: the {what} port 127.0.0.1:{port} is already in use (another llmgw up?); "
            f"pick another with {flag}") in out.stderr
    assert "Traceback" not in out.stderr
