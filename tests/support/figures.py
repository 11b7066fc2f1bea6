"""What the bench runners share to print their tables: a percentile of measured times."""

from __future__ import annotations


def pct(values: list[float], q: float) -> float:
    """The `q` quantile (0..1) of `values`, the nearest measured value at or above it."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]
