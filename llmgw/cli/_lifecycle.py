"""Run a role until SIGINT/SIGTERM, then cancel it and let it stop its children;
a stop during the start ends it too, saying what the start was waiting for."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from llmgw import startup
from llmgw.domain.timeouts import TIMEOUTS, Timeouts
from llmgw.errors import first_error

log = logging.getLogger("llmgw.lifecycle")


async def serve_until_signal(serve: Callable[..., Awaitable[Any]], *args: Any, timeouts: Timeouts = TIMEOUTS) -> int:
    """Run `serve(*args, task_status=...)` until a stop signal.

    Returns 0 after a clean stop, 1 when it cannot start or is stopped before it calls
    `task_status.started()`. The signals are watched from the first line of the start
    (journal replay, waiting for a leader), not only once serving. The signal receiver
    stays open until everything has stopped: a second Ctrl-C or SIGTERM during shutdown
    must not kill the process before its engines. A stop that has not finished
    `stop_deadline_s` after the signal (a thread that does not let go, a blocked loop)
    ends the process anyway, with exit 1 and a line saying so.
    """
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        status = 0
        stop = _Stop(startup.track(), timeouts.stop_deadline_s)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_stop_on_signal, signals, nursery.cancel_scope, stop)
                await nursery.start(_serve_then_stop, serve, args, nursery.cancel_scope)
                stop.ready = True
        except* (OSError, startup.CannotStart) as group:  # a port in use, no Raft leader, ...
            log.error("cannot start: %s", first_error(group))
            status = 1
        if stop.before_ready is not None:
            log.error("stopped before ready: %s", stop.before_ready)
            status = 1
        # Swallow signals that arrived while stopping; trio would re-raise them on exit.
        while True:
            with trio.move_on_after(_DRAIN_SIGNALS_S) as scope:
                await signals.__anext__()
            if scope.cancelled_caught:
                break
        return status


# Not a timeout: how long a signal already delivered may take to show up in the receiver.
_DRAIN_SIGNALS_S = 0.05


class _Stop:
    """Whether the role got as far as ready, and if a signal came first, what the start awaited."""

    def __init__(self, progress: startup.Progress, deadline_s: float) -> None:
        self.progress = progress
        self.deadline_s = deadline_s
        self.ready = False
        self.before_ready: str | None = None

    def arm_deadline(self, signame: str) -> None:
        """From now on the process ends within `deadline_s`, whatever the event loop is doing.

        A daemon thread, not a trio timer: what overruns may be the loop itself (a join, a
        native call). Engines stop on their own once their agent is gone (`watch_parent`)."""

        def expire() -> None:
            log.error("still stopping %g s after %s: exiting now", self.deadline_s, signame)
            logging.shutdown()
            sys.stderr.flush()
            os._exit(1)

        timer = threading.Timer(self.deadline_s, expire)
        timer.daemon = True
        timer.start()


async def _serve_then_stop(serve: Callable[..., Awaitable[Any]], args: tuple[Any, ...], scope: trio.CancelScope,
                           *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    await serve(*args, task_status=task_status)
    scope.cancel()  # a role that returns by itself is done: stop the signal watcher too


async def _stop_on_signal(signals: Any, scope: trio.CancelScope, stop: _Stop) -> None:
    async for signum in signals:
        name = signal.Signals(signum).name
        if stop.ready:
            log.info("%s received: stopping (engines included)", name)
        else:
            # Asked now, while the start steps still wait: cancelling them forgets what they waited for.
            stop.before_ready = stop.progress.describe() or "the start had not finished"
            log.info("%s received while starting: stopping", name)
        stop.arm_deadline(name)
        scope.cancel()
        return
