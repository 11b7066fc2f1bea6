"""The leader's end of each agent's stream (`protocol.STREAM_PATH`): hello and inventory, then
reports in and commands out, with heartbeats both ways (its WebSocket route: control/api/streams.py).

Every message is checked against its schema (`llmgw.wire.protocol_agent`): a malformed one is logged
and answered with `rejected`, and the stream goes on; an agent silent for `stream_silence_s`
(three heartbeat intervals) is taken for gone, and its node's grace period starts.
"""

from __future__ import annotations

import logging
from typing import Any, Awaitable, Callable, Mapping

import trio

from llmgw.control.hub import AgentHub, AgentLink
from llmgw.domain.observed import NodeInfo
from llmgw.errors import AdminError
from llmgw.wire import protocol
from llmgw.wire import protocol_agent as pa

log = logging.getLogger("llmgw.control.agents")

Receive = Callable[[], Awaitable[str | bytes]]
Send = Callable[[str], Awaitable[None]]


Renew = Callable[[str, str], Awaitable[dict[str, Any]]]  # (node, csr) -> the `certificate` message


async def session(receive: Receive, send: Send, hub: AgentHub, *, is_leader: Callable[[], bool],
                  leader_info: Callable[[], Mapping[str, Any]], self_id: str, machine: str | None = None,
                  renew: Renew | None = None) -> None:
    """One agent's stream, until it closes, goes silent, or the hub lets it go. Never raises for
    what the agent sent: a bad opening is refused (with the reason), a bad report is rejected.
    `machine`: the node its certificate names; a hello for another node is refused (None: in-process).
    `renew`: signs the agent's `renew` request (None: it holds no certificate: refused)."""
    opened = None
    with trio.move_on_after(hub.silence_s):
        opened = await _opening(receive, send, is_leader, leader_info, machine)
    if opened is None:
        return
    hello, inventory = opened
    node = hello.node
    send_channel, receive_channel = trio.open_memory_channel[dict[str, Any]](256)
    link = hub.connect(node, send_channel)
    hub.releases[node] = (hello.release_sha256, hello.release_reason or ("" if hello.release_sha256 else
                                                                         "not said (an agent older than ctl upgrade)"))
    try:
        hub.report_inventory(link, inventory)
        await send(protocol.dumps({"type": "welcome", "node": node, "leader": self_id}))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_outbound, send, receive_channel, hub.heartbeat_s, nursery.cancel_scope)
            await _inbound(receive, hub, link, renew)
            nursery.cancel_scope.cancel()
    finally:
        hub.disconnect(link)


async def _opening(receive: Receive, send: Send, is_leader: Callable[[], bool],
                   leader_info: Callable[[], Mapping[str, Any]], machine: str | None) -> tuple[pa.Hello, NodeInfo] | None:
    """The hello and the first inventory: the node's name and inventory, or None once refused."""

    async def refuse(reason: str, **extra: Any) -> None:
        await send(protocol.dumps({"type": "refused", "reason": reason, **extra}))

    try:
        hello = pa.read_up(protocol.loads(await receive()), "")
    except protocol.ProtocolError as e:
        await refuse(f"a bad hello: {e}")
        return None
    if not isinstance(hello, pa.Hello) or hello.protocol != protocol.PROTOCOL_VERSION:
        await refuse(f"unsupported protocol: this control speaks agent protocol {protocol.PROTOCOL_VERSION}, "
                     f"and a stream opens with a hello")
        return None
    if machine is not None and hello.node != machine:
        log.warning("refused the stream of the agent of node %s: it says it is node %s", machine, hello.node)
        await refuse(f"this machine's certificate is for node {machine!r}: it cannot speak for node {hello.node!r}",
                     code="forbidden")
        return None
    if not is_leader():
        status = leader_info()  # `leader_url`: where the agent goes next, once the leader announced it
        await refuse("not the leader", leader=status.get("leader"), leader_url=status.get("leader_url"))
        return None
    try:
        first = pa.read_up(protocol.loads(await receive()), hello.node)
    except protocol.ProtocolError as e:
        log.warning("node %s opened its stream with a bad inventory: %s", hello.node, e)
        await refuse(f"a bad inventory: {e}")
        return None
    if not isinstance(first, pa.Inventory):
        await refuse("expected an inventory after the hello")
        return None
    return hello, first.inventory


async def _renewal(renew: Renew | None, node: str, csr: str) -> dict[str, Any]:
    """The `certificate` answering an agent's `renew`, or `rejected` with the reason."""
    if renew is None:
        return pa.Rejected("renew", "this agent authenticated with no certificate: nothing to renew").to_doc()
    try:
        return await renew(node, csr)
    except AdminError as e:
        log.warning("node %s asked to renew its certificate, refused: %s", node, e.message)
        return pa.Rejected("renew", e.message).to_doc()


async def _outbound(send: Send, messages: trio.MemoryReceiveChannel[dict[str, Any]], heartbeat_s: float,
                    done: trio.CancelScope) -> None:
    async with messages:
        while True:
            # A heartbeat when there is nothing to say: the agent tells a quiet leader from a dead one.
            message: dict[str, Any] = {"type": "heartbeat"}
            with trio.move_on_after(heartbeat_s):
                try:
                    message = await messages.receive()
                except trio.EndOfChannel:
                    break
            await send(protocol.dumps(message))
    done.cancel()  # the hub closed this link (a newer stream, or this member stepped down)


async def _inbound(receive: Receive, hub: AgentHub, link: AgentLink, renew: Renew | None) -> None:
    node = link.node
    while True:
        # An agent whose machine vanished (or stopped) closes nothing: its silence is how the leader learns.
        with trio.move_on_after(hub.silence_s) as quiet:
            raw = await receive()
        if quiet.cancelled_caught:
            log.warning("node %s said nothing for %g s (%d heartbeat intervals): closing its stream; its grace "
                        "period starts", node, hub.silence_s, round(hub.silence_s / hub.heartbeat_s))
            return
        hub.heard(link)
        kind = "?"
        decoded: dict[str, Any] = {}
        try:
            decoded = protocol.loads(raw)
            kind = str(decoded.get("type"))
            message = pa.read_up(decoded, node)
        except protocol.ProtocolError as e:
            log.warning("node %s sent a malformed %s message, refused: %s", node, kind, e)
            hub.send(node, pa.Rejected(kind, str(e), pa.replica_id_of(decoded)).to_doc())
            continue
        if isinstance(message, pa.Replicas):
            hub.report_replicas(link, list(message.replicas))
        elif isinstance(message, pa.Inventory):
            hub.report_inventory(link, message.inventory)
        elif isinstance(message, pa.Rejected):
            if message.message_type == "upgrade_agent":
                hub.upgrade_refused[node] = message.reason
            log.warning("node %s refused a %s message%s: %s", node, message.message_type,
                        f" for {message.replica_id}" if message.replica_id else "", message.reason)
        elif isinstance(message, pa.Hello):
            hub.send(node, pa.Rejected("hello", "hello is the first message of a stream only").to_doc())
        elif isinstance(message, pa.Renew):
            hub.send(node, await _renewal(renew, node, message.csr))
        elif isinstance(message, pa.Unknown):
            log.debug("node %s sent a message of a type this control does not know: %r", node, message.type)
        # A heartbeat records only the contact: traffic on the stream, so a dead connection shows.
