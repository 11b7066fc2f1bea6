"""The conditions the leader posted as started and has not yet posted as resolved, as the replicated state
keeps them (`ClusterState.active_conditions`, command `condition.update`, store level 3), and the one rule
that changes them (`update`). Pure.

Kept in the state, not in the leader's memory, so that a new leader posts the "resolved" of a condition its
predecessor posted as "started", and never posts a "started" twice; and committed before it is posted, so
that a leader that lost its majority (and cannot commit) posts nothing (llmgw/notify/notifier.py has the
order, and what a leader change between the commit and the post costs).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from llmgw.domain.conditions import CRITICAL, Condition


@dataclass(frozen=True)
class ActiveCondition:
    """A condition posted as started: its kind, subject, severity and words as last posted, and since when
    (the leader's time at its first "started": a "resolved" says how long it lasted, whoever posts it)."""

    kind: str
    subject: str
    severity: str
    words: str
    since: float

    @property
    def key(self) -> tuple[str, str]:
        return (self.kind, self.subject)

    def condition(self) -> Condition:
        return Condition(self.kind, self.subject, self.severity, self.words)

    def to_doc(self) -> dict[str, Any]:
        return {"kind": self.kind, "subject": self.subject, "severity": self.severity, "words": self.words,
                "since": self.since}

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> ActiveCondition:
        return cls(str(doc["kind"]), str(doc["subject"]), str(doc["severity"]), str(doc["words"]),
                   float(doc["since"]))


def state_key(kind: str, subject: str) -> str:
    """The key in `ClusterState.active_conditions`: `kind:subject` (a kind has no colon)."""
    return f"{kind}:{subject}"


@dataclass(frozen=True)
class Updated:
    """What one update changed, each as it is now (started, raised) or was (resolved): the events to post."""

    started: tuple[ActiveCondition, ...] = ()  # new: posted "started"
    raised: tuple[ActiveCondition, ...] = ()  # severity risen to critical: posted "started" again, same since
    resolved: tuple[ActiveCondition, ...] = ()  # gone: posted "resolved"

    def __bool__(self) -> bool:
        return bool(self.started or self.raised or self.resolved)

    def to_doc(self) -> dict[str, Any]:
        return {"started": [a.to_doc() for a in self.started], "raised": [a.to_doc() for a in self.raised],
                "resolved": [a.to_doc() for a in self.resolved]}

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> Updated:
        return cls(*(tuple(ActiveCondition.from_doc(d) for d in doc.get(part) or ())
                     for part in ("started", "raised", "resolved")))


def update(active: Mapping[str, ActiveCondition], start: Iterable[Condition], resolve: Iterable[tuple[str, str]],
           at: float) -> tuple[dict[str, ActiveCondition], Updated]:
    """`active` with `resolve` removed, then `start` added, and what changed. A condition to start that is
    already active changes nothing, unless its severity rises to critical (then it is raised, its since kept);
    one to resolve that is not active changes nothing. So the outcome, not what the caller believed, says
    what to post: two leaders' views of one condition post it once."""
    out = dict(active)
    resolved = []
    for kind, subject in resolve:
        gone = out.pop(state_key(kind, subject), None)
        if gone is not None:
            resolved.append(gone)
    started, raised = [], []
    for c in start:
        key = state_key(c.kind, c.subject)
        now = out.get(key)
        if now is None:
            out[key] = ActiveCondition(c.kind, c.subject, c.severity, c.words, at)
            started.append(out[key])
        elif c.severity == CRITICAL and now.severity != CRITICAL:
            out[key] = ActiveCondition(c.kind, c.subject, c.severity, c.words, now.since)
            raised.append(out[key])
    return out, Updated(tuple(started), tuple(raised), tuple(resolved))
