"""The fleet's simulated engines, in-process: `SimRunner` (one per node, the agent's `ReplicaRunner`)
and `EngineServer`, the one HTTP server every replica answers on at `/r/<replica id>`.

A replica honours the sim engine's own flags (`--startup-delay`, `--fail-start`, `--tokens-per-s`,
`--embedding-dim`) and is refused for what the real agent refuses (bad args, unknown GPUs), with
the same words; its answers are the sim engine's app (`engines/sim/app.py`), not a copy of it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field, replace
from functools import partial
from typing import Any

import trio
from hypercorn.trio import serve as hypercorn_serve

from llmgw.agent.adoption import StartRefused, read_start
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import NodeInfo, ReplicaObs
from llmgw.domain.timeouts import TIMEOUTS
from llmgw.engines import EngineError, Group, launch_spec, parse_engine_args, start_failure
from llmgw.engines.sim import EXIT_AFTER_STATUS, FAIL_START_STATUS, SimApp, SimOptions, make_app
from llmgw.errors import OpenAIError
from llmgw.wire.asgi import Receive, Scope, Send, dumps, hypercorn_config, lifespan, send_json
from llmgw.wire.protocol_agent import MirrorSource

log = logging.getLogger("llmgw.simfleet")

PREFIX = "/r/"  # a replica's URL: <server>/r/<replica id>; the gateway appends /v1/...


class EngineServer:
    """One raw ASGI app for every replica of the fleet: `/r/<id>/<path>` is `<path>` of replica
    `<id>`'s sim app. An id nothing serves (stopped, failed) answers 404 with the id."""

    def __init__(self) -> None:
        self.apps: dict[str, SimApp] = {}
        self.base = ""  # http://host:port, once listening

    def url(self, replica_id: str) -> str:
        return f"{self.base}{PREFIX}{replica_id}"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        rid, _, rest = path[len(PREFIX):].partition("/") if path.startswith(PREFIX) else ("", "", "")
        app = self.apps.get(rid)
        if app is None:
            what = f"no simulated engine serves replica {rid!r} here" if rid else f"Invalid URL ({path})"
            await send_json(send, 404, dumps(OpenAIError(404, "not_found", what).doc()))
            return
        await app({**scope, "path": "/" + rest, "raw_path": ("/" + rest).encode(),
                   "root_path": scope.get("root_path", "") + PREFIX + rid}, receive, send)

    async def serve(self, host: str, port: int, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Listen until cancelled; `task_status.started(base URL)`."""
        config = hypercorn_config(host, port, logger=log.name, graceful_s=TIMEOUTS.sim_shutdown_grace_s,
                                  keep_alive_s=TIMEOUTS.sim_keep_alive_s, server_header=False)
        async with trio.open_nursery() as nursery:
            binds: list[str] = await nursery.start(partial(hypercorn_serve, self, config))  # type: ignore[arg-type]
            self.base = binds[0]
            task_status.started(self.base)


@dataclass
class _Sim:
    obs: ReplicaObs
    launch: str = ""
    cancel: trio.CancelScope = field(default_factory=trio.CancelScope)
    wake_s: float = 0.0  # fast wake: how long a wake takes (the sim's `--wake-delay`)


@dataclass(eq=False)
class SimRunner:
    """One node's replicas as in-process sim engines (a `ReplicaRunner`): starting for the
    `--startup-delay`, then ready at `server.url(id)`, or failed as the sim process fails with
    `--fail-start`. Nothing outlives the fleet: `close` stops every replica."""

    nursery: trio.Nursery
    on_change: Callable[[], None]
    inventory: Callable[[], NodeInfo]
    _: KW_ONLY
    node: str
    server: EngineServer
    _replicas: dict[str, _Sim] = field(default_factory=dict, init=False, repr=False)

    def replicas(self) -> list[ReplicaObs]:
        return [r.obs for r in self._replicas.values()]

    def start(self, replica_id: str, model_doc: dict[str, Any], gpus: Sequence[int],
              group: Group | None = None, mirror: MirrorSource | None = None) -> None:
        # Simulated engines read no weights: a mirror file is not fetched (`mirror` is ignored).
        try:
            model, launch = read_start(replica_id, model_doc, gpus, group)
        except StartRefused as e:
            self._put(replica_id, self._failed(replica_id, e.model, e.error))
            return
        current = self._replicas.get(replica_id)
        if current is not None and current.obs.state in ("starting", "ready") and current.launch == launch:
            return
        try:
            opts = self._options(model, gpus, group)
            app = make_app(opts)
        except EngineError as e:
            self._put(replica_id, self._failed(replica_id, model.name, e.message))
            return
        except ValueError as e:
            self._put(replica_id, self._failed(replica_id, model.name, f"engine could not be started: {e}"))
            return
        sim = _Sim(ReplicaObs(replica_id, model.name, self.node, "starting", since=time.time()), launch,
                   wake_s=opts.wake_delay)
        self._put(replica_id, sim)
        self.nursery.start_soon(self._run, sim, opts, app)

    def stop(self, replica_id: str) -> None:
        sim = self._replicas.pop(replica_id, None)
        if sim is not None:
            self._end(sim)
            self._changed()

    def sleep(self, replica_id: str, level: int) -> None:
        """Fast wake: a ready replica sleeps at once (it keeps its app, and serves nothing routed to it)."""
        sim = self._replicas.get(replica_id)
        if sim is not None and sim.obs.state == "ready":
            self._set(sim, "sleeping")

    def wake(self, replica_id: str) -> None:
        """Fast wake: a sleeping replica is starting (phase `waking`) for its `--wake-delay`, then ready again."""
        sim = self._replicas.get(replica_id)
        if sim is not None and sim.obs.state == "sleeping":
            self._set(sim, "starting", phase="waking")
            self.nursery.start_soon(self._wake, sim)

    async def _wake(self, sim: _Sim) -> None:
        await trio.sleep(sim.wake_s)
        if sim.obs.state == "starting":
            self._set(sim, "ready", phase="")  # a no-op once stopped or replaced meanwhile

    def load_adapters(self, replica_id: str, adapters: Mapping[str, str]) -> None:
        """The fleet's simulated nodes hold no adapter files: each adapter is reported failed, with why."""
        sim = self._replicas.get(replica_id)
        if sim is None or sim.obs.state != "ready":
            return
        states = {name: "failed: the fleet simulator's engines load no LoRA adapters" for name in adapters}
        if states != dict(sim.obs.adapters):
            sim.obs = replace(sim.obs, adapters=states)
            self._changed()

    def close(self) -> None:
        for rid in list(self._replicas):
            self.stop(rid)

    def leave_running(self) -> None:
        """In-process replicas cannot outlive the fleet's process: nothing to leave (its agents never restart
        in place; control's `restart_agent` only makes them reconnect)."""

    # -- internals -----------------------------------------------------------

    def _options(self, model: ModelDef, gpus: Sequence[int], group: Group | None) -> SimOptions:
        """What the real agent would launch, checked as it checks it (args, GPUs, group); the
        tunables as the sim process would parse them."""
        if model.engine != "sim":
            raise EngineError("engine_missing", f"a simulated node runs only the sim engine, not {model.engine}")
        launch_spec("sim", model=model.name, role=model.role, source=model.source, host="127.0.0.1", port=1,
                    args=model.args, devices=self._devices(gpus), group=group)
        return SimOptions(host="", port=0, model=model.name, role=model.role,
                          **parse_engine_args("sim", model.args))

    def _devices(self, gpus: Sequence[int]) -> list[str]:
        """The UUIDs of the GPUs placement chose; refused as the real agent refuses them."""
        by_index = {g.index: g for g in self.inventory().gpus}
        uuids = []
        for index in gpus:
            gpu = by_index.get(index)
            if gpu is None:
                known = ", ".join(g.label for g in by_index.values()) or "none"
                raise EngineError("unknown_gpu", f"gpu {index} is not in this node's inventory (known: {known})")
            if not gpu.usable or not gpu.uuid:
                raise EngineError("unknown_gpu", f"gpu {gpu.label} cannot run an engine: {gpu.reason or 'not usable'}")
            uuids.append(gpu.uuid)
        return uuids

    async def _run(self, sim: _Sim, opts: SimOptions, app: SimApp) -> None:
        rid = sim.obs.replica_id
        with sim.cancel:
            await trio.sleep(opts.startup_delay)
            if opts.fail_start:
                # The words the sim process prints and exits with, read as the supervisor reads them.
                said = f"llmgw sim: simulated start failure of model {opts.model} (--fail-start)"
                self._set(sim, "failed", error=f"engine exited with status {FAIL_START_STATUS} before serving: "
                                               f"{start_failure('sim', said)}")
                return
            self.server.apps[rid] = app
            self._set(sim, "ready", url=self.server.url(rid))
            if opts.exit_after > 0:  # a flapping engine: it serves a while, then exits as the process does
                await trio.sleep(opts.exit_after)
                self.server.apps.pop(rid, None)
                said = f"llmgw sim: simulated failure of model {opts.model} after serving {opts.exit_after:g} s"
                self._set(sim, "failed", url="", ready_s=opts.exit_after,
                          error=f"engine exited with status {EXIT_AFTER_STATUS} while serving: {said} (--exit-after)")

    def _failed(self, replica_id: str, model: str, error: str) -> _Sim:
        log.warning("replica %s on %s refused: %s", replica_id, self.node, error)
        return _Sim(ReplicaObs(replica_id, model, self.node, "failed", error=error, since=time.time()))

    def _put(self, replica_id: str, sim: _Sim) -> None:
        old = self._replicas.get(replica_id)
        if old is not None:
            self._end(old)
        self._replicas[replica_id] = sim
        self._changed()

    def _end(self, sim: _Sim) -> None:
        sim.cancel.cancel()
        if sim.obs.state in ("ready", "sleeping", "starting"):  # one replica of an id runs at a time: its own app
            self.server.apps.pop(sim.obs.replica_id, None)

    def _set(self, sim: _Sim, state: str, **fields: Any) -> None:
        if self._replicas.get(sim.obs.replica_id) is not sim:
            return
        sim.obs = replace(sim.obs, state=state, since=time.time(), **fields)
        self._changed()

    def _changed(self) -> None:
        try:
            self.on_change()
        except Exception:
            log.exception("replica change callback failed")
