"""tests/bench/reads.py (docs/ha.md and docs/performance.md quote it) cannot rot unseen: a few reads on a
group of one and of three, and the table it prints has one row per kind, each beside its baseline."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from tests.support.figures import load_bench

pytestmark = pytest.mark.slow


def test_the_reads_bench_times_every_kind_of_read(tmp_path: Path) -> None:
    bench = load_bench("reads")
    probes = trio.run(bench.measure, tmp_path, 1, 3) + trio.run(bench.measure, tmp_path, 3, 3)
    rows = bench.table(probes)
    assert [(r[0], r[1], r[2]) for r in rows[1:]] == [
        ("1", "leader", "GET /health"), ("1", "leader", "GET /api/v1/cluster/self"),
        ("1", "leader", "GET /api/v1/settings"),
        ("3", "leader", "GET /health"), ("3", "leader", "GET /api/v1/cluster/self"),
        ("3", "leader", "GET /api/v1/settings"), ("3", "standby (forwarded)", "GET /api/v1/settings")]
    assert all(len(p.took) == 3 for p in probes)
    assert [r[5] for r in rows[1:] if r[2] == "GET /health"] == ["baseline", "baseline"]
