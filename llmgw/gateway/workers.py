"""`llmgw gateway --workers N`: a parent that holds the port and runs N gateway processes sharing it
(`SO_REUSEPORT`), each with its own route feed and request log; restarts a worker that dies, with backoff.

The parent serves nothing itself. It reserves the port first (a socket bound with `SO_REUSEPORT` but
never listening: the kernel hands it no connection, and nobody else can take the port while it lives),
then starts the workers (`python -m llmgw gateway ... --worker-of PARENT_PID`), each a whole gateway
named `NAME-wI` with its own state dir `STATE_DIR/workers/wI`. It is ready when every worker is; on
stop it sends each worker SIGTERM (their graceful stop) and kills one still running after
`gateway_worker_stop_s`. A worker's side is `serve_worker`: the gateway, plus a watch that stops it
when its parent is gone (even a SIGKILLed parent leaves no worker behind).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from llmgw.domain.timeouts import TIMEOUTS, Timeouts
from llmgw.logs import role_var
from llmgw.net import url_host
from llmgw.startup import CannotStart, waiting_for
from llmgw.wire.front import listen_socket

if TYPE_CHECKING:
    from llmgw.gateway.follower import GatewayConfig

log = logging.getLogger("llmgw.gateway.workers")

READY_PREFIX = "llmgw gateway ready "  # the line a gateway prints on stdout once it serves
QUICK_DEATHS_REPORTED = 3  # this many quick deaths in a row are logged as an error, not a warning


def worker_name(name: str, index: int) -> str:
    """How control lists worker `index` (from 1) and what its request ids carry: `gw-w2` -> `req-gww2-...`."""
    return f"{name}-w{index}"


def worker_role(name: str) -> str:
    """How a worker's own log lines name it: `gateway-w2`."""
    return "gateway-" + name.rpartition("-")[2]


def worker_state_dir(state_dir: Path, index: int) -> Path:
    return state_dir / "workers" / f"w{index}"


def gateway_command(controls: Sequence[str], name: str, state_dir: Path | None, *, log_json: bool,
                    log_level: str, tls_cert: Path | None = None,
                    tls_key: Path | None = None) -> Callable[[int, str], list[str]]:
    """(index, HOST:PORT) -> the command line of that worker. It authenticates to control with the
    certificate its parent joined with (STATE_DIR/tls): nothing secret is on a command line `ps` shows."""

    def command(index: int, listen: str) -> list[str]:
        argv = [sys.executable, "-m", "llmgw", "gateway", "--listen", listen, "--name", worker_name(name, index),
                "--log-level", log_level, "--worker-of", str(os.getpid())]
        for url in controls:
            argv += ["--control", url]
        if state_dir is not None:
            argv += ["--state-dir", str(worker_state_dir(state_dir.resolve(), index))]
        if log_json:
            argv.append("--log-json")
        if tls_cert is not None and tls_key is not None:
            argv += ["--tls-cert", str(tls_cert.resolve()), "--tls-key", str(tls_key.resolve())]
        return argv

    return command


async def reserve_port(host: str, port: int) -> trio.socket.SocketType:
    """Bind host:port (0: a free one) with `SO_REUSEPORT` and never listen: the workers' listeners
    join it, the kernel gives it no connection, and the port stays ours while it is open."""
    return await listen_socket(host, port, reuse_port=True, listen=False)


@dataclass
class Restarts:
    """When a worker that died starts again: at once-ish after a long life, later and later while it
    keeps dying soon after its start (never a hot loop)."""

    timeouts: Timeouts = TIMEOUTS
    quick_deaths: int = 0  # in a row

    def after_death(self, lived_s: float) -> float:
        """The wait before the next start of a worker that ran `lived_s` seconds."""
        t = self.timeouts
        self.quick_deaths = self.quick_deaths + 1 if lived_s < t.gateway_worker_stable_s else 0
        return min(t.gateway_worker_restart_min_s * 2.0 ** max(0, self.quick_deaths - 1), t.gateway_worker_restart_max_s)


@dataclass
class Worker:
    index: int  # from 1
    pid: int | None = None  # the process running now; None between two starts
    starts: int = 0
    first_ready: trio.Event = field(default_factory=trio.Event)


@dataclass
class WorkersConfig:
    count: int
    listen_host: str
    listen_port: int  # 0: any free port (reserved by the parent, shared by every worker)
    command: Callable[[int, str], list[str]]  # (index, HOST:PORT) -> that worker's command line
    env: dict[str, str] | None = None  # the workers' environment (None: this process's)
    state_dir: Path | None = None  # the parent's; each worker's is worker_state_dir(state_dir, index)
    timeouts: Timeouts = TIMEOUTS


@dataclass
class WorkersHandle:
    url: str  # http://host:port, the port every worker serves (the API is under /v1)
    workers: list[Worker]


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with status {returncode}"


