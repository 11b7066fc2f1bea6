"""The simulator's process: its server on a socket (the gateway's lean front end), signals, and the
command line of `llmgw engine sim` (and `python -m llmgw.engines.sim`). Owns `serve`, `run`, `main`.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from functools import partial

import trio

from llmgw.domain.timeouts import TIMEOUTS
from llmgw.engines.args import engine_parser, parse_engine_args
from llmgw.engines.base import EngineError
from llmgw.engines.sim.app import SimApp, SimOptions, make_app
from llmgw.engines.sim.group import GroupGate, GroupRole, run_group
from llmgw.engines.sim.requests import parse_unsafe
from llmgw.errors import first_error
from llmgw.net import url_host
from llmgw.wire.front import Front, listen_socket

__all__ = ["EXIT_AFTER_STATUS", "FAIL_START_STATUS", "main", "run", "serve"]

logger = logging.getLogger("llmgw.engine.sim")

FAIL_START_STATUS = 3
EXIT_AFTER_STATUS = 4  # `--exit-after`: it served, then exits with an error


async def serve(
    opts: SimOptions,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
    app: SimApp | GroupGate | None = None,
) -> None:
    """Serve until cancelled, or until `shutdown_trigger` returns (in-flight requests get a grace).

    Reports the base URL it listens on (`http://HOST:PORT`, the real port when
    `opts.port` is 0) through `task_status`. `app` replaces the sim's own (a group's gate).
    """
    served = app or make_app(opts)
    # A separate process: it reads the default table (the gateway's upstream_idle_s is set below its keep-alive).
    timeouts = dataclasses.replace(TIMEOUTS, gateway_keep_alive_s=TIMEOUTS.sim_keep_alive_s,
                                   gateway_shutdown_grace_s=TIMEOUTS.sim_shutdown_grace_s)
    sock = await listen_socket(opts.host, opts.port)
    try:
        front = Front(served, timeouts=timeouts, server_header=b"")
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(front.serve, [sock], shutdown_trigger=shutdown_trigger))
            host, port = sock.getsockname()[:2]
            url = f"http://{url_host(host)}:{port}"
            logger.info("sim engine %s (role %s) listening on %s", opts.model, opts.role, url)
            task_status.started(url)
    finally:
        sock.close()


async def _main(opts: SimOptions) -> int:
    status = 0
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_stop_on_signal, signals, stop, nursery.cancel_scope)
            await trio.sleep(opts.startup_delay)
            if opts.fail_start:
                print(
                    f"llmgw sim: simulated start failure of model {opts.model} (--fail-start)",
                    file=sys.stderr,
                    flush=True,
                )
                status = FAIL_START_STATUS
            elif opts.group is not None:
                status = await run_group(opts.group, opts.model, make_app(opts), partial(serve, opts), stop)
            elif opts.exit_after > 0:
                with trio.move_on_after(opts.exit_after):
                    await serve(opts, shutdown_trigger=stop.wait)
                if not stop.is_set():
                    print(f"llmgw sim: simulated failure of model {opts.model} after serving {opts.exit_after:g} s "
                          f"(--exit-after)", file=sys.stderr, flush=True)
                    status = EXIT_AFTER_STATUS
            else:
                await serve(opts, shutdown_trigger=stop.wait)
            nursery.cancel_scope.cancel()
    return status


async def _stop_on_signal(signals: AsyncIterator[int], stop: trio.Event, scope: trio.CancelScope) -> None:
    async for signum in signals:
        logger.info("sim engine stopping on %s", signal.Signals(signum).name)
        stop.set()
        # Graceful shutdown is a deadline, not a wait: in-flight streams get the grace, then are cut.
        scope.deadline = min(scope.deadline, trio.current_time() + TIMEOUTS.sim_shutdown_grace_s)
        return


def run(opts: SimOptions) -> int:
    """Process entry: serve until SIGINT/SIGTERM; exit status 3 after the delay with fail_start."""
    try:
        make_app(opts)  # refuse bad options before waiting out the startup delay
    except ValueError as error:
        print(f"llmgw sim: {error}", file=sys.stderr)
        return 2
    try:
        return trio.run(_main, opts)
    except ExceptionGroup as group:
        bind_errors, others = group.split(OSError)
        if bind_errors is None or others is not None:
            raise
        cause = first_error(bind_errors)
        print(f"llmgw sim: cannot listen on {opts.host}:{opts.port}: {cause}", file=sys.stderr)
        return 1


def main(argv: Sequence[str] | None = None) -> int:
    """`llmgw engine sim` and `python -m llmgw.engines.sim`: where to listen and what to
    answer as, then the tunables of `ENGINE_ARGS["sim"]`."""
    parser = engine_parser("sim", prog="llmgw engine sim",
                           description="the simulator: an OpenAI-compatible server with deterministic answers",
                           role_help="guard gives Llama Guard-style answers")
    group = parser.add_argument_group("multi-node replicas (the sim plays each rank)")
    group.add_argument("--group-rank", type=int, help="this process's rank; 0 leads and serves")
    group.add_argument("--group-size", type=int, help="how many ranks the group has")
    group.add_argument("--group-leader", help="HOST:PORT where rank 0 listens for the others")
    parser.add_argument("--unsafe", action="append", default=[], metavar="WORD=CODE",
                        help="as a judge (--role guard): a text whose judged turn holds WORD is unsafe with hazard "
                             "CODE (S1..S14); repeatable")
    ns, extra = parser.parse_known_args(argv)
    try:
        tunables = parse_engine_args("sim", extra)
        role = _group_role(ns.group_rank, ns.group_size, ns.group_leader)
        unsafe = tuple(parse_unsafe(item) for item in ns.unsafe)
    except (EngineError, ValueError) as error:
        print(f"llmgw sim: {getattr(error, 'message', error)}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return run(SimOptions(host=ns.host, port=ns.port, model=ns.model, role=ns.role, group=role, unsafe=unsafe,
                          **tunables))


def _group_role(rank: int | None, size: int | None, leader: str | None) -> GroupRole | None:
    if rank is None and size is None and leader is None:
        return None
    if rank is None or size is None or leader is None:
        raise ValueError("--group-rank, --group-size and --group-leader go together")
    return GroupRole.parse(rank, size, leader)

