"""The gateway's metrics: requests by model, error code and status, latency and time-to-first-token
histograms, tokens; requests waiting for a replica's slot and their waits, by priority class; the guard's
verdicts by hazard; the request log's drops. Served at the gateway's GET /metrics.

The request path pays one `RequestMetrics.count(record)`: a few dict and list updates on plain ints, no
lock (one trio thread owns them) and no prometheus-client object. `GatewayCollector` turns them into
families only when Prometheus scrapes (tests/bench/metrics.py measures both).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import trio
from prometheus_client import CollectorRegistry
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from llmgw import __version__
from llmgw.domain.priority import CLASSES
from llmgw.gateway.checks import ENDPOINTS
from llmgw.gateway.guard import GuardStats
from llmgw.gateway.requestlog import RequestLog, RequestRecord
from llmgw.metrics.connections import connection_families
from llmgw.metrics.expose import CONTENT_TYPE, counter, gauge, render
from llmgw.wire.gate import GateStats

# Seconds. A chat answer runs from milliseconds (a refusal) to minutes (a long generation).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# A wait for a replica's slot: none at all (most), a few answers' time, or a promotion's (priority_promote_s).
WAIT_BUCKETS = (0.001, 0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# (model, code, status) rows kept; past it a new code is counted as "other" (an engine's own error codes
# are not ours to bound). Models are catalog names and statuses HTTP's, so this is only a safety net.
MAX_REQUEST_ROWS = 4096
OTHER_CODE = "other"


class _PerModel:
    """One model's histograms (counts per bucket, not cumulative; the last is +Inf) and token sums."""

    __slots__ = ("latency", "latency_sum", "ttft", "ttft_sum", "tokens_in", "tokens_out")

    def __init__(self) -> None:
        self.latency = [0] * (len(LATENCY_BUCKETS) + 1)
        self.latency_sum = 0.0
        self.ttft = [0] * (len(TTFT_BUCKETS) + 1)
        self.ttft_sum = 0.0
        self.tokens_in = 0
        self.tokens_out = 0


class RequestMetrics:
    """This gateway's request counters since it started; `count` is the request path's only cost."""

    def __init__(self) -> None:
        self.requests: dict[tuple[str, str, int], int] = {}  # (model, error code or "", status) -> requests
        self.models: dict[str, _PerModel] = {}
        self.served: dict[tuple[str, str], int] = {}  # (name asked for, model that served it) when they differ
        self.waits: dict[str, list[int]] = {}  # priority class -> counts per WAIT_BUCKETS (+Inf last)
        self.wait_sums: dict[str, float] = {}
        self.endpoints: dict[str, int] = {}  # the path asked (one of checks.ENDPOINTS, else "other") -> requests

    def count(self, r: RequestRecord) -> None:
        endpoint = r.endpoint if r.endpoint in ENDPOINTS else OTHER_CODE  # a client's path: bounded
        self.endpoints[endpoint] = self.endpoints.get(endpoint, 0) + 1
        key = (r.model, r.error, r.status)
        n = self.requests.get(key)
        if n is not None:
            self.requests[key] = n + 1
        else:
            if len(self.requests) >= MAX_REQUEST_ROWS:
                key = (r.model, OTHER_CODE, r.status)
            self.requests[key] = self.requests.get(key, 0) + 1
        per = self.models.get(r.model)
        if per is None:
            per = self.models[r.model] = _PerModel()
        seconds = r.latency_ms / 1000
        per.latency[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        per.latency_sum += seconds
        if r.ttft_ms is not None:
            seconds = r.ttft_ms / 1000
            per.ttft[bisect_left(TTFT_BUCKETS, seconds)] += 1
            per.ttft_sum += seconds
        if r.tokens_in:
            per.tokens_in += r.tokens_in
        if r.tokens_out:
            per.tokens_out += r.tokens_out
        if r.served_model and r.served_model != r.model:  # an alias's model or a fallback served (catalog names)
            pair = (r.model, r.served_model)
            self.served[pair] = self.served.get(pair, 0) + 1
        if r.queue_ms is not None and r.priority:
            waits = self.waits.get(r.priority)
            if waits is None:
                waits = self.waits[r.priority] = [0] * (len(WAIT_BUCKETS) + 1)
                self.wait_sums[r.priority] = 0.0
            seconds = r.queue_ms / 1000
            waits[bisect_left(WAIT_BUCKETS, seconds)] += 1
            self.wait_sums[r.priority] += seconds


def _histogram(name: str, doc: str, bounds: tuple[float, ...],
               rows: list[tuple[str, list[int], float]], label: str = "model") -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, labels=[label])
    for model, counts, total in rows:
        cumulative, buckets = 0, []
        for bound, n in zip((*bounds, float("inf")), counts):
            cumulative += n
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), float(cumulative)))
        family.add_metric([model], buckets, total)
    return family


