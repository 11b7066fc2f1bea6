"""Engine supervision: one process per replica, probed until it serves, then health-polled; engines
left running by an earlier agent are adopted from their state records (llmgw/agent/adoption.py).

The supervisor starts and stops engine processes and reports every state change (starting →
ready, or failed with the reason). It never restarts on its own: the control plane decides, so a
failing model is counted and parked there.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import trio

from llmgw.agent import engine_log
from llmgw.agent.adapters import sync_adapters, sync_launched
from llmgw.agent.adoption import (AdoptedProcess, EngineRecord, Records, StartRefused, read_start, same_process,
                                  start_ticks)
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import NodeInfo, ReplicaObs
from llmgw.domain.timeouts import TIMEOUTS, Timeouts
from llmgw.engines import PARENT_ENV, EngineError, Group, launch_spec, start_failure
from llmgw.engines.vllm import SLEEP_PATH, WAKE_PATH
from llmgw.errors import describe
from llmgw.net import free_port, url_host
from llmgw.wire.protocol_agent import MirrorSource

log = logging.getLogger("llmgw.agent.supervisor")

# Fetches a `mirror://` source into the node's mirror cache (agent/mirror_fetch.py), telling the bytes it holds as
# it goes; the cached file's path, or MirrorFetchFailed with the reason.
Fetcher = Callable[[MirrorSource, Callable[[int], None]], Awaitable[Path]]

# A ready engine is failed after this many /health probes in a row that fail or hang
# (`engine_liveness_poll_s` apart, each `engine_liveness_request_s` at most): one slow answer
# under load is no reason to stop an engine that serves.
LIVENESS_FAILURES = 3

PROPS_PATH = "/props"  # llama.cpp's server properties, its chat template's capabilities among them

# Engines left running for the next agent: their process objects are kept until this process
# exits, since one collected while its child runs warns (ResourceWarning) and closes its pidfd.
_LEFT_RUNNING: list[object] = []


# The refusals that say the engine itself cannot run on this node (not installed, or not in the form or
# version the replica needs), rather than anything about the replica.
ENGINE_MISSING = ("engine_unavailable", "engine_too_old")


class MirrorFetchFailed(Exception):
    """A `mirror://` source could not be fetched: the replica fails with this reason."""


class _Child:
    """An engine this agent started: its exit status is known."""

    def __init__(self, proc: trio.Process) -> None:
        self._proc, self.pid = proc, proc.pid

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    def running(self) -> bool:
        return self._proc.poll() is None

    async def wait(self) -> int:
        return await self._proc.wait()

    def signal_group(self, sig: signal.Signals) -> None:
        if self.running():
            try:
                os.killpg(self.pid, sig)  # its own session: the group is the engine and its helpers
            except ProcessLookupError:
                pass


_Process = _Child | AdoptedProcess  # an engine process: our own child, or one adopted from an earlier agent


@dataclass
class _Replica:
    obs: ReplicaObs
    launch: str = ""  # adoption.launch_hash of what it was started from; "" when it never started
    log_path: Path | None = None
    stopping: bool = False  # stop() or a replacement: its process is terminated and its files removed
    cancel: trio.CancelScope = field(default_factory=trio.CancelScope)
    done: trio.Event = field(default_factory=trio.Event)  # its task has ended (files settled)
    adapters_asked: dict[str, str] | None = None  # the LoRA adapters control last asked for (name -> file)
    adapters_turn: int = 0  # which ask the latest report must come from (an older load's report is dropped)
    engine: str = ""
    # llama.cpp: the adapter files it was started with (None: unknown, an adopted engine) and those left out, why.
    launch_lora: tuple[str, ...] | None = None
    lora_skipped: dict[str, str] = field(default_factory=dict)
    mirror_sha256: str = ""  # the mirror cache's file it starts or runs from ("" : none); never evicted meanwhile


class Supervisor:
    """Runs replicas inside the caller's nursery; `on_change` is called on every state change.

    `stop_on_exit`: when the agent stops (its nursery is cancelled, or `close()`), engines are
    stopped (True), or left running with their records for the next agent to adopt (False).
    `inventory` gives this node's latest observed inventory (GPU index → UUID for
    CUDA_VISIBLE_DEVICES); it must not block (the agent hands its last observation)."""

    def __init__(
        self,
        nursery: trio.Nursery,
        *,
        node: str,
        host: str,
        engine_dir: Path,
        on_change: Callable[[], None],
        http: httpx.AsyncClient,
        timeouts: Timeouts = TIMEOUTS,
        stop_on_exit: bool = True,
        inventory: Callable[[], NodeInfo] | None = None,
        roots: Sequence[str] = (),
        fetcher: Fetcher | None = None,
        on_engine_missing: Callable[[], None] | None = None,
    ) -> None:
        self._nursery = nursery
        self.node = node
        self.host = host
        self._records = Records(engine_dir)
        self._on_change = on_change
        self._http = http  # owned by the caller, closed after every replica has stopped
        self._replicas: dict[str, _Replica] = {}
        self._ending: dict[str, _Replica] = {}  # stopped, process still being terminated
        self._timeouts = timeouts
        self._stop_on_exit = stop_on_exit
        self._inventory = inventory
        self._roots = tuple(roots)
        self._fetcher = fetcher  # None: this agent has no mirror cache (a `mirror://` source fails)
        # Called when a start finds its engine cannot run here (`ENGINE_MISSING`): the node's inventory, which
        # said it could, is out of date; the agent looks again at once (llmgw.agent.service).
        self._on_engine_missing = on_engine_missing
        self._adopt()

    def replicas(self) -> list[ReplicaObs]:
        return [r.obs for r in self._replicas.values()]

    def mirror_in_use(self) -> set[str]:
        """The sha256 of the mirror cache's files replicas start or run from: never evicted."""
        return {r.mirror_sha256 for r in [*self._replicas.values(), *self._ending.values()] if r.mirror_sha256}

    def start(self, replica_id: str, model_doc: dict[str, Any], gpus: Sequence[int],
              group: Group | None = None, mirror: MirrorSource | None = None) -> None:
        """Start a replica. One starting or ready from the same launch is left as it is (a no-op);
        one from another launch is stopped first. A refusal is reported as a failed replica.
        `mirror`: where its `mirror://NAME` source is fetched from, first (into the mirror cache)."""
        try:
            model, launch = read_start(replica_id, model_doc, gpus, group)
        except StartRefused as e:
            log.warning("replica %.80s: start refused: %s", replica_id, e.error)
            self._replace(replica_id, self._failed(replica_id, e.model, e.error))
            return
        current = self._replicas.get(replica_id)
        if current is not None and current.obs.state in ("starting", "ready"):
            if current.launch == launch:
                return
            log.info("replica %s: asked to start from another launch: its engine is replaced", replica_id)
        rep = _Replica(ReplicaObs(replica_id, model.name, self.node, "starting", since=time.time(), phase="starting"),
                       launch=launch,
                       log_path=self._records.log_path(replica_id),
                       mirror_sha256=mirror.sha256 if mirror is not None else "")
        previous = self._replace(replica_id, rep)
        self._nursery.start_soon(self._run, rep, model, list(gpus), group, previous, mirror)

    def load_adapters(self, replica_id: str, adapters: Mapping[str, str]) -> None:
        """Make a ready replica's engine hold these LoRA adapters (name -> file; agent/adapters.py), each reported
        `loading`, then `loaded` once the engine lists it or `failed` with why. The same set asked again while it
        loads, or after, is a no-op."""
        rep = self._replicas.get(replica_id)
        if rep is None or rep.obs.state != "ready" or rep.adapters_asked == dict(adapters):
            return
        had, rep.adapters_asked = rep.adapters_asked or {}, dict(adapters)
        rep.adapters_turn += 1
        turn = rep.adapters_turn

        def report(states: dict[str, str], ids: dict[str, int] | None = None, loras: int = 0) -> None:
            if self._replicas.get(replica_id) is rep and rep.adapters_turn == turn and rep.obs.state == "ready":
                rep.obs = replace(rep.obs, adapters=states, adapter_ids=ids or {}, loras=loras)
                self._changed()

        if rep.engine == "llama.cpp":  # adapters given at launch: only verified here
            self._nursery.start_soon(sync_launched, self._http, rep.obs.url, dict(adapters), report,
                                     self._timeouts.adapter_load_s, rep.launch_lora, dict(rep.lora_skipped))
            return
        self._nursery.start_soon(sync_adapters, self._http, rep.obs.url, dict(adapters), had, report,
                                 self._timeouts.adapter_load_s)

    def sleep(self, replica_id: str, level: int) -> None:
        """Fast wake: a ready replica's engine sleeps at `level` (`POST /sleep?level=N`, vLLM's sleep mode); it is
        reported `sleeping` at once (it serves nothing from now), failed when its engine refuses."""
        rep = self._replicas.get(replica_id)
        if rep is None or rep.obs.state != "ready":
            return
        self._set(rep, "sleeping", url=rep.obs.url)
        self._nursery.start_soon(self._sleep_call, rep, f"{SLEEP_PATH}?level={level}", "sleeping",
                                 self._timeouts.engine_sleep_s)

    def wake(self, replica_id: str) -> None:
        """Fast wake: a sleeping replica's engine wakes (`POST /wake_up`): starting (phase `waking`), then ready once
        the engine answers, or failed with why."""
        rep = self._replicas.get(replica_id)
        if rep is None or rep.obs.state != "sleeping":
            return
        rep.obs = replace(rep.obs, phase="waking")
        self._set(rep, "starting")
        self._nursery.start_soon(self._sleep_call, rep, WAKE_PATH, "starting", self._timeouts.engine_wake_s)

    async def _sleep_call(self, rep: _Replica, path: str, during: str, timeout_s: float) -> None:
        url = rep.obs.url
        try:
            with trio.fail_after(timeout_s):
                r = await self._http.post(url + path, timeout=timeout_s)
            problem = "" if r.status_code == 200 else f"answered HTTP {r.status_code}"
        except (trio.TooSlowError, httpx.TimeoutException):
            problem = f"no answer within {timeout_s:g} s"
        except (httpx.HTTPError, OSError) as e:
            problem = describe(e)
        if self._replicas.get(rep.obs.replica_id) is not rep or rep.obs.state != during:
            return  # stopped, or asked otherwise meanwhile
        if problem:
            self._fail(rep, f"engine {path.split('?')[0]} failed: {problem}")
        elif path == WAKE_PATH:
            log.info("replica %s woke at %s", rep.obs.replica_id, url)
            self._set(rep, "ready", url=url)

    def stop(self, replica_id: str) -> None:
        """Stop and forget a replica: its process is terminated (then killed), its record and log removed."""
        rep = self._replicas.pop(replica_id, None)
        if rep is not None:
            self._end(rep)
            self._changed()

    def stop_all(self) -> None:
        for rid in list(self._replicas):
            self.stop(rid)

    def leave_running(self) -> None:
        """The agent restarts in place: whatever `stop_on_exit` said, its engines keep running for the agent
        that runs next as the same process (an engine told to stop with its parent's pid sees it live on)."""
        self._stop_on_exit = False

    def close(self) -> None:
        """The agent stops: engines stop with it, or keep running for the next agent (`stop_on_exit`)."""
        if self._stop_on_exit:
            self.stop_all()
            return
        running = [r for r in self._replicas.values() if r.obs.state in ("starting", "ready", "sleeping")]
        if running:
            log.warning("%d engines keep running; the next agent adopts them", len(running))

    # -- internals -----------------------------------------------------------

    def _failed(self, replica_id: str, model: str, error: str) -> _Replica:
        rep = _Replica(ReplicaObs(replica_id, model, self.node, "failed", error=error, since=time.time()))
        rep.done.set()
        return rep

    def _replace(self, replica_id: str, rep: _Replica) -> _Replica | None:
        """Put `rep` in place; the one it replaces is ended. Returns whichever earlier replica's task
        may still use this id's files (the new one waits for it)."""
        old = self._replicas.get(replica_id)
        if old is not None:
            self._end(old)
        self._replicas[replica_id] = rep
        self._changed()
        return self._ending.get(replica_id)

    def _end(self, rep: _Replica) -> None:
        rid = rep.obs.replica_id
        rep.stopping = True
        if rep.done.is_set():
            self._cleanup(rep)
        else:
            self._ending[rid] = rep
            rep.cancel.cancel()

    def _cleanup(self, rep: _Replica) -> None:
        """A replica gone for good: its record and its log go with it."""
        if rep.log_path is None:
            return  # refused before it had files
        self._records.delete(rep.obs.replica_id)
        engine_log.remove(rep.log_path)

    def _changed(self) -> None:
        try:
            self._on_change()
        except Exception:
            log.exception("replica change callback failed")

    def _set(self, rep: _Replica, state: str, **fields: Any) -> None:
        if self._replicas.get(rep.obs.replica_id) is not rep:
            return  # stopped meanwhile: forgotten, nothing to report
        phase = rep.obs.phase if state == "starting" else ""  # a phase is a starting replica's
        rep.obs = replace(rep.obs, state=state, since=time.time(), phase=phase, **fields)
        self._changed()

    def _loading(self, rep: _Replica, weights_bytes: int | None) -> None:
        """The engine is about to load its checkpoint (of this size on disk): the phase changes, not the
        state, nor `since` (the start's ETA counts from the start)."""
        if self._replicas.get(rep.obs.replica_id) is not rep or rep.obs.state != "starting":
            return
        rep.obs = replace(rep.obs, phase="loading", weights_bytes=weights_bytes)
        self._changed()

    def _fail(self, rep: _Replica, error: str) -> None:
        log.warning("replica %s failed: %s", rep.obs.replica_id, error)
        # One that served says for how long: control tells a flap (served a moment, then died) from a crash.
        served = {"ready_s": max(0.0, time.time() - rep.obs.since)} if rep.obs.state == "ready" else {}
        self._set(rep, "failed", error=error[:2000], url="", **served)

    def _adopt(self) -> None:
        """Take over the engines an earlier agent left running; report those that ended meanwhile."""
        adopted = 0
        for record in self._records.load():
            rid = record.replica_id
            # Its process runs: loading, if not ready (the checkpoint's size is unknown here).
            rep = _Replica(ReplicaObs(rid, record.model, self.node, "starting", since=record.started, phase="loading"),
                           launch=record.launch, log_path=self._records.log_path(rid), engine=record.engine,
                           mirror_sha256=record.mirror_sha256)
            self._replicas[rid] = rep
            if not same_process(record.pid, record.start_ticks):
                # Reported once: the record goes now, the log when control stops the replica.
                self._records.delete(rid)
                rep.done.set()
                tail = engine_log.tail(rep.log_path)
                self._fail(rep, "engine exited while the agent was away (exit status unknown)"
                           + (f": {tail}" if tail else ""))
                continue
            if record.ready_since:
                rep.obs = replace(rep.obs, state="ready", url=record.url, since=record.ready_since, phase="")
            adopted += 1
            process = AdoptedProcess(record.pid, record.start_ticks, self._timeouts.engine_health_poll_s)
            self._nursery.start_soon(self._run_adopted, rep, process, record)
        if adopted:
            log.info("adopted %d engines left running by an earlier agent", adopted)

    async def _run_adopted(self, rep: _Replica, process: AdoptedProcess, record: EngineRecord) -> None:
        try:
            with rep.cancel:
                # The start deadline runs from the engine's own start, not from its adoption.
                left = max(0.0, self._timeouts.engine_start_s - (time.time() - record.started))
                await self._supervise(rep, process, record, trio.current_time() + left)
        except Exception as e:  # a bug here must not take the agent and every engine down
            log.exception("replica %s: supervision failed", rep.obs.replica_id)
            self._fail(rep, f"the agent's supervision failed: {describe(e)}")
        finally:
            self._done(rep)

    async def _source(self, rep: _Replica, model: ModelDef, mirror: MirrorSource | None) -> str | None:
        """What the engine opens: the definition's source, or for `mirror://NAME` the mirror cache's verified file
        (fetched first, reported `fetching` with its bytes); None once the replica failed."""
        if not model.source.startswith("mirror://"):
            return model.source
        name = model.source[len("mirror://"):]
        if mirror is None:
            self._fail(rep, f"mirror file {name} is not in the mirror (add it: llmgw ctl mirror add FILE "
                            f"--name {name})")
            return None
        if self._fetcher is None:
            self._fail(rep, f"mirror file {name}: this agent keeps no mirror cache (--mirror-cache-bytes 0)")
            return None
        started, total = trio.current_time(), mirror.size
        step = max(1, total // 100)  # reported at each percent (and the last byte): ~100 reports a fetch
        shown = -1

        def on_bytes(done: int) -> None:
            nonlocal shown
            if self._replicas.get(rep.obs.replica_id) is not rep or rep.obs.state != "starting":
                return
            if done // step == shown and done < total:
                return
            shown = done // step
            elapsed = trio.current_time() - started
            ahead = None
            if done > 0 and elapsed > 0:
                ahead = (time.time() - rep.obs.since) + (total - done) / (done / elapsed)
            rep.obs = replace(rep.obs, phase="fetching", bytes_done=done, weights_bytes=total, fetch_expected_s=ahead)
            self._changed()

        on_bytes(0)
        try:
            path = await self._fetcher(mirror, on_bytes)
        except MirrorFetchFailed as e:
            self._fail(rep, str(e))
            return None
        if self._replicas.get(rep.obs.replica_id) is rep and rep.obs.state == "starting":
            rep.obs = replace(rep.obs, phase="starting", bytes_done=None, fetch_expected_s=None)
            self._changed()
        return str(path)

    async def _run(self, rep: _Replica, model: ModelDef, gpus: list[int], group: Group | None,
                   previous: _Replica | None, mirror: MirrorSource | None = None) -> None:
        rid = rep.obs.replica_id
        try:
            with rep.cancel:
                if previous is not None:
                    await previous.done.wait()  # its files have the same names as ours
                source = await self._source(rep, model, mirror)
                if source is None:
                    return
                deadline = trio.current_time() + self._timeouts.engine_start_s  # from the end of a fetch
                # A mirror file lies in the mirror cache, outside the --storage dirs: allowed, it was checked.
                roots = (*self._roots, os.path.dirname(source)) if mirror is not None and self._roots else self._roots
                try:
                    devices = self._devices(gpus)
                    port = free_port(self.host)
                    self._records.dir.mkdir(parents=True, exist_ok=True)
                    build = functools.partial(
                        launch_spec, model.engine, model=model.name, role=model.role, source=source,
                        host=self.host, port=port, args=model.args, devices=devices, group=group,
                        roots=roots, cwd=str(self._records.dir.resolve()), lora=model.lora,
                        sleep_mode=bool(model.sleep_level))
                    # Off the loop where it reads and checks the weights' header (up to 64 MiB, maybe
                    # on a network filer): the stream's heartbeats must not wait for it. The sim
                    # reads no weights.
                    spec = build() if model.engine == "sim" else await trio.to_thread.run_sync(build)
                except EngineError as e:
                    self._fail(rep, e.message)
                    if e.code in ENGINE_MISSING and self._on_engine_missing is not None:
                        self._on_engine_missing()
                    return
                rep.engine, rep.launch_lora, rep.lora_skipped = model.engine, model.lora, dict(spec.lora_skipped)
                self._loading(rep, spec.weights_bytes)
                url = f"http://{url_host(self.host)}:{spec.port or port}"
                env = {**os.environ, **spec.env}
                env.pop(PARENT_ENV, None)
                if self._stop_on_exit:  # the engine stops when its agent is gone; else it outlives it
                    env[PARENT_ENV] = str(os.getpid())
                assert rep.log_path is not None
                try:
                    engine_log.remove(rep.log_path)  # a fresh start: the tail must be this run's
                    with engine_log.open_for_engine(rep.log_path) as out:
                        log.info("replica %s starting: %s", rid, " ".join(spec.argv[-12:]))
                        proc = await trio.lowlevel.open_process(
                            spec.argv, env=env, cwd=spec.cwd, stdin=subprocess.DEVNULL, stdout=out,
                            stderr=subprocess.STDOUT,
                            # Own session: a terminal's Ctrl-C or hangup reaches the agent, not the engine
                            # (the agent stops engines in order, or leaves them to the next agent).
                            start_new_session=True,
                        )
                except OSError as e:  # the log cannot be written, the program cannot be run
                    self._fail(rep, f"engine could not be started: {describe(e)}")
                    return
                ticks = start_ticks(proc.pid)
                record = EngineRecord(rid, model.name, model.engine, proc.pid, ticks or 0, url, spec.probe,
                                      spec.health_path or "", rep.launch, time.time(),
                                      mirror_sha256=rep.mirror_sha256)
                if ticks is not None:
                    # Shielded: a stop arriving during the write must still find the engine supervised
                    # (`_supervise` stops it, or leaves it recorded for the next agent), never orphaned.
                    with trio.CancelScope(shield=True):
                        await self._save(record)
                await self._supervise(rep, _Child(proc), record, deadline)
        except Exception as e:  # a bug here must not take the agent and every engine down
            log.exception("replica %s: supervision failed", rid)
            self._fail(rep, f"the agent's supervision failed: {describe(e)}")
        finally:
            if previous is not None and not previous.done.is_set():
                # Stopped while waiting for `previous`: still done only after it, so that whoever
                # waits for this one never meets `previous` removing the files they share.
                with trio.CancelScope(shield=True):
                    await previous.done.wait()
            self._done(rep)

    async def _save(self, record: EngineRecord) -> None:
        try:  # fsyncs: off the loop
            await trio.to_thread.run_sync(self._records.write, record)
        except OSError as e:  # the engine runs on; only its adoption by a later agent is lost
            log.warning("replica %s: its engine record could not be written (%s): a later agent will not "
                        "adopt its engine", record.replica_id, describe(e))

    def _done(self, rep: _Replica) -> None:
        rid = rep.obs.replica_id
        if self._ending.get(rid) is rep:
            del self._ending[rid]
        if rep.stopping:
            self._cleanup(rep)
        rep.done.set()

    def _devices(self, gpus: list[int]) -> list[str]:
        """The UUIDs (GPU-… or MIG-…) of the GPUs placement chose, from this node's own inventory."""
        if not gpus:
            return []
        if self._inventory is None:
            raise EngineError("unknown_gpu", "this agent has no GPU inventory to start a GPU replica from")
        inventory = self._inventory()
        by_index = {g.index: g for g in inventory.gpus}
        uuids = []
        for index in gpus:
            gpu = by_index.get(index)
            if gpu is None:
                known = ", ".join(g.label for g in inventory.gpus) or "none"
                raise EngineError("unknown_gpu", f"gpu {index} is not in this node's inventory (known: {known})")
            if not gpu.usable or not gpu.uuid:
                why = gpu.reason or ("it has no UUID" if gpu.usable else "not usable")
                raise EngineError("unknown_gpu", f"gpu {gpu.label} cannot run an engine: {why}")
            uuids.append(gpu.uuid)
        return uuids

    async def _supervise(self, rep: _Replica, proc: _Process, record: EngineRecord, deadline: float) -> None:
        """Watch `proc` until it fails or the task is cancelled; then stop it, or leave it running
        for the next agent when the agent is exiting and `stop_on_exit` is off."""
        cancelled = True  # (it arrives as Cancelled, or as a group of them out of a nursery)
        try:
            await self._watch(rep, proc, record, deadline)
            cancelled = False
        except Exception:
            cancelled = False
            raise
        finally:
            leave = cancelled and not rep.stopping and not self._stop_on_exit
            with trio.CancelScope(shield=True):
                if not leave:
                    await _terminate(proc, self._timeouts.engine_stop_grace_s)
                    self._records.delete(rep.obs.replica_id)
                    log.info("replica %s process %d ended (%s)", rep.obs.replica_id, proc.pid,
                             _exit_words(proc.returncode, adopted=isinstance(proc, AdoptedProcess)))
                    if not rep.stopping and self._stop_on_exit and rep.obs.state != "failed":
                        rep.stopping = True  # the agent exits and its engines with it: nothing left to show
                elif proc.running():
                    _LEFT_RUNNING.append(proc)
                    log.info("replica %s: engine %d keeps running for the next agent", rep.obs.replica_id, proc.pid)

    async def _watch(self, rep: _Replica, proc: _Process, record: EngineRecord, deadline: float) -> None:
        rid = rep.obs.replica_id
        t = self._timeouts
        adopted = isinstance(proc, AdoptedProcess)
        if rep.obs.state != "ready":
            fast_until = trio.current_time() + t.engine_health_fast_for_s
            while proc.running():
                if not await self._probe(record, t.engine_health_request_s):
                    # Ready with what its engine says it does (llama.cpp's /props): no request meets it unknown.
                    self._set(rep, "ready", url=record.url, tool_calls=await self._tool_calls(record))
                    if record.start_ticks:
                        await self._save(replace(record, ready_since=rep.obs.since))
                    log.info("replica %s ready at %s", rid, record.url)
                    break
                if trio.current_time() > deadline:
                    self._fail(rep, f"not healthy within {t.engine_start_s:g} s")
                    return
                await _rotate(rep.log_path)
                fast = trio.current_time() < fast_until
                await trio.sleep(t.engine_health_fast_poll_s if fast else t.engine_health_poll_s)
            else:
                await proc.wait()
                await trio.sleep(t.engine_exit_log_s)  # let the log flush
                reason = start_failure(record.engine, engine_log.tail(rep.log_path))
                self._fail(rep, f"engine {_exit_words(proc.returncode, adopted)} before serving: {reason}")
                return
        elif record.engine == "llama.cpp" and rep.obs.tool_calls is None:  # adopted while it serves
            tools = await self._tool_calls(record)
            if self._replicas.get(rid) is rep and rep.obs.state == "ready":
                rep.obs = replace(rep.obs, tool_calls=tools)
                self._changed()
        unanswered = ""
        async with trio.open_nursery() as watchers:
            async def liveness() -> None:
                nonlocal unanswered
                unanswered = await self._liveness(rep, record)
                watchers.cancel_scope.cancel()

            watchers.start_soon(liveness)
            await proc.wait()
            watchers.cancel_scope.cancel()
        if unanswered and proc.running():
            what = record.health if record.probe == "http" else "on its port"
            self._fail(rep, f"engine stopped answering {what} ({unanswered}); it is stopped")
            return
        await trio.sleep(t.engine_exit_log_s)
        tail = engine_log.tail(rep.log_path)
        self._fail(rep, f"engine {_exit_words(proc.returncode, adopted)} while serving: {tail or 'no output'}")

    async def _liveness(self, rep: _Replica, record: EngineRecord) -> str:
        """Probe a ready engine until it fails `LIVENESS_FAILURES` probes in a row; returns why."""
        t = self._timeouts
        failures = 0
        while True:
            problem = await self._probe(record, t.engine_liveness_request_s)
            failures = failures + 1 if problem else 0
            if failures >= LIVENESS_FAILURES:
                return f"{failures} probes in a row failed, the last: {problem}"
            await _rotate(rep.log_path)
            await trio.sleep(t.engine_liveness_poll_s)

    async def _tool_calls(self, record: EngineRecord) -> bool | None:
        """llama.cpp: whether its chat template turns `tools` into tool calls, as `GET /props` says
        (`chat_template_caps.supports_tool_calls`); another template answers in text, the tools ignored. None:
        another engine, or /props unanswered (the gateway then passes tools on, as before it knew)."""
        if record.engine != "llama.cpp":
            return None
        timeout_s = self._timeouts.engine_health_request_s
        try:
            with trio.fail_after(timeout_s):
                r = await self._http.get(record.url + PROPS_PATH, timeout=timeout_s)
            caps = r.json().get("chat_template_caps") if r.status_code == 200 else None
            found = caps.get("supports_tool_calls") if isinstance(caps, dict) else None
        except (trio.TooSlowError, httpx.HTTPError, OSError, ValueError, AttributeError) as e:
            log.warning("replica %s: llama.cpp's %s unread (%s): whether it calls tools is unknown",
                        record.replica_id, PROPS_PATH, "timed out" if isinstance(e, trio.TooSlowError) else describe(e))
            return None
        return found if type(found) is bool else None

    async def _probe(self, record: EngineRecord, timeout_s: float) -> str:
        """One probe of the engine as its launch says: "" when it serves, else what went wrong.
        A "process" probe always passes: the process being alive is all there is to know."""
        try:
            with trio.fail_after(timeout_s):  # the whole probe, whatever httpx's own phases allow
                if record.probe == "tcp":
                    url = httpx.URL(record.url)
                    stream = await trio.open_tcp_stream(url.host, url.port or 80)
                    await stream.aclose()
                elif record.probe == "http":
                    r = await self._http.get(record.url + record.health, timeout=timeout_s)
                    return "" if r.status_code == 200 else f"answered HTTP {r.status_code}"
        except (trio.TooSlowError, httpx.TimeoutException):
            return f"no answer within {timeout_s:g} s"
        except (httpx.HTTPError, OSError) as e:
            return describe(e)
        return ""


def _exit_words(code: int | None, adopted: bool) -> str:
    if code is None:
        return "exited (exit status unknown: it was started by an earlier agent)" if adopted else "exited"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


async def _terminate(proc: _Process, grace_s: float) -> None:
    """SIGTERM the engine's process group (SIGCONT too: a stopped engine must see it), then
    SIGKILL after the grace period."""
    if not proc.running():
        return
    proc.signal_group(signal.SIGTERM)
    proc.signal_group(signal.SIGCONT)
    with trio.move_on_after(grace_s):
        await proc.wait()
        return
    log.warning("engine process %d ignored SIGTERM for %g s: killing it", proc.pid, grace_s)
    proc.signal_group(signal.SIGKILL)
    await proc.wait()


async def _rotate(path: Path | None) -> None:
    """Rotate an engine's log once it passed its cap: the size is looked at here (cheap), the copy
    of up to the cap is made off the loop."""
    try:
        large = path is not None and path.stat().st_size > engine_log.LOG_CAP_BYTES
    except OSError:
        return
    if large and path is not None:
        await trio.to_thread.run_sync(engine_log.rotate_if_large, path)
