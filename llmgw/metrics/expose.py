"""What both roles' collectors share: families built from rows, and the exposition's bytes.

Every family name is `llmgw_` + snake case, in base units, counters ending `_total` (the unit tests parse
a scrape and check it); labels are bounded (model, node, class, state, code, member, never a request id).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST

Rows = Iterable[tuple[Sequence[str], float]]


def gauge(name: str, doc: str, labels: Sequence[str] = (), rows: Rows = ()) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=list(labels))
    for values, value in rows:
        family.add_metric(list(values), value)
    return family


def counter(name: str, doc: str, labels: Sequence[str] = (), rows: Rows = ()) -> CounterMetricFamily:
    """`name` without `_total`: prometheus-client adds it to the sample (and checks the family's name)."""
    family = CounterMetricFamily(name, doc, labels=list(labels))
    for values, value in rows:
        family.add_metric(list(values), value)
    return family


def one(name: str, doc: str, value: float | None) -> list[Metric]:
    """A single unlabelled gauge, or nothing when the value is unknown (unknown is never 0)."""
    return [] if value is None else [gauge(name, doc, (), [((), float(value))])]


def render(registry: CollectorRegistry) -> bytes:
    """The text exposition of everything the registry's collectors say now."""
    return generate_latest(registry)
