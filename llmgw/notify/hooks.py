"""Webhooks as the `notify.webhooks` setting names them, their ids (a URL's secret path never shown), and
the bodies posted to them: llmgw's JSON event, or Slack's `{"text": ...}`. Standard library only.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from llmgw.domain.conditions import Condition

Format = Literal["json", "slack"]
EventKind = Literal["started", "resolved", "test"]
TEST_CONDITION = Condition("test", "", "info", "a test event (`llmgw ctl notify test`): this webhook receives llmgw's "
                                               "events; nothing is wrong")


@dataclass(frozen=True)
class Webhook:
    url: str
    format: Format = "json"

    @property
    def id(self) -> str:
        return hook_id(self.url)


def webhooks_of(value: Any) -> list[Webhook]:
    """The webhooks a (validated) `notify.webhooks` value names, in its order: a plain URL is JSON."""
    out = []
    for item in value if isinstance(value, list) else ():
        if isinstance(item, str):
            out.append(Webhook(item))
        elif isinstance(item, Mapping) and isinstance(item.get("url"), str):
            out.append(Webhook(item["url"], "slack" if item.get("format") == "slack" else "json"))
    return out


def hook_id(url: str) -> str:
    """How a webhook is named in status, events, logs and metrics: its scheme and host, and a short hash
    of the whole URL. Never its path or query: a Slack (or most) webhook URL's path is its secret."""
    scheme, _, rest = url.partition("://")
    host = rest.split("/", 1)[0].split("?", 1)[0].rpartition("@")[2]  # user:password@ is a secret too
    return f"{scheme}://{host}/…#{hashlib.sha256(url.encode()).hexdigest()[:8]}"


@dataclass(frozen=True)
class Event:
    """One thing to post: a condition that started or resolved (or a test), when, and since when."""

    kind: EventKind
    condition: Condition
    at: float  # unix time the leader saw it
    since: float | None = None  # when the condition started (resolved: how long it lasted)
    cluster: Mapping[str, Any] = field(default_factory=dict)

    def doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"event": self.kind, "condition": self.condition.to_doc(), "at": self.at,
                               "at_utc": _utc(self.at), "cluster": dict(self.cluster)}
        if self.since is not None:
            doc["since"] = self.since
            doc["duration_s"] = round(max(self.at - self.since, 0.0), 3)
        return doc

    def text(self) -> str:
        """The event in one message, as Slack shows it."""
        c = self.condition
        what = f"{c.kind} {c.subject}".strip()
        where = self.cluster.get("leader") or "?"
        if self.kind == "test":
            return f"llmgw test (leader {where}): {c.words}"
        head = {"started": f"[{c.severity.upper()}] {what}", "resolved": f"[RESOLVED] {what}"}[self.kind]
        tail = f" (after {self.at - self.since:.0f} s)" if self.kind == "resolved" and self.since is not None else ""
        return f"llmgw {head}{tail} (leader {where}): {c.words}"


def body(event: Event, fmt: Format) -> bytes:
    doc = {"text": event.text()} if fmt == "slack" else event.doc()
    return json.dumps(doc).encode()


def _utc(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
