"""The fault campaign Jepsen would run (issue 19), CI's budget: three real `llmgw control`
processes, each in a network namespace of its own (tests/support/netns.py) with failpoints on
(llmgw/store/failpoints.py), concurrent writers and readers through every member, and each round
one of the faults a real cluster meets:

- partitions at the namespaces' hub: the leader cut off, a standby cut off, one way only (what a
  member sends, or what it receives), a bridge (two members cut apart, the third between);
- Raft messages dropped and delayed (and so reordered), on every member;
- a member's store clock jumping forward or back;
- power loss of one member or all: every write not yet flushed is dropped;
- bit flips in a stopped standby's journal or snapshot: it must refuse to start, naming the file,
  and is rejoined from the others' copy (removed, `--rejoin`, added);
- a membership change (a standby removed and added back) while messages are dropped;
- overlapping faults: the leader cut off longer than the connection timeout while another
  member loses power;

and each start of a member draws a journal compaction threshold of 40 entries or 5,000, so
snapshots are taken and installed. Checks per round (tests/support/campaign.py, `judge`): no
acknowledged write lost, none applied twice, every key's history linearizable (reads record the
member that answered), one state hash, and every member settled within 15 s of the last heal.

Replay with the seed it printed: LLMGW_FAULT_SEED=N pytest ...; the long runner, with a table per
fault kind: `tests/bench/raft_faults.py --netns --rounds 1000`.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import trio

from tests.support.campaign import NET_FAULTS, RoundConfig, RoundResult, campaign, low_compaction
from tests.support.cluster import Cluster
from tests.support.netns import Fabric, in_own_netns_or_skip

pytestmark = [pytest.mark.slow,
              pytest.mark.filterwarnings("ignore:Async generator 'httpx._content.ByteStream.__aiter__':ResourceWarning")]


def test_partitions_drops_clock_jumps_power_loss_and_bit_flips_lose_nothing_acknowledged(tmp_path: Path) -> None:
    seed = int(os.environ.get("LLMGW_FAULT_SEED") or random.randrange(1 << 30))
    rounds: list[RoundResult] = []

    def body() -> None:
        fabric = Fabric()

        async def main() -> None:
            cluster = Cluster(tmp_path, fabric=fabric, failpoints=True)
            cluster.every_start = low_compaction(random.Random(seed))
            try:
                await cluster.start()
                summary = await campaign(cluster, len(NET_FAULTS), seed, RoundConfig(seconds=1.0),
                                         on_round=rounds.append, faults=NET_FAULTS)
                report = "\n".join(summary.lines() + summary.table())
                assert not summary.failures, (f"fault campaign failed; replay with LLMGW_FAULT_SEED={seed}\n{report}\n"
                                              + "\n".join(summary.failures) + "\n" + cluster.log_tails())
                # (a fault aimed at the leader while none leads hits a standby, and is named for it)
                assert ({k.replace("leader", "standby") for k in summary.faults}
                        == {k.replace("leader", "standby") for k in NET_FAULTS}), report
                # Every round did work through its fault, and every round settled after its heal.
                assert all(r.acked > 0 and r.reads and r.settle_s is not None for r in rounds), report
                for m in cluster.members:
                    assert "Traceback" not in m.log.read_text(), m.log_tail(6000)
            finally:
                cluster.close()

        try:
            trio.run(main)
        finally:
            fabric.close()

    in_own_netns_or_skip(body)
