"""tests/bench/raft_tls.py runs (small), and its table has both wires with ratios to the sealed run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

BENCH = Path(__file__).resolve().parents[1] / "bench" / "raft_tls.py"


def test_the_bench_prints_both_wires() -> None:
    done = subprocess.run([sys.executable, str(BENCH), "--writes", "20", "--commands", "100", "--in-flight", "16", "--rounds", "1"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("wire") and "x rate" in lines[0], done.stdout
    sealed = next(line for line in lines if line.startswith("sealed only"))
    tls = next(line for line in lines if line.startswith("TLS + seal"))
    assert sealed.split()[4] == "1.00" and float(tls.split()[5]) > 0, done.stdout
