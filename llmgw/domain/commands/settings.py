"""The setting command: `setting.put` (one cluster setting's value, checked against its entry in
`domain.settings`); its builder, stateless check and change.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from llmgw.domain.commands.core import CommandError, make, readonly
from llmgw.domain.frozen import freeze
from llmgw.domain.settings import SettingError, validate
from llmgw.domain.state import ClusterState


def put_setting(key: str, value: Any, at: float) -> dict[str, Any]:
    return make("setting.put", at, key=key, value=value)


def check_put(c: dict[str, Any]) -> None:
    key = c.get("key")
    if not isinstance(key, str):
        raise CommandError("invalid_setting", "setting key must be a string")
    try:
        validate(key, c.get("value"))
    except SettingError as e:
        raise CommandError("invalid_setting", str(e)) from None


def apply_put(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    key, value = c["key"], c.get("value")
    return replace(s, settings=readonly(s.settings | {key: freeze(value)})), {"key": key, "value": value}
