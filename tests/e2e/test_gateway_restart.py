"""Gateways restarted in place under a client load: `llmgw ctl gateways restart` on one gateway, and `llmgw
restart` of the whole cluster (the agent, the control plane, then each gateway and each worker of a --workers
one, one at a time), on real processes, while clients send plain and streamed chat completions through both
gateways. No request fails; every gateway process runs on with the same pid as a new program (a new start
time); the refusals name their reasons."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.processes import children_of
from tests.support.restart_load import Load, RestartCluster, restart_cluster

pytestmark = pytest.mark.slow


def ctl(cluster: RestartCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmgw", "ctl", *args], capture_output=True, text=True,
                          env=cluster.env, timeout=600)


def test_the_whole_cluster_restarts_under_load_and_no_request_fails(tmp_path: Path) -> None:
    with restart_cluster(tmp_path) as cluster:
        before = cluster.gateways()
        workers = children_of(cluster.procs["gw-b"].pid)
        assert {g["pid"] for n, g in before.items() if n.startswith("gw-b-")} <= workers
        assert all(g["restartable"] for g in before.values()), before
        with Load(cluster.gateway_urls, clients=4) as load:
            one = ctl(cluster, "gateways", "restart", "gw-a")
            assert one.returncode == 0, one.stdout + one.stderr + cluster.logs()
            assert f"gateway gw-a: restarted (pid {before['gw-a']['pid']})" in one.stdout, one.stdout
            mid = cluster.gateways()
            assert mid["gw-a"]["started_at"] != before["gw-a"]["started_at"]

            everything = subprocess.run([sys.executable, "-m", "llmgw", "restart"], capture_output=True, text=True,
                                        env=cluster.env, timeout=900)
            assert everything.returncode == 0, everything.stdout + everything.stderr + cluster.logs()
            time.sleep(1)  # the load goes on a little past the last restart
        said = everything.stdout + everything.stderr
        assert "restarting 1 agent(s)" in said and "restarting 3 gateway(s), one at a time" in said, said
        after = cluster.gateways()
        for name in ("gw-a", "gw-b-w1", "gw-b-w2"):
            assert f"gateway {name}: restarted (pid {before[name]['pid']})" in said, said
            assert after[name]["connected"] and after[name]["pid"] == before[name]["pid"], (before, after)
            assert after[name]["started_at"] not in (before[name]["started_at"], mid[name]["started_at"]), after
        assert all(p.poll() is None for p in cluster.procs.values()), "every process runs on (exec in place)"
        assert children_of(cluster.procs["gw-b"].pid) >= {after["gw-b-w1"]["pid"], after["gw-b-w2"]["pid"]}
        assert "took over the listening socket" in (tmp_path / "gw-a.log").read_text()

        outcomes, failed = load.outcomes, load.failed()
        assert not failed, (len(outcomes), [f.error for f in failed[:5]])
        by = {(o.gateway, o.stream) for o in outcomes}
        assert by == {("gw-a", False), ("gw-a", True), ("gw-b", False), ("gw-b", True)}, by
        assert len(outcomes) > 50, len(outcomes)

        # The refusals, with their reasons.
        r = ctl(cluster, "gateways", "restart", "nobody")
        assert r.returncode != 0 and "no gateway named 'nobody'" in r.stderr, r.stdout + r.stderr
        listed = ctl(cluster, "gateways")
        assert listed.returncode == 0 and "gw-b-w2" in listed.stdout and "in place" in listed.stdout, listed.stdout
