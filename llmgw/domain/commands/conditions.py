"""The notifier's command: `condition.update` (store level 3), the conditions the leader is about to post as
started (new, or risen to critical) and as resolved; its builder, stateless check and change. The rule is
`domain.active_conditions.update`; its result says what to post (llmgw/notify/notifier.py).

Idempotent by nature: a condition already active is not started again, one not active is not resolved; so a
retried commit, or a new leader whose view lags its predecessor's last command, posts nothing twice.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from llmgw.domain.active_conditions import update
from llmgw.domain.commands.core import CommandError, make, readonly
from llmgw.domain.conditions import SEVERITIES, Condition
from llmgw.domain.state import ClusterState

UPDATE_MAX = 10_000  # conditions one command starts and resolves together (a whole fleet lost at once)
KIND_MAX_CHARS = 100
SUBJECT_MAX_CHARS = 1000
WORDS_MAX_CHARS = 4000


def update_conditions(start: Iterable[Condition], resolve: Iterable[tuple[str, str]], at: float) -> dict[str, Any]:
    return make("condition.update", at,
                start=[{"kind": c.kind, "subject": c.subject, "severity": c.severity,
                        "words": c.words[:WORDS_MAX_CHARS]} for c in start],
                resolve=[{"kind": kind, "subject": subject} for kind, subject in resolve])


def _text(item: dict[str, Any], name: str, most: int, *, empty: bool = True) -> str:
    value = item.get(name)
    if not isinstance(value, str) or len(value) > most or (not empty and not value):
        raise CommandError("bad_command", f"a condition's {name} must be a string of {0 if empty else 1} to "
                                          f"{most} characters")
    return value


def check_update(c: dict[str, Any]) -> tuple[list[Condition], list[tuple[str, str]]]:
    """The conditions to start and the keys to resolve, read."""
    start, resolve = c.get("start"), c.get("resolve")
    if not isinstance(start, list) or not isinstance(resolve, list) or len(start) + len(resolve) > UPDATE_MAX:
        raise CommandError("bad_command", f"start and resolve must be lists of at most {UPDATE_MAX} conditions")
    if not all(isinstance(item, dict) for item in (*start, *resolve)):
        raise CommandError("bad_command", "each condition is an object")
    started = []
    for item in start:
        kind, subject = _text(item, "kind", KIND_MAX_CHARS, empty=False), _text(item, "subject", SUBJECT_MAX_CHARS)
        severity, words = _text(item, "severity", 20), _text(item, "words", WORDS_MAX_CHARS)
        if severity not in SEVERITIES:
            raise CommandError("bad_command", f"a condition's severity is one of {', '.join(SEVERITIES)}")
        started.append(Condition(kind, subject, severity, words))
    resolved = [(_text(item, "kind", KIND_MAX_CHARS, empty=False), _text(item, "subject", SUBJECT_MAX_CHARS))
                for item in resolve]
    if any(":" in kind for kind, _ in [*resolved, *(x.key for x in started)]):
        raise CommandError("bad_command", "a condition's kind has no colon")
    return started, resolved


def apply_update(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    start, resolve = check_update(c)
    active, updated = update(s.active_conditions, start, resolve, at)
    if not updated:
        return s, updated.to_doc()
    return replace(s, active_conditions=readonly(active)), updated.to_doc()