class GatewayCollector(Collector):
    """The gateway's families, read from counters when scraped (`Exporter` hands it a copy)."""

    def __init__(self, metrics: RequestMetrics | None, guard: GuardStats | None = None,
                 requestlog: RequestLog | _Stats | None = None, connections: GateStats | None = None,
                 breakers: list[tuple[str, str]] | None = None, queue_depth: Sequence[int] | None = None) -> None:
        self.metrics = metrics
        self.guard = guard
        self.requestlog = requestlog
        self.connections = connections
        self.breakers = breakers  # (model, replica id) of each open circuit breaker
        self.queue_depth = queue_depth

    def collect(self) -> Iterator[Metric]:
        yield gauge("llmgw_build_info", "This process's llmgw version and role (always 1).", ("version", "role"),
                    [((__version__, "gateway"), 1.0)])
        if self.metrics is not None:
            yield from self._requests(self.metrics)
        if self.queue_depth is not None:
            yield gauge("llmgw_gateway_queue_waiting", "Requests waiting for a slot of a busy replica (its model's "
                        "limits.concurrency_per_replica), by the priority class they asked for.", ("class",),
                        [((name,), float(n)) for name, n in zip(CLASSES, self.queue_depth)])
        if self.guard is not None:
            yield from _guard(self.guard)
        if self.requestlog is not None:
            st = self.requestlog.statistics()
            yield counter("llmgw_requestlog_dropped", "Request records dropped because the request log's queue "
                          "was full (the disk is slower than the requests).", (), [((), float(st["dropped"]))])
            yield counter("llmgw_requestlog_write_errors", "Failed writes of the request log's segment files.",
                          (), [((), float(st["write_errors"]))])
            yield gauge("llmgw_requestlog_queued_records", "Request records waiting for the log's writer.",
                        (), [((), float(st["queued"]))])
        if self.connections is not None:
            yield from connection_families(self.connections)
        if self.breakers is not None:
            yield gauge("llmgw_gateway_breaker_open", "Replicas this gateway's circuit breaker keeps out of rotation "
                        "now (1 each; a closed one is absent).", ("model", "replica"),
                        [((model, rid), 1.0) for model, rid in self.breakers])

    def _requests(self, m: RequestMetrics) -> Iterator[Metric]:
        requests = dict(m.requests)
        models = dict(m.models)
        yield counter("llmgw_gateway_requests", "Requests answered, by model (\"\" when none was named or "
                      "known), error code (\"\" for a success or an engine's own answer) and HTTP status "
                      "(499: the client went away first).", ("model", "code", "status"),
                      [((model, code, str(status)), float(n)) for (model, code, status), n in sorted(requests.items())])
        yield counter("llmgw_gateway_endpoint_requests", "Requests answered, by the path asked (an endpoint of "
                      "the /v1 API, or \"other\" for any other path).", ("endpoint",),
                      [((path,), float(n)) for path, n in sorted(dict(m.endpoints).items())])
        yield _histogram("llmgw_gateway_request_duration_seconds", "Time from a request's arrival to its "
                         "answer's end, by model.", LATENCY_BUCKETS,
                         [(name, list(p.latency), p.latency_sum) for name, p in sorted(models.items())])
        yield _histogram("llmgw_gateway_time_to_first_token_seconds", "Time from a streamed request's arrival "
                         "to its first chunk from the engine, by model.", TTFT_BUCKETS,
                         [(name, list(p.ttft), p.ttft_sum) for name, p in sorted(models.items()) if sum(p.ttft)])
        yield counter("llmgw_gateway_tokens", "Tokens the engines reported in their usage, by model and "
                      "direction (prompt or completion).", ("model", "direction"),
                      [((name, d), float(v)) for name, p in sorted(models.items())
                       for d, v in (("prompt", p.tokens_in), ("completion", p.tokens_out))])
        yield counter("llmgw_gateway_served_by_other", "Requests served by another model than the one named: an "
                      "alias's model, or a fallback of a model that refused at once (docs/api.md, fallbacks and "
                      "aliases), by the name asked for and the model that served.", ("model", "served_model"),
                      [((model, served), float(n)) for (model, served), n in sorted(dict(m.served).items())])
        yield _histogram("llmgw_gateway_queue_wait_seconds", "Time a request waited for a slot of its replica "
                         "(0 when one was free), by priority class.", WAIT_BUCKETS,
                         [(name, list(m.waits[name]), m.wait_sums[name]) for name in CLASSES if name in m.waits],
                         label="class")


