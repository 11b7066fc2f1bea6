"""A long-running process's garbage collector (`cli/_collector.py`): what the start made is frozen (never
scanned again) and the young generation is collected every `YOUNG` allocations, not CPython's 700. In a
process of its own: the test runner's collector stays as it is. (What it buys at 1,000 nodes is measured by
tests/bench/fleet.py, never timed here.)"""

from __future__ import annotations

import json
import subprocess
import sys

from llmgw.cli import _collector

SCRIPT = """
import gc, json
before = gc.get_freeze_count()
from llmgw.cli import _collector
_collector.settle()
print(json.dumps({"threshold": gc.get_threshold(), "frozen_before": before, "frozen": gc.get_freeze_count()}))
"""


def test_settle_freezes_what_the_start_made_and_collects_the_young_generation_less_often() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True).stdout
    seen = json.loads(out)
    assert seen["threshold"] == [_collector.YOUNG, _collector.MIDDLE, _collector.OLD]
    assert _collector.YOUNG > 700  # CPython's default, which made full collections of a leader's heap every 3 s
    assert seen["frozen_before"] == 0 and seen["frozen"] > 10_000  # the modules and what their import made
