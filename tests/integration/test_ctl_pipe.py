"""`llmgw ctl … | head`: a reader that closes the pipe early ends the command quietly, with the exit
status a shell gives a command its SIGPIPE ended (141), never a BrokenPipeError traceback."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmgw.cli import EXIT_BROKEN_PIPE

ROOT = Path(__file__).resolve().parents[2]
# Far more than a pipe's buffer (64 KiB), so the command is still writing when the reader has gone.
MODELS = {"models": [{"name": f"model-{i:05}", "engine": "sim", "role": "chat", "mode": "always",
                      "replicas": {"min": 1, "max": 1}, "status": {"ready": 1, "desired": 1, "state": "ready"}}
                     for i in range(4000)]}


@pytest.fixture
def admin_api() -> Iterator[str]:
    """A stand-in admin API on loopback that answers every GET with a large model list."""
    body = json.dumps(MODELS).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def into_closed_pipe(*argv: str) -> tuple[int, str]:
    """Run `llmgw ARGV` with its stdout a pipe whose reader closed before reading a byte."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with subprocess.Popen([sys.executable, "-m", "llmgw", *argv], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, env=env, cwd=ROOT) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()
        err = proc.stderr.read().decode(errors="replace")
        return proc.wait(timeout=60), err


@pytest.mark.parametrize("as_json", [False, True])
def test_ctl_models_into_a_pipe_closed_early_ends_without_a_traceback(admin_api: str, as_json: bool) -> None:
    rc, err = into_closed_pipe("ctl", "--url", admin_api, "--key", "k", *(["--json"] if as_json else []), "models")
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert rc == EXIT_BROKEN_PIPE == 141, err
