"""`ctl status` as aggregates: capacity bars, fabrics and what they hold, model counts with only
the models short of what they want listed in a large catalog, the unasked-for, warnings capped;
unknown is `-`, never 0."""

from __future__ import annotations

from typing import Any

from ctl_fakes import STATUS, FakeApi, columns, ctl


def big_status(models: int = 30, nodes: int = 40, warnings: int = 25) -> dict[str, Any]:
    ok = [{"name": f"m{i:02}", "engine": "vllm", "role": "chat", "desired": 2, "ready": 2, "state": "ready",
           "satisfied": True} for i in range(models)]
    short = [
        {"name": "broken", "engine": "vllm", "role": "chat", "desired": 1, "ready": 0, "state": "parked",
         "parked": True, "reason": "parked after 5 failed starts", "satisfied": False},
        {"name": "asked", "engine": "vllm", "role": "chat", "desired": 1, "ready": 0, "state": "unplaceable",
         "reason": "no node has 8 free GPUs", "satisfied": False, "unplaceable": True},
        {"name": "fresh", "engine": "sim", "role": "chat", "desired": None, "ready": None, "state": "unknown",
         "satisfied": None},
    ]
    return {
        **STATUS,
        "nodes": [{"node": f"gpu-{i:03}", "connected": i != 0} for i in range(nodes)],
        "capacity": [
            {"class": "h100-80g", "mig": False, "nodes": 39, "used": 150, "free": 160, "unusable": 2, "reserved": 4,
             "total": 316},
            {"class": "a100-80g-mig-3g.40gb", "mig": True, "nodes": 1, "used": 1, "free": 1, "unusable": 0,
             "total": 2},
        ],
        "fabrics": [
            {"fabric": "ib-a", "nodes": 30, "whole_free_nodes": 12, "gpus_used": 100, "gpus_free": 140,
             "shared": [{"path": "/lustre", "nodes": 30, "models": ["llama"]}], "local_dirs": 3, "local_nodes": 3,
             "models": [{"name": "llama", "shared": True, "local_nodes": 0},
                        {"name": "qwen", "shared": False, "local_nodes": 3}]},
            {"fabric": "", "nodes": 9, "whole_free_nodes": 0, "gpus_used": 50, "gpus_free": 20, "shared": [],
             "local_dirs": 0, "local_nodes": 0, "models": []},
        ],
        "models": [*ok[: models // 2], *short, *ok[models // 2:]],
        "totals": {"models": models + 3, "satisfied": models, "short": 2, "parked": 1, "unplaceable": 1,
                   "unknown": 1, "starting": 0, "stopped": 0,
                   "replicas": {"desired": 2 * models + 2, "ready": 2 * models, "starting": 0, "failed": 0}},
        "idle": [{"model": f"od-{i}", "mode": "on-demand", "replicas": 1, "gpus": 2, "idle_s": 3600.0 - i,
                  "idle_timeout_s": 900.0} for i in range(8)]
        + [{"model": "unseen", "mode": "always", "replicas": 2, "gpus": 4, "idle_s": -1.0, "idle_timeout_s": None}],
        "warnings": ["model broken is parked: ..."] + [f"warning {i}" for i in range(warnings)],
    }


def test_a_large_fleet_reads_as_aggregates() -> None:
    r = ctl(["status"], FakeApi().on("GET", "/api/v1/status", json_body=big_status()))
    assert r.rc == 0, r.err
    assert "gpu-001" not in r.out and "NODES  39 connected, 1 not connected" in r.out
    cap = columns(r.out, "CLASS ")
    assert cap[0] == ["CLASS", "NODES", "USED", "FREE", "UNUSABLE", "RESERVED", "USAGE"]
    assert cap[1][:6] == ["h100-80g", "39", "150", "160", "2", "4"] and cap[1][6].endswith("] 48% used")
    assert cap[2][0] == "a100-80g-mig-3g.40gb" and cap[2][5] == "-"  # not said (an older leader): unknown
    fabrics = columns(r.out, "FABRIC ")
    assert fabrics[1] == ["ib-a", "30", "12", "100", "140", "1", "3", "2"]
    assert fabrics[2][:3] == ["(no fabric)", "9", "0"]
    assert "  ib-a holds: llama (shared), qwen (3 nodes)" in r.out


def test_a_large_catalog_lists_only_the_models_short_of_what_they_want() -> None:
    r = ctl(["status"], FakeApi().on("GET", "/api/v1/status", json_body=big_status()))
    head = next(line for line in r.out.splitlines() if line.startswith("MODELS"))
    assert "33: 30 satisfied, 2 short, 1 parked, 1 unplaceable, 1 unknown" in head
    assert "replicas: 60 ready, 62 desired, 0 starting, 0 failed" in head
    rows = columns(r.out, "NAME ")
    assert [row[0] for row in rows[1:4]] == ["broken", "asked", "fresh"] and len(rows) == 5
    assert rows[1][3:5] == ["0/1", "parked"] and rows[3][3] == "-/-"  # unknown is -, never 0
    assert "30 satisfied not listed" in r.out


def test_the_unasked_for_longest_first_unknown_as_a_dash_and_capped() -> None:
    r = ctl(["status"], FakeApi().on("GET", "/api/v1/status", json_body=big_status()))
    rows = columns(r.out, "MODEL ")
    assert rows[0] == ["MODEL", "MODE", "REPLICAS", "GPUS", "IDLE FOR", "STOPS AFTER"]
    assert rows[1] == ["od-0", "on-demand", "1", "2", "60 min", "15 min"]
    assert [row[0] for row in rows[1:7]] == [f"od-{i}" for i in range(6)] and len(rows) == 8
    assert "  … 3 more (`--json` lists each)" in r.out
    small = big_status()
    small["idle"] = small["idle"][-1:]
    r = ctl(["status"], FakeApi().on("GET", "/api/v1/status", json_body=small))
    assert columns(r.out, "MODEL ")[1] == ["unseen", "always", "2", "4", "-", "-"]


def test_warnings_are_capped_and_the_models_own_come_last() -> None:
    r = ctl(["status"], FakeApi().on("GET", "/api/v1/status", json_body=big_status()))
    said = [line for line in r.out.splitlines() if line.startswith("  ! ")]
    assert len(said) == 10 and said[0] == "  ! warning 0"
    assert "… 16 more (`--json` lists each)" in r.out


def test_small_fleets_still_list_each_node_and_every_model() -> None:
    r = ctl(["status"], FakeApi().on("GET", "/api/v1/status", json_body=big_status(models=3, nodes=4, warnings=0)))
    assert columns(r.out, "NODE ")[0][0] == "NODE"
    assert len(columns(r.out, "NAME ")) == 1 + 6 and "satisfied not listed" not in r.out


def test_an_older_answer_without_the_aggregates_still_renders() -> None:
    r = ctl(["status"], FakeApi().on("GET", "/api/v1/status", json_body=STATUS))
    assert r.rc == 0 and "CAPACITY" not in r.out and "FABRICS" not in r.out
