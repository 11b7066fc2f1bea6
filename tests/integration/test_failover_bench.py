"""tests/bench/failover.py (docs/ha.md and docs/performance.md quote it) cannot rot unseen: one trial of each
fault on three members in network namespaces, and its table has one row per fault with every figure."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from tests.support.figures import load_bench

from tests.support.netns import Fabric, in_own_netns_or_skip

# A write cut by its timeout (to a cut-off leader) leaves httpx's request body iterator unfinished; trio's
# finalizer then warns when it is collected: no resource of ours is held.
pytestmark = [pytest.mark.slow,
              pytest.mark.filterwarnings("ignore:Async generator 'httpx._content.ByteStream.__aiter__':ResourceWarning")]


def test_the_failover_bench_times_a_kill_a_cut_and_a_heal(tmp_path: Path) -> None:
    bench = load_bench("failover")
    out = []

    def body() -> None:
        fabric = Fabric()
        try:
            out.append(trio.run(bench.measure, tmp_path, fabric, 1, 1, 1.0, 2.0))
        finally:
            fabric.close()

    in_own_netns_or_skip(body)
    [kill, cut, heal] = out[0]
    assert len(kill.elected) == len(kill.committed) == 1 and len(cut.committed) == 1 and len(heal.settled) == 1
    # A write sent after the fault is acknowledged only by a new leader, which takes at least the shortest
    # election timeout (less a heartbeat) to elect: no write is acknowledged by a leader that is gone or cut off.
    assert min(kill.committed[0], cut.committed[0]) >= 0.2, (kill, cut)
    rows = bench.table(out[0])
    assert [r[0] for r in rows[1:]] == ["SIGKILL of the leader", "the leader cut off", "the leader cut off, healed"]
    assert all(cell != "-" for cell in rows[3][2:]), rows
