"""The command envelope every operation shares: `{"v": 1, "op": ..., "at": <unix time>, ...}`,
its version, its idempotency id (`cid`), CommandError, and the field checks more than one
aggregate's commands use. Each aggregate's module builds, checks and applies its commands with
these; `commands` (the package) dispatches them.
"""

from __future__ import annotations

import json
from types import MappingProxyType
from typing import Any, Callable, TypeVar

from llmgw.domain import levels
from llmgw.domain.state import ClusterState

_T = TypeVar("_T")
_V = TypeVar("_V")

VERSION = 1
CID_MAX_CHARS = 200
SLOT_MAX = 1_000_000

# Each operation: (stateless check, change). The check raises CommandError; it runs before a
# command is logged and again before the change is applied, so the change may trust the fields' shape.
Check = Callable[[dict[str, Any]], object]  # what it returns is not used (a reader may be the check)
Change = Callable[[ClusterState, dict[str, Any], float], tuple[ClusterState, Any]]


class CommandError(ValueError):
    """A command that cannot apply to this state; the state stays as it was."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def encode(command: dict[str, Any]) -> bytes:
    return json.dumps(command, separators=(",", ":"), sort_keys=True).encode()


def loads(blob: bytes) -> dict[str, Any]:
    """The command in `blob`, its version checked and nothing else."""
    try:
        command = json.loads(blob)
    except ValueError:
        raise CommandError("bad_command", "a command is a JSON object") from None
    # `type(...) is int`: JSON true and 1.0 equal 1 in Python but are not version 1.
    if not isinstance(command, dict) or type(command.get("v")) is not int or command["v"] != VERSION:
        raise CommandError("bad_command", f"unsupported command version: {command!r:.80}")
    return command


def make(op: str, at: float, **fields: Any) -> dict[str, Any]:
    """A command of `op`; one brought after store level 1 carries its level (`levels.stamped`)."""
    return {"v": VERSION, "op": op, "at": at, **fields, **levels.stamped(op)}


def with_cid(command: dict[str, Any], cid: str) -> dict[str, Any]:
    """The command carrying idempotency id `cid`: committed twice, it applies once."""
    return {**command, "cid": cid}


def parsed(c: dict[str, Any], key: str, read: Callable[[Any], _T], errors: type[Exception], code: str) -> _T:
    """A command's field read into its value (`read`), a refusal (`code`, the reader's words) when it raises
    one of `errors`."""
    try:
        return read(c.get(key))
    except errors as e:
        raise CommandError(code, str(e)) from None


def required(c: dict[str, Any], key: str, code: str = "bad_command") -> str:
    """A command's field that must be a non-empty string; anything else is refused, never a TypeError inside apply."""
    value = c.get(key)
    if not isinstance(value, str) or not value:
        raise CommandError(code, f"{key} must be a non-empty string")
    return value


def slot_field(slot: int | None) -> dict[str, Any]:
    """A command's optional replica `slot` field (placements and health name the slot)."""
    return {} if slot is None else {"slot": slot}


def check_slot(c: dict[str, Any]) -> None:
    """Refuses a command's `slot` unless absent or a whole number from 0 to SLOT_MAX."""
    if "slot" in c and not (type(c["slot"]) is int and 0 <= c["slot"] <= SLOT_MAX):
        raise CommandError("bad_command", f"slot must be a whole number from 0 to {SLOT_MAX}")




def readonly(mapping: dict[str, _V]) -> MappingProxyType[str, _V]:
    """A dict built here and kept by no one, handed to the next state read-only.

    Copy a state's mapping with `.copy()` or `|`, not `{**m}` or `dict(m)`: those take
    a slow path on a `MappingProxyType`, ten times slower than on a dict."""
    return MappingProxyType(mapping)
