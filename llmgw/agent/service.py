"""`serve(config)`: one stream to the control plane, reconnecting with backoff.

Engines keep running while the stream is down; when it comes back the agent
reports what it runs and control reconciles from there (level-triggered).
"""

from __future__ import annotations

import logging
import random
from urllib.parse import urlsplit
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import trio
from trio_websocket import ConnectionClosed, HandshakeError, WebSocketConnection, wrap_client_stream

from llmgw import __version__, protocol
from llmgw.agent.inventory import NvmlProbe
from llmgw.agent.supervisor import Supervisor
from llmgw.domain.timeouts import TIMEOUTS, Timeouts
from llmgw.errors import describe, first_error
from llmgw.interfaces import GpuProbe
from llmgw.logs import role_var

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


def _ws_url(control: str) -> str:
    base = control.rstrip("/")
    if base.startswith("https://"):
        return "wss://" + base[len("https://"):] + protocol.STREAM_PATH
    if base.startswith("http://"):
        return "ws://" + base[len("http://"):] + protocol.STREAM_PATH
    return base + protocol.STREAM_PATH


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


async def _connect_forever(config: AgentConfig, supervisor: Supervisor, link: _Link) -> None:
    first, longest = config.timeouts.agent_reconnect_min_s, config.timeouts.agent_reconnect_max_s
    delay = first
    attempt = 0
    while True:
        control = config.controls[attempt % len(config.controls)]
        attempt += 1
        try:
            await _connect_once(control, config, supervisor, link)
            delay = first
        # Nurseries wrap errors in groups (strict exception groups), hence except*.
        except* HandshakeError as group:
            log.warning("control %s refused the stream: %s", control, describe(first_error(group)))
        except* (ConnectionClosed, OSError, trio.BrokenResourceError) as group:
            log.warning("stream to %s lost: %s", control, describe(first_error(group)))
        except* protocol.ProtocolError as group:
            log.warning("control %s spoke an unexpected protocol: %s", control, describe(first_error(group)))
        await trio.sleep(delay * (0.5 + random.random()))
        delay = min(delay * 2, longest)


async def _connect_once(control: str, config: AgentConfig, supervisor: Supervisor, link: _Link) -> None:
    """One stream, from TCP connect to close. We own the TCP stream and always close it:
    trio-websocket leaves it open after an abnormal closure or a refused handshake."""
    url = urlsplit(_ws_url(control))
    host, port = url.hostname or "127.0.0.1", url.port or (443 if url.scheme == "wss" else 80)
    stream = await trio.open_tcp_stream(host, port)
    try:
        async with trio.open_nursery() as nursery:
            ws = await wrap_client_stream(
                nursery, stream, f"{host}:{port}", url.path,
                extra_headers=[(b"authorization", f"Bearer {config.key}".encode())],
                max_message_size=protocol.MAX_MESSAGE_BYTES,
            )
            try:
                await _session(ws, config, supervisor, link)
            finally:
                with trio.CancelScope(shield=True), trio.move_on_after(config.timeouts.agent_stream_close_s):
                    await ws.aclose()
                nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await stream.aclose()


async def _session(ws: WebSocketConnection, config: AgentConfig, supervisor: Supervisor, link: _Link) -> None:
    inventory = config.probe.inventory(config.node)
    await ws.send_message(protocol.dumps({
        "type": "hello", "protocol": protocol.PROTOCOL_VERSION, "node": config.node, "version": __version__,
    }))
    await ws.send_message(protocol.dumps({"type": "inventory", "inventory": inventory.to_doc()}))
    first = protocol.loads(await ws.get_message())
    if first["type"] == "refused":
        raise protocol.ProtocolError(f"refused: {first.get('reason', '')} (leader: {first.get('leader', '?')})")
    if first["type"] != "welcome":
        raise protocol.ProtocolError(f"expected welcome, got {first['type']!r}")
    log.info("connected to control as node %s", config.node)
    link.welcomed.set()
    link.mark()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_report, ws, supervisor, link, config.timeouts.stream_heartbeat_s)
        while True:
            message = protocol.loads(await ws.get_message())
            kind = message["type"]
            if kind == "start_replica":
                supervisor.start(str(message["replica_id"]), message.get("model", {}), list(message.get("gpus", [])))
            elif kind == "stop_replica":
                supervisor.stop(str(message["replica_id"]))
            else:
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
