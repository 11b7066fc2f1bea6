"""tests/bench/reads.py (docs/ha.md and docs/performance.md quote it) cannot rot unseen: a few reads on a
group of one and of three, and the table it prints has one row per kind, each beside its baseline."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import trio

pytestmark = pytest.mark.slow


def _load() -> ModuleType:
    path = Path(__file__).resolve().parents[1] / "bench" / "reads.py"
    spec = importlib.util.spec_from_file_location("bench_reads", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def test_the_reads_bench_times_every_kind_of_read(tmp_path: Path) -> None:
    bench = _load()
    probes = trio.run(bench.measure, tmp_path, 1, 3) + trio.run(bench.measure, tmp_path, 3, 3)
    rows = bench.table(probes)
    assert [(r[0], r[1], r[2]) for r in rows[1:]] == [
        ("1", "leader", "GET /health"), ("1", "leader", "GET /api/v1/cluster/self"),
        ("1", "leader", "GET /api/v1/settings"),
        ("3", "leader", "GET /health"), ("3", "leader", "GET /api/v1/cluster/self"),
        ("3", "leader", "GET /api/v1/settings"), ("3", "standby (forwarded)", "GET /api/v1/settings")]
    assert all(len(p.took) == 3 for p in probes)
    assert [r[5] for r in rows[1:] if r[2] == "GET /health"] == ["baseline", "baseline"]
