"""Cluster settings: the known keys, their types and defaults, in one place.

Unknown keys are refused so a typo never silently does nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Mapping

from llmgw.domain.frozen import thaw
from llmgw.domain.priority import CLASSES
from llmgw.domain.schedule import zone_problem


class SettingError(ValueError):
    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message


@dataclass(frozen=True)
class SettingSpec:
    key: str
    default: Any  # plain JSON, as the API shows it; `effective` hands out copies
    help: str
    check: Callable[[Any], str | None]  # returns a complaint, or None when valid


def _bool(v: Any) -> str | None:
    return None if isinstance(v, bool) else "must be true or false"


WEBHOOK_FORMATS = ("json", "slack")
WEBHOOKS_MAX = 20


def _webhooks(v: Any) -> str | None:
    """A list of webhooks, each a URL or `{"url": URL, "format": "json" | "slack"}` (format optional:
    json). A URL is http(s) with a host; the list names each URL once."""
    if not isinstance(v, list):
        return 'must be a list of URLs or {"url": URL, "format": "json" | "slack"} objects'
    if len(v) > WEBHOOKS_MAX:
        return f"at most {WEBHOOKS_MAX} webhooks"
    seen: set[str] = set()
    for i, item in enumerate(v):
        if isinstance(item, dict):
            unknown = sorted(set(item) - {"url", "format"})
            if unknown:
                return f"item {i}: unknown field(s) {', '.join(map(repr, unknown))}; known: url, format"
            url, fmt = item.get("url"), item.get("format", "json")
            if fmt not in WEBHOOK_FORMATS:
                return f"item {i}: format must be one of {', '.join(WEBHOOK_FORMATS)}, not {fmt!r}"
        else:
            url = item
        if not isinstance(url, str):
            return f"item {i}: must be a URL or an object with a url"
        scheme, sep, rest = url.partition("://")
        host = rest.split("/", 1)[0].split("?", 1)[0]
        if scheme not in ("http", "https") or not sep or not host or any(c.isspace() for c in url):
            return f"item {i}: {url!r} is not an http(s) URL with a host"
        if url in seen:
            return f"item {i}: {url!r} is listed twice"
        seen.add(url)
    return None


def _load_factor(v: Any) -> str | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 0 <= v <= 100:
        return "must be a number from 0 to 100"
    return None


def _positive_number(v: Any) -> str | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or not math.isfinite(v):
        return "must be a positive number"
    return None


def _whole(low: int, high: int, words: str = "") -> Callable[[Any], str | None]:
    """The check of a whole number from `low` to `high` (true and false are not numbers here);
    `words` say the range when its numbers alone would not."""
    complaint = f"must be a whole number {words or f'from {low} to {high}'}"

    def check(v: Any) -> str | None:
        if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
            return complaint
        return None

    return check



def _per_class(v: Any) -> str | None:
    """{class: whole number from 1 to 100000} for some of the priority classes."""
    if not isinstance(v, dict):
        return f"must be an object of priority classes ({', '.join(CLASSES)}) to whole numbers"
    for name, n in v.items():
        if name not in CLASSES:
            return f"{name!r} is not a priority class; known: {', '.join(CLASSES)}"
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 100_000:
            return f"{name}: must be a whole number from 1 to 100000"
    return None


WEIGHTS_DIRS_MAX = 64


def _weights_dirs(v: Any) -> str | None:
    """Absolute directory paths, each once: no `..` segment, no control characters, at most 1024 characters."""
    if not isinstance(v, list) or len(v) > WEIGHTS_DIRS_MAX:
        return f"must be a list of at most {WEIGHTS_DIRS_MAX} absolute directory paths"
    for i, path in enumerate(v):
        if (not isinstance(path, str) or not path.startswith("/") or len(path) > 1024
                or any(ord(c) < 32 or ord(c) == 127 for c in path) or ".." in path.split("/")):
            return f"item {i}: {str(path)[:80]!r} is not an absolute path (without '..' or control characters)"
        if path in v[:i]:
            return f"item {i}: {path!r} is listed twice"
    return None


def _port_range(v: Any) -> str | None:
    if (not isinstance(v, list) or len(v) != 2 or any(isinstance(p, bool) or not isinstance(p, int) for p in v)
            or not 1024 <= v[0] <= v[1] <= 65535):
        return "must be [FIRST, LAST]: two ports from 1024 to 65535, FIRST <= LAST"
    return None


SETTINGS: Mapping[str, SettingSpec] = MappingProxyType({
    s.key: s
    for s in (
        SettingSpec("serving.stopped", False, "true: every model wants 0 replicas, /v1 POSTs get 503", _bool),
        SettingSpec("guard.enabled", True, "false: every guard check is a no-op", _bool),
        SettingSpec("notify.webhooks", [], "where the leader posts each failure as it starts and resolves (lost node, "
                    "parked or unplaceable model, judge down, ...): URLs, or {\"url\": URL, \"format\": \"json\" | "
                    "\"slack\"} objects (docs/observability.md)", _webhooks),
        SettingSpec("placement.warn_interval_s", 600, "repeat an unchanged no-placement warning this often",
                    _positive_number),
        SettingSpec("health.park_after_failures", 5, "start failures in a row before a model is parked",
                    _whole(1, 1000)),
        SettingSpec("health.restart_storm_restarts", 3, "this many restarts of one model's replicas (failed starts "
                    "or crashes) within restart_window_s is a restart storm: shown in `ctl status`, posted, alerted",
                    _whole(1, 1000)),
        SettingSpec("health.avoid_node_after_failures", 2, "start failures of a model in a row on one node before "
                    "placement avoids that node for that model (for node_avoid_s)", _whole(1, 1000)),
        SettingSpec("scaling.outstanding_per_replica", 8, "requests in flight per replica above which a model gets "
                    "another replica (up to replicas.max)", _whole(1, 1000)),
        SettingSpec("scaling.evict_after_idle_s", 300, "an on-demand replica with nothing in flight and no request "
                    "for this long may be stopped to make room for a model that is asked for", _positive_number),
        SettingSpec("gateway.upstream_connections_per_replica", 256, "each gateway opens at most this many "
                    "connections to one replica (requests in flight to it) unless its model sets "
                    "limits.concurrency_per_replica; more wait in its queue, by priority class and key",
                    _whole(1, 100_000)),
        SettingSpec("gateway.upstream_queue_per_replica", 1024, "requests of each priority class (unless "
                    "gateway.queue_per_class sets it) that may wait, in each gateway, for a "
                    "connection to one replica at its limit; past that they get 503 overloaded at once",
                    _whole(1, 100_000)),
        SettingSpec("gateway.breaker_failures", 5, "a replica that fails this many requests in a row (5xx answers, "
                    "timeouts, broken connections) is taken out of rotation by each gateway's circuit breaker, "
                    "probed again after breaker_open_s", _whole(1, 100_000)),
        SettingSpec("gateway.queue_per_class", {}, "requests of one priority class that may wait, in each gateway, "
                    "for a slot of one replica at its limit, by class: {\"bulk\": 64, ...}; a class left out takes "
                    "gateway.upstream_queue_per_replica; past it a request of that class gets 503 overloaded at once",
                    _per_class),
        SettingSpec("gateway.activation_queue_per_model", 256, "requests that may wait, in each gateway, for a "
                    "model with no ready replica (its activation); past that they get 503 overloaded at once",
                    _whole(1, 100_000)),
        SettingSpec("activation.load_mib_per_s", 200, "the nominal rate (MiB/s) at which a starting replica loads its "
                    "checkpoint: a start's ETA is its size at this rate plus activation_load_base_s, and a model's "
                    "activation window is at least that long (docs/operations.md, \"Cold starts\")", _positive_number),
        SettingSpec("gateway.affinity_load_factor", 0.25, "prefix affinity's bounded load: a request passes "
                    "over the replica its prefix hashes to when that replica would hold more than (1 + this) times "
                    "the mean of the model's requests in flight (docs/performance.md, prefix affinity)",
                    _load_factor),
        SettingSpec("models.weights_dirs", [], "directories a model's source may name a local path in, beside the "
                    "storage dirs the agents report (--storage); a path anywhere else is refused when the model is "
                    "defined (docs/api.md)", _weights_dirs),
        SettingSpec("groups.ports", [29500, 29999], "the ports a multi-node replica's rank 0 may listen on for its "
                    "members (one picked from the group id; the same port on every member's node)", _port_range),
        SettingSpec("requestlog.max_bytes", 1 << 30, "each gateway keeps at most this many bytes of request log "
                    "segments in its state dir (the oldest go first)",
                    _whole(1 << 20, 1 << 50, "of bytes from 1048576 (1 MiB) to 2**50")),
        SettingSpec("requestlog.max_age_days", 30, "each gateway removes request log segments whose newest record "
                    "is older than this", _positive_number),
        SettingSpec("usage.retention_days", 90, "hourly usage rollups in the replicated state older than this are "
                    "dropped", _positive_number),
        SettingSpec("nodes.require_approval", False, "true: a node whose agent connects for the first time is "
                    "pending (listed with its inventory, nothing placed on it) until `ctl nodes approve NAME`; the "
                    "nodes known when it is turned on are approved then (docs/security.md, \"Approving nodes\")", _bool),
        SettingSpec("cluster.time_zone", "UTC", "the time zone of the models' schedule rules (their cron times): an "
                    "IANA name such as Europe/Berlin, as this machine's time zone database knows it (docs/operations.md, "
                    "\"Schedules\")", zone_problem),
        SettingSpec("mirror.budget_gib", 100, "the model mirror keeps at most this many GiB of files on each control "
                    "plane; an upload that would pass it is refused at its start (docs/mirror.md)", _positive_number),
    )
})


def validate(key: str, value: Any) -> None:
    spec = SETTINGS.get(key)
    if spec is None:
        raise SettingError(key, "unknown setting; known: " + ", ".join(sorted(SETTINGS)))
    complaint = spec.check(value)
    if complaint:
        raise SettingError(key, complaint)


def effective(settings: Mapping[str, Any], key: str) -> Any:
    """The value in force, the stored one else the default, as plain JSON (lists, dicts).

    A fresh copy: the API can serialize it and a caller may change it, and neither the
    (frozen) stored value nor the default changes with it."""
    return thaw(settings[key] if key in settings else SETTINGS[key].default)
