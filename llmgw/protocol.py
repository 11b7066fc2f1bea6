"""The agent ↔ control stream: JSON messages over one WebSocket per agent.

Up (agent → control): hello, inventory, replicas (the full list, on every
change), heartbeat. Down (control → agent): welcome, start_replica,
stop_replica, refused. Each message is an object with a "type".
"""

from __future__ import annotations

import json
from typing import Any

PROTOCOL_VERSION = 1
STREAM_PATH = "/api/v1/agent/stream"
MAX_MESSAGE_BYTES = 4 << 20


class ProtocolError(ValueError):
    pass


def dumps(message: dict[str, Any]) -> str:
    return json.dumps(message, separators=(",", ":"))


def loads(text: str | bytes) -> dict[str, Any]:
    if len(text) > MAX_MESSAGE_BYTES:
        raise ProtocolError("message too large")
    try:
        message = json.loads(text)
    except ValueError as e:
        raise ProtocolError(f"not JSON: {e}") from None
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise ProtocolError("a message is an object with a 'type'")
    return message
