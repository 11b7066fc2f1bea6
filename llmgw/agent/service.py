"""`serve(config)`: one stream to the leading control plane, found among `controls`, followed
to the next leader when it goes.

Engines keep running while the stream is down; when it comes back (to any leader) the agent
reports what it runs and control adopts it from there (level-triggered).
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import trio
from trio_websocket import ConnectionClosed, HandshakeError, WebSocketConnection

from llmgw import __version__, protocol
from llmgw.agent.inventory import NvmlProbe
from llmgw.agent.supervisor import Supervisor
from llmgw.domain.timeouts import TIMEOUTS, Timeouts
from llmgw.errors import describe, first_error
from llmgw.interfaces import GpuProbe
from llmgw.logs import role_var
from llmgw.stream_client import open_stream

log = logging.getLogger("llmgw.agent")


@dataclass
class AgentConfig:
    controls: list[str]  # admin base URLs, e.g. http://127.0.0.1:8081
    key: str
    state_dir: Path
    node: str = "local"
    engine_host: str = "127.0.0.1"  # where engines listen; the gateway must reach it
    probe: GpuProbe = field(default_factory=NvmlProbe)
    timeouts: Timeouts = TIMEOUTS


class _Link:
    """The agent's view of its stream: what it must tell, and when."""

    def __init__(self) -> None:
        self.dirty = trio.Event()
        self.welcomed = trio.Event()

    def mark(self) -> None:
        self.dirty.set()