async def serve(config: WorkersConfig, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Reserve the port, start every worker, report a `WorkersHandle` once all are ready; then keep
    them running until cancelled (each then gets its SIGTERM and is waited for)."""
    role_var.set("gateway")
    if config.count < 2:
        raise ValueError("a gateway with workers runs at least 2")
    if config.count > (os.cpu_count() or config.count):
        log.warning("%d workers on %d cores: beyond one per core they only compete for the cores",
                    config.count, os.cpu_count())
    with await reserve_port(config.listen_host, config.listen_port) as reserved:
        host, port = reserved.getsockname()[:2]
        listen = f"{url_host(host)}:{port}"
        workers = [Worker(i) for i in range(1, config.count + 1)]
        async with trio.open_nursery() as nursery:
            for worker in workers:
                nursery.start_soon(_keep, config, worker, listen)

            def waiting() -> str:
                late = [f"w{w.index}" for w in workers if not w.first_ready.is_set()]
                return f"gateway workers {', '.join(late)} not ready yet"

            with waiting_for(waiting):
                for worker in workers:
                    await worker.first_ready.wait()
            log.info("%d gateway workers serving on http://%s (pids %s)", len(workers), listen,
                     ", ".join(str(w.pid) for w in workers))
            task_status.started(WorkersHandle(f"http://{listen}", workers))


async def _keep(config: WorkersConfig, worker: Worker, listen: str) -> None:
    """Run worker `worker.index` until cancelled: start it, wait for its ready line, restart it when it dies."""
    t = config.timeouts
    restarts = Restarts(t)
    where = (f"; its log: {worker_state_dir(config.state_dir, worker.index) / 'logs' / 'gateway.log'}"
             if config.state_dir is not None else "")
    while True:
        worker.starts += 1
        started = trio.current_time()
        returncode, was_ready = await _run_once(config, worker, listen)
        lived = trio.current_time() - started
        how = describe_exit(returncode) if returncode is not None else f"not ready within {t.gateway_worker_start_s:g} s"
        if not worker.first_ready.is_set():  # the first start: a worker that cannot start fails the gateway's
            raise CannotStart(f"gateway worker w{worker.index} {how} before it was ready{where}")
        delay = restarts.after_death(lived if was_ready else 0.0)
        if restarts.quick_deaths >= QUICK_DEATHS_REPORTED:
            log.error("gateway worker w%d keeps dying: %s %.1f s after its start, %d times in a row; the other "
                      "workers serve meanwhile; next try in %g s%s", worker.index, how, lived,
                      restarts.quick_deaths, delay, where)
        else:
            log.warning("gateway worker w%d (pid %s) %s after %.1f s; starting it again in %g s%s", worker.index,
                        worker.pid, how, lived, delay, where)
        worker.pid = None
        await trio.sleep(delay)


async def _run_once(config: WorkersConfig, worker: Worker, listen: str) -> tuple[int | None, bool]:
    """One life of a worker: (its exit status, or None when it was stopped for not getting ready; whether
    it got ready). Cancelled, it stops the worker (SIGTERM, then SIGKILL) before returning."""
    t = config.timeouts
    command = config.command(worker.index, listen)
    ready = trio.Event()
    settled = trio.Event()  # ready, or its stdout closed (it exited)
    async with trio.open_nursery() as nursery:
        proc: trio.Process = await nursery.start(partial(
            trio.run_process, command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, check=False, env=config.env,
            start_new_session=True,  # a Ctrl-C reaches the parent alone, which stops the workers in order
            deliver_cancel=partial(_stop, t=t)))
        worker.pid = proc.pid
        assert proc.stdout is not None
        nursery.start_soon(_read_stdout, proc.stdout, ready, settled)
        with trio.move_on_after(t.gateway_worker_start_s):
            await settled.wait()
        if not ready.is_set():
            if settled.is_set():  # its stdout closed: it is exiting
                with trio.move_on_after(t.gateway_worker_stop_s):
                    await proc.wait()
            if proc.poll() is None:  # neither ready nor gone: stop it, and say why
                await _stop(proc, t=t)
                await proc.wait()
                return None, False
            return proc.returncode, False
        log.info("gateway worker w%d ready (pid %d)", worker.index, proc.pid)
        worker.first_ready.set()
        await proc.wait()
    return proc.returncode, True


async def _read_stdout(stream: trio.abc.ReceiveStream, ready: trio.Event, settled: trio.Event) -> None:
    """Find the worker's ready line, then drain its stdout (a full pipe would block it) until it closes."""
    pending = b""
    try:
        async for chunk in stream:
            if ready.is_set():
                continue
            pending += chunk
            lines = pending.split(b"\n")
            pending = lines.pop()
            if any(line.decode(errors="replace").startswith(READY_PREFIX) for line in lines):
                ready.set()
                settled.set()
    except trio.ClosedResourceError:
        pass
    settled.set()


async def _stop(proc: trio.Process, *, t: Timeouts) -> None:
    """SIGTERM (the worker's own graceful stop lets requests in flight finish), SIGKILL after `gateway_worker_stop_s`."""
    proc.send_signal(signal.SIGTERM)
    with trio.move_on_after(t.gateway_worker_stop_s):
        await proc.wait()
        return
    log.warning("gateway worker pid %d still running %g s after SIGTERM: killing it", proc.pid, t.gateway_worker_stop_s)
    proc.kill()


# --- the worker's side ------------------------------------------------------------------


async def serve_worker(config: GatewayConfig, parent_pid: int, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """A worker: `follower.serve(config)` (its config shares the port), stopped when its parent is gone."""
    from llmgw.gateway import follower

    async with trio.open_nursery() as nursery:
        nursery.start_soon(_watch_parent, parent_pid, config.timeouts.gateway_worker_parent_poll_s,
                           nursery.cancel_scope)

        async def run(*, task_status: trio.TaskStatus[follower.GatewayHandle]) -> None:
            await follower.serve(config, task_status=task_status)
            nursery.cancel_scope.cancel()  # drained for a restart in place: the watch ends too

        handle: follower.GatewayHandle = await nursery.start(run)
        task_status.started(handle)


async def _watch_parent(parent_pid: int, poll_s: float, scope: trio.CancelScope) -> None:
    while os.getppid() == parent_pid:
        await trio.sleep(poll_s)
    log.warning("the parent gateway (pid %d) is gone: stopping this worker", parent_pid)
    scope.cancel()