def _guard(g: GuardStats) -> Iterator[Metric]:
    yield counter("llmgw_guard_judge_calls", "Calls to a judge model (verdicts not found in the cache).", (),
                  [((), float(g.judge_calls))])
    yield counter("llmgw_guard_cache_hits", "Guard verdicts answered from the verdict cache.", (),
                  [((), float(g.cache_hits))])
    yield counter("llmgw_guard_refusals", "Requests refused by a guard policy (guard_refused).", (),
                  [((), float(g.refusals))])
    yield counter("llmgw_guard_judge_failures", "Judge calls that failed: no ready replica, past the budget, "
                  "an error or an answer that is not a verdict.", (), [((), float(g.failures))])
    yield counter("llmgw_guard_verdicts", "Guard verdicts by judge model and hazard: S1..S14 (one per hazard "
                  "named), safe, or error (the judge failed).", ("judge", "hazard"),
                  [((judge, hazard), float(n)) for (judge, hazard), n in sorted(dict(g.verdicts).items())])


def registry_for(metrics: RequestMetrics | None, guard: GuardStats | None = None,
                 requestlog: RequestLog | _Stats | None = None, connections: GateStats | None = None,
                 breakers: list[tuple[str, str]] | None = None,
                 queue_depth: Sequence[int] | None = None) -> CollectorRegistry:
    """A registry of the gateway's own (auto_describe off: describing would run a whole collect)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GatewayCollector(metrics, guard, requestlog, connections, breakers, queue_depth))
    return registry


class Exporter:
    """GET /metrics on the raw ASGI app. The counters are copied on the loop (dicts and short lists: tens of
    µs), then turned into families and text in a worker thread, so a big scrape (thousands of series take
    prometheus-client a good part of a second) never holds the loop (docs/performance.md's GIL switch)."""

    def __init__(self, metrics: RequestMetrics | None, guard: GuardStats | None = None,
                 requestlog: RequestLog | None = None) -> None:
        self.metrics = metrics
        self.guard = guard
        self.requestlog = requestlog
        self.connections: Callable[[], GateStats] | None = None  # the listener's gate, set by whoever serves
        self.breakers: Callable[[], list[tuple[str, str]]] | None = None  # the router's open breakers
        self.queue_depth: Callable[[], Sequence[int]] | None = None  # the pool's waiting by class (the app sets it)

    def frozen(self) -> CollectorRegistry:
        """A registry over a copy of the counters as they are now."""
        metrics = guard = None
        if self.metrics is not None:
            metrics = RequestMetrics()
            metrics.requests = dict(self.metrics.requests)
            metrics.served = dict(self.metrics.served)
            metrics.endpoints = dict(self.metrics.endpoints)
            for name, per in list(self.metrics.models.items()):
                metrics.models[name] = copy = _PerModel()
                copy.latency, copy.latency_sum, copy.ttft = list(per.latency), per.latency_sum, list(per.ttft)
                copy.ttft_sum, copy.tokens_in, copy.tokens_out = per.ttft_sum, per.tokens_in, per.tokens_out
            metrics.waits = {name: list(counts) for name, counts in list(self.metrics.waits.items())}
            metrics.wait_sums = dict(self.metrics.wait_sums)
        if self.guard is not None:
            guard = GuardStats(self.guard.judge_calls, self.guard.cache_hits, self.guard.refusals, self.guard.failures,
                               verdicts=dict(self.guard.verdicts))
        return registry_for(metrics, guard, _Stats(self.requestlog.statistics()) if self.requestlog else None,
                            self.connections() if self.connections is not None else None,
                            self.breakers() if self.breakers is not None else None,
                            list(self.queue_depth()) if self.queue_depth is not None else None)

    async def answer(self, send: Any) -> None:
        """The exposition, whole (no key: see docs/observability.md)."""
        body = await trio.to_thread.run_sync(render, self.frozen())
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", CONTENT_TYPE.encode()), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body, "more_body": False})


class _Stats:
    """The request log's statistics as read on the loop (the collector asks only for these)."""

    def __init__(self, stats: dict[str, Any]) -> None:
        self.stats = stats

    def statistics(self) -> dict[str, Any]:
        return self.stats
