"""The `--workers` parent with stand-in workers (tiny Python processes that print the ready line, then
crash, hang or ignore SIGTERM as told): a worker that cannot start fails the start, one that keeps
dying is restarted with backoff and reported, and on stop every worker ends, a stubborn one killed."""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import replace

import pytest
import trio

from llmgw.domain.timeouts import TIMEOUTS
from llmgw.errors import first_error
from llmgw.gateway import workers
from llmgw.startup import CannotStart
from tests.support.processes import alive, children_of

pytestmark = pytest.mark.slow

CHILD = """
import signal, sys, time
mode = sys.argv[1]
if mode == "fail":
    sys.exit(3)
if mode == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("llmgw gateway ready url=http://127.0.0.1:1/v1", flush=True)
if mode == "crash":
    time.sleep(0.1)
    sys.exit(1)
time.sleep(60)
"""

FAST = replace(TIMEOUTS, gateway_worker_restart_min_s=0.05, gateway_worker_restart_max_s=0.2,
               gateway_worker_stable_s=5.0, gateway_worker_stop_s=0.3, gateway_worker_start_s=10.0)


def config(modes: dict[int, str]) -> workers.WorkersConfig:
    return workers.WorkersConfig(count=len(modes), listen_host="127.0.0.1", listen_port=0, timeouts=FAST,
                                 command=lambda index, listen: [sys.executable, "-c", CHILD, modes[index]])


async def test_a_worker_that_cannot_start_fails_the_start_and_stops_the_others() -> None:
    cfg = config({1: "serve", 2: "fail"})
    before = children_of(os.getpid())  # (the suite's other tests may leave a child of their own running)
    with pytest.raises(BaseExceptionGroup) as info:
        async with trio.open_nursery() as nursery:
            await nursery.start(workers.serve, cfg)
    failure = first_error(info.value)
    assert isinstance(failure, CannotStart)
    assert str(failure) == "gateway worker w2 exited with status 3 before it was ready"
    assert children_of(os.getpid()) - before == set()  # w1, which served, was stopped too


async def test_a_worker_that_keeps_dying_is_restarted_with_backoff_and_all_stop_at_the_end(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "llmgw.gateway.workers")
    async with trio.open_nursery() as nursery:
        handle: workers.WorkersHandle = await nursery.start(workers.serve, config({1: "crash", 2: "stubborn"}))
        crashing, stubborn = handle.workers
        steady_pid = stubborn.pid
        assert handle.url.startswith("http://127.0.0.1:") and not handle.url.endswith(":0")
        with trio.fail_after(20):
            while crashing.starts < 5:
                await trio.sleep(0.05)
        assert stubborn.pid == steady_pid and stubborn.starts == 1  # the other worker served on, untouched
        nursery.cancel_scope.cancel()
    assert not alive(steady_pid or 0)
    text = caplog.text
    assert "gateway worker w1 (pid" in text and "exited with status 1 after" in text
    assert "gateway worker w1 keeps dying: exited with status 1" in text and "3 times in a row" in text
    assert f"gateway worker pid {steady_pid} still running 0.3 s after SIGTERM: killing it" in text
    # Backoff, not a hot loop: the waits announced grow, up to the longest.
    assert "again in 0.05 s" in text and "next try in 0.2 s" in text
