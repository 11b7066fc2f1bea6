"""Run a role until SIGINT/SIGTERM, then cancel it and let it stop its children."""

from __future__ import annotations

import logging
import signal
from collections.abc import Awaitable, Callable
from typing import Any

import trio

log = logging.getLogger("llmgw.lifecycle")


async def serve_until_signal(serve: Callable[..., Awaitable[Any]], *args: Any) -> int:
    """Run `serve(*args)` until a stop signal; 0 after a clean stop, 1 when it cannot start.

    The signal receiver stays open until everything has stopped: a second Ctrl-C or
    SIGTERM during shutdown must not kill the process before its engines.
    """
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        status = 0
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_stop_on_signal, signals, nursery.cancel_scope)
                await serve(*args)
                nursery.cancel_scope.cancel()
        except* OSError as group:  # a port in use, an unwritable state dir, ...
            log.error("cannot start: %s", first_error(group))
            status = 1
        # Swallow signals that arrived while stopping; trio would re-raise them on exit.
        while True:
            with trio.move_on_after(0.05) as scope:
                await signals.__anext__()
            if scope.cancelled_caught:
                break
        return status


def first_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    leaf: BaseException = group
    while isinstance(leaf, BaseExceptionGroup):
        leaf = leaf.exceptions[0]
    return leaf


async def _stop_on_signal(signals: Any, scope: trio.CancelScope) -> None:
    async for signum in signals:
        log.info("%s received: stopping (engines included)", signal.Signals(signum).name)
        scope.cancel()
        return
