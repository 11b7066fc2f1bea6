"""Engine supervision: one real process per replica, probed until it serves.

The supervisor starts and stops engine processes and reports every state change
(starting → ready, or failed with the reason). It never restarts on its own:
the control plane decides, so a failing model is counted and parked there.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import httpx
import trio

from llmgw.domain.model import DefinitionError, ModelDef
from llmgw.domain.observed import ReplicaObs
from llmgw.domain.timeouts import TIMEOUTS, Timeouts
from llmgw.engines import PARENT_ENV, EngineError, launch_spec
from llmgw.net import free_port, url_host

log = logging.getLogger("llmgw.agent.supervisor")


@dataclass
class _Replica:
    obs: ReplicaObs
    cancel: trio.CancelScope = field(default_factory=trio.CancelScope)
    log_path: Path | None = None


def _tail(path: Path | None, lines: int = 5, limit: int = 600) -> str:
    if path is None or not path.exists():
        return ""
    with path.open("rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - 8192))
        text = f.read().decode("utf-8", "replace")
    kept = [ln.strip() for ln in text.splitlines() if ln.strip()][-lines:]
    return " | ".join(kept)[-limit:]


class Supervisor:
    """Runs replicas inside the caller's nursery; `on_change` is called on every state change."""

    def __init__(
        self,
        nursery: trio.Nursery,
        *,
        node: str,
        host: str,
        log_dir: Path,
        on_change: Callable[[], None],
        http: httpx.AsyncClient,
        timeouts: Timeouts = TIMEOUTS,
    ) -> None:
        self._nursery = nursery
        self.node = node
        self.host = host
        self.log_dir = log_dir
        self._on_change = on_change
        self._http = http  # owned by the caller, closed after every replica has stopped
        self._replicas: dict[str, _Replica] = {}
        self._timeouts = timeouts

    def replicas(self) -> list[ReplicaObs]:
        return [r.obs for r in self._replicas.values()]

    def start(self, replica_id: str, model_doc: dict[str, Any], gpus: list[int]) -> None:
        """Start a replica; a start for one that is starting or ready is a no-op."""
        current = self._replicas.get(replica_id)
        if current is not None and current.obs.state in ("starting", "ready"):
            return
        name = str(model_doc.get("name", "?")) if isinstance(model_doc, dict) else "?"
        rep = _Replica(ReplicaObs(replica_id, name, self.node, "starting", since=time.time()))
        self._replicas[replica_id] = rep
        self._changed()
        self._nursery.start_soon(self._run, rep, model_doc, gpus)

    def stop(self, replica_id: str) -> None:
        """Stop and forget a replica (its process is terminated, then killed)."""
        rep = self._replicas.pop(replica_id, None)
        if rep is not None:
            rep.cancel.cancel()
            self._changed()

    def stop_all(self) -> None:
        for rid in list(self._replicas):
            self.stop(rid)

    # -- internals -----------------------------------------------------------

    def _changed(self) -> None:
        try:
            self._on_change()
        except Exception:
            log.exception("replica change callback failed")

    def _set(self, rep: _Replica, state: str, **fields: Any) -> None:
        if self._replicas.get(rep.obs.replica_id) is not rep:
            return  # stopped meanwhile: forgotten, nothing to report
        rep.obs = replace(rep.obs, state=state, since=time.time(), **fields)
        self._changed()

    async def _run(self, rep: _Replica, model_doc: dict[str, Any], gpus: list[int]) -> None:
        rid = rep.obs.replica_id
        with rep.cancel:
            try:
                model = ModelDef.from_doc(model_doc)
                port = free_port(self.host)
                env = {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus)} if gpus else {}
                spec = launch_spec(model.engine, model=model.name, role=model.role, source=model.source,
                                   host=self.host, port=port, args=model.args, gpu_env=env)
            except (DefinitionError, EngineError) as e:
                message = getattr(e, "message", str(e))
                log.warning("replica %s cannot start: %s", rid, message)
                self._set(rep, "failed", error=message)
                return
            url = f"http://{url_host(self.host)}:{port}"
            self.log_dir.mkdir(parents=True, exist_ok=True)
            rep.log_path = self.log_dir / f"{rid}.log"
            env = {**os.environ, **spec.env, PARENT_ENV: str(os.getpid())}
            await self._supervise(rep, spec.argv, env, url, spec.health_path)

    async def _supervise(self, rep: _Replica, argv: list[str], env: dict[str, str], url: str, health: str) -> None:
        rid = rep.obs.replica_id
        assert rep.log_path is not None
        with rep.log_path.open("ab") as out:
            log.info("replica %s starting: %s", rid, " ".join(argv[-12:]))
            proc = await trio.lowlevel.open_process(
                argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                # Own session: a terminal's Ctrl-C reaches the agent, which stops engines in order.
                # (No PR_SET_PDEATHSIG: it fires when trio's forking worker thread exits.)
                start_new_session=True,
            )
            try:
                await self._watch(rep, proc, url, health)
            finally:
                with trio.CancelScope(shield=True):
                    await _terminate(proc, self._timeouts.engine_stop_grace_s)
                log.info("replica %s process %d ended (status %s)", rid, proc.pid, proc.returncode)

    async def _watch(self, rep: _Replica, proc: trio.Process, url: str, health: str) -> None:
        rid = rep.obs.replica_id
        t = self._timeouts
        deadline = trio.current_time() + t.engine_start_s
        while proc.poll() is None:
            if await self._healthy(url + health):
                self._set(rep, "ready", url=url)
                log.info("replica %s ready at %s", rid, url)
                break
            if trio.current_time() > deadline:
                self._set(rep, "failed", error=f"not healthy within {t.engine_start_s:g} s")
                return
            await trio.sleep(t.engine_health_poll_s)
        else:
            await trio.sleep(t.engine_exit_log_s)  # let the log flush
            error = f"engine exited with status {proc.returncode} before serving: {_tail(rep.log_path)}"
            log.warning("replica %s failed: %s", rid, error)
            self._set(rep, "failed", error=error)
            return
        await proc.wait()
        error = f"engine exited with status {proc.returncode} while serving: {_tail(rep.log_path)}"
        log.warning("replica %s failed: %s", rid, error)
        self._set(rep, "failed", error=error, url="")

    async def _healthy(self, url: str) -> bool:
        try:
            r = await self._http.get(url)
        except httpx.HTTPError:
            return False
        return r.status_code == 200


async def _terminate(proc: trio.Process, grace_s: float) -> None:
    """SIGTERM the engine's process group, then SIGKILL after the grace period."""
    if proc.returncode is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    with trio.move_on_after(grace_s):
        await proc.wait()
        return
    log.warning("engine process %d ignored SIGTERM for %g s: killing it", proc.pid, grace_s)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    await proc.wait()