async def serve(config: AgentConfig, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Run the agent until cancelled; `task_status.started()` once control has welcomed it."""
    role_var.set("agent")
    link = _Link()
    timeouts = config.timeouts
    # The client only probes engines' /health.
    async with httpx.AsyncClient(timeout=timeouts.engine_health_request_s) as http, trio.open_nursery() as engines:
        supervisor = Supervisor(engines, node=config.node, host=config.engine_host, log_dir=config.state_dir / "engines",
                                on_change=link.mark, http=http, timeouts=timeouts)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_connect_forever, config, supervisor, link)
                await link.welcomed.wait()
                task_status.started()
        finally:
            supervisor.stop_all()  # engines are terminated as `engines` unwinds


class _Refused(Exception):
    """A control plane will not lead this agent; `leader_url` says where to go, if it knows."""

    def __init__(self, control: str, reason: str, leader: Any, leader_url: Any) -> None:
        super().__init__(f"{control} refused the stream: {reason} (leader: {leader or 'unknown'})")
        self.leader_url = leader_url if isinstance(leader_url, str) and leader_url.startswith("http") else None

    @classmethod
    def of(cls, control: str, message: dict[str, Any]) -> _Refused:
        return cls(control, str(message.get("reason", "")), message.get("leader"), message.get("leader_url"))


class _Silent(Exception):
    pass


async def _connect_forever(config: AgentConfig, supervisor: Supervisor, link: _Link) -> None:
    """Find the leader among `controls` (or where a refusal points) and stay with it; again when it goes.

    Every member is tried in turn, at once; only after a whole round failed does the agent pause
    (with backoff and jitter), so the loss of a leader costs one failed connect, not a backoff;
    while members answer that none leads (an election), the pause stays short.
    A refusal that names the leader's URL is followed (one hop: two members pointing at each
    other make no loop without pauses)."""
    t = config.timeouts
    controls = config.controls
    delay = t.agent_reconnect_min_s
    attempt = failed_in_round = 0
    answered = False  # a member answered in this round (it refused: not the leader)
    pointer: str | None = None
    said: set[str] = set()  # failures logged since the last attach: a repeat goes to the debug log
    while True:
        followed = pointer is not None
        if pointer is not None:
            control, pointer = pointer, None
        else:
            control = controls[attempt % len(controls)]
            attempt += 1
        attached = trio.Event()
        why, level = "", logging.WARNING
        began = trio.current_time()
        try:
            await _connect_once(control, config, supervisor, link, attached)
        # Nurseries wrap errors in groups (strict exception groups), hence except*.
        except* _Refused as group:
            refused = first_error(group)
            assert isinstance(refused, _Refused)
            why, level = str(refused), logging.INFO
            answered = True
            if refused.leader_url is not None and refused.leader_url != control and (
                    not followed or attached.is_set()):
                pointer = refused.leader_url
        except* HandshakeError as group:
            why = f"control {control} refused the stream: {describe(first_error(group))}"
        except* _Silent:
            why = f"no word from control {control} for {t.agent_silence_s:g} s: looking for the leader again"
        except* (ConnectionClosed, OSError, trio.BrokenResourceError, trio.TooSlowError) as group:
            why = f"stream to {control} lost: {describe(first_error(group))}"
        except* protocol.ProtocolError as group:
            why = f"control {control} spoke an unexpected protocol: {describe(first_error(group))}"
        if attached.is_set():
            said.clear()
            delay, failed_in_round, answered = t.agent_reconnect_min_s, 0, False
            log.warning("lost the leader at %s (%s); engines keep running while the agent looks for the leader",
                        control, why or "closed")
            if trio.current_time() - began < t.agent_silence_s:  # a leader that drops us at once: no busy loop
                await trio.sleep(delay * (0.5 + random.random()))
            continue  # the next member at once
        if why:
            log.log(logging.DEBUG if why in said else level, "%s", why)
            said.add(why)
        if pointer is not None:
            continue
        failed_in_round += 1
        if failed_in_round >= len(controls):  # every member tried: pause before the next round
            failed_in_round = 0
            # Members answer but none leads: an election, over in a second or two; keep asking often.
            longest = min(t.agent_election_retry_s, t.agent_reconnect_max_s) if answered else t.agent_reconnect_max_s
            answered = False
            delay = min(delay, longest)
            await trio.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, longest)


async def _connect_once(control: str, config: AgentConfig, supervisor: Supervisor, link: _Link,
                        attached: trio.Event) -> None:
    t = config.timeouts
    async with open_stream(control, protocol.STREAM_PATH, config.key, connect_s=t.agent_silence_s,
                           close_s=t.agent_stream_close_s) as ws:
        await _session(ws, control, config, supervisor, link, attached)


async def _receive(ws: WebSocketConnection, silence_s: float) -> dict[str, Any]:
    with trio.move_on_after(silence_s):
        return protocol.loads(await ws.get_message())
    raise _Silent()


async def _session(ws: WebSocketConnection, control: str, config: AgentConfig, supervisor: Supervisor, link: _Link,
                   attached: trio.Event) -> None:
    silence = config.timeouts.agent_silence_s
    inventory = config.probe.inventory(config.node)
    await ws.send_message(protocol.dumps({
        "type": "hello", "protocol": protocol.PROTOCOL_VERSION, "node": config.node, "version": __version__,
    }))
    await ws.send_message(protocol.dumps({"type": "inventory", "inventory": inventory.to_doc()}))
    first = await _receive(ws, silence)
    if first["type"] == "refused":
        raise _Refused.of(control, first)
    if first["type"] != "welcome":
        raise protocol.ProtocolError(f"expected welcome, got {first['type']!r}")
    log.info("connected to the leader at %s (member %s) as node %s", control, first.get("leader", "?"), config.node)
    attached.set()
    link.welcomed.set()
    link.mark()  # the first report says what runs here: the leader adopts it
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_report, ws, supervisor, link, config.timeouts.stream_heartbeat_s)
        while True:
            message = await _receive(ws, silence)
            kind = message["type"]
            if kind == "start_replica":
                supervisor.start(str(message["replica_id"]), message.get("model", {}), list(message.get("gpus", [])))
            elif kind == "stop_replica":
                supervisor.stop(str(message["replica_id"]))
            elif kind == "refused":  # the leader stepped down: find the next one
                raise _Refused.of(control, message)
            elif kind != "heartbeat":
                log.debug("ignoring message %r", kind)


async def _report(ws: WebSocketConnection, supervisor: Supervisor, link: _Link, heartbeat_s: float) -> None:
    """Send the full replica list on every change, and a heartbeat when quiet."""
    while True:
        with trio.move_on_after(heartbeat_s):
            await link.dirty.wait()
        if link.dirty.is_set():
            link.dirty = trio.Event()
            replicas = [r.to_doc() for r in supervisor.replicas()]
            await ws.send_message(protocol.dumps({"type": "replicas", "replicas": replicas}))
        else:
            await ws.send_message(protocol.dumps({"type": "heartbeat"}))
