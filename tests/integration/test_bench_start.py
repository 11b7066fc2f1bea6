"""Benches that always start and cannot rot unseen (issue 26): tests/bench/raft.py's member processes start
whatever the cluster secret begins with (`secrets.token_urlsafe` begins with "-" one time in 32, which
argparse took for an option on the command line: the secret now goes by a file), and
tests/bench/placement.py's mixed fleet plans, on a toy size, what `place` rebuilt for every replica plans.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from tests.support.figures import load_bench


def test_the_raft_bench_members_start_with_a_secret_that_begins_with_a_dash(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bench = load_bench("raft")
    secret = "-" + secrets.token_urlsafe(32)[1:]
    monkeypatch.setattr(secrets, "token_urlsafe", lambda n=None: secret)
    got = bench.commit_throughput(tmp_path, [(1, 5, False)])  # three members started, a leader, 5 commits
    assert [(inflight, group) for inflight, group, _ in got] == [(1, False)] and got[0][2]["per_s"] > 0
    argv = bench.member_argv("127.0.0.1:1", ["127.0.0.1:2"], tmp_path / "s", tmp_path / "cluster.secret")
    assert secret not in argv and bench.member_of(bench.parser().parse_args(argv[2:]))[3] == secret


def test_the_placement_bench_mixed_fleet_plans_what_place_plans() -> None:
    bench = load_bench("placement")
    nodes, wanted = bench.mixed_fleet(24), bench.models(60)
    assert len({n.gpus for n in nodes.values()}) == 24, "a shape per node"
    view = bench.plan_with_view(nodes, wanted)
    naive = bench.plan_naive(nodes, wanted)
    assert len(naive) > 20
    assert sorted((p.replica_id, p.node, p.gpus) for p in naive) == sorted(
        (p.replica_id, p.node, p.gpus) for p in view.placements.values())
