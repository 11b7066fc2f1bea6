"""A stop that does not finish (a shielded task, a blocked loop) still ends the process within
`stop_deadline_s` of the signal, with exit 1 and a line saying so."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.slow

STUCK_ROLE = """
import dataclasses, sys, trio
from llmgw import logs
from llmgw.cli._lifecycle import serve_until_signal
from llmgw.domain.timeouts import TIMEOUTS

async def stuck(*, task_status=trio.TASK_STATUS_IGNORED):
    task_status.started()
    print("ready", flush=True)
    with trio.CancelScope(shield=True):  # a stop that never finishes
        await trio.sleep_forever()

logs.setup()
timeouts = dataclasses.replace(TIMEOUTS, stop_deadline_s=float(sys.argv[1]))
sys.exit(trio.run(lambda: serve_until_signal(stuck, timeouts=timeouts)))
"""


def test_a_stop_that_hangs_is_cut_at_the_deadline() -> None:
    with subprocess.Popen([sys.executable, "-c", STUCK_ROLE, "1.0"], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
            sent = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=8)  # without the deadline it never exits
            took = time.monotonic() - sent
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.stderr is not None
        err = proc.stderr.read()
    assert code == 1
    assert 1.0 <= took < 8
    assert "still stopping 1 s after SIGTERM: exiting now" in err
