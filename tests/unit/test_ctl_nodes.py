"""`llmgw ctl nodes` (each node: state and since when, address, fabric, GPUs by card/migN with
class and health, engines with versions, storage per fabric; unknown is `-`) and
`ctl nodes forget NAME` (the request it sends, the refusal it shows)."""

from __future__ import annotations

import json

from ctl_fakes import FakeApi, columns, ctl

GIB = 2**30

NODES = {"nodes": [
    {"node": "gpu-01", "state": "connected", "connected": True, "hostname": "gpu-01.lab", "address": "10.0.0.11",
     "fabric": "ib-a", "version": "0.4.0", "cpus": 64, "memory_total": 512 * GIB, "gone_for_s": None, "grace_s": 30.0,
     "engines": ["sim", "vllm"], "engine_versions": {"sim": "0.4.0", "vllm": "0.6.3", "llama.cpp": ""},
     "gpus": [
         {"index": 0, "label": "0", "gpu_class": "h100-80g", "memory_total": 80 * GIB, "healthy": True,
          "placeable": True, "reason": ""},
         {"index": 1, "label": "1", "gpu_class": "a100-80g", "memory_total": 80 * GIB, "healthy": True,
          "placeable": False, "reason": "MIG mode: its instances are placed"},
         {"index": 1101, "label": "1/mig1", "gpu_class": "a100-80g-mig-3g.40gb", "memory_total": 40 * GIB,
          "healthy": False, "placeable": True, "reason": "uncorrectable ECC errors: 3"},
     ],
     "storage": [
         {"path": "/nfs/models", "fabric": "ib-a", "shared": True, "error": "",
          "models": [{"name": "llama-8b", "path": "/nfs/models/llama-8b", "kind": "safetensors", "size": 1}],
          "not_weights": [{"path": "/nfs/models/partial", "reason": "index lists a missing file"}]},
         {"path": "/data", "fabric": "eth", "shared": False, "error": "the directory vanished mid-scan",
          "models": [], "not_weights": []},
     ],
     "warnings": ["nvidia-smi is missing: the NVML path alone was tried"]},
    # lost: nothing it said is known any more, but that it was there and since when
    {"node": "gpu-02", "state": "lost", "connected": False, "hostname": None, "address": None, "fabric": None,
     "version": None, "cpus": None, "gone_for_s": 95.4, "grace_s": 30.0, "engines": None, "engine_versions": None,
     "gpus": None, "storage": None, "warnings": None},
    {"node": "gpu-03", "state": "disconnected", "connected": False, "gone_for_s": 12.0, "grace_s": 30.0,
     "gpus": None},
]}


def test_nodes_lists_each_node_with_its_gpus_engines_and_storage() -> None:
    for argv in (["nodes"], ["nodes", "list"]):
        r = ctl(argv, FakeApi().on("GET", "/api/v1/nodes", json_body=NODES))
        assert r.rc == 0, r.err
        rows = columns(r.out, "NODE ")
        assert rows[0] == ["NODE", "STATE", "SINCE", "ADDRESS", "FABRIC", "VERSION", "CPUS", "GPUS", "ENGINES",
                           "CERTIFICATE"]
        assert rows[1] == ["gpu-01", "connected", "-", "10.0.0.11", "ib-a", "0.4.0", "64", "1/3 usable",
                           "llama.cpp, sim 0.4.0, vllm 0.6.3", "-"]
        assert rows[2] == ["gpu-02", "lost", "gone 95 s (grace 30 s)", "-", "-", "-", "-", "-", "-", "-"], \
            "a lost node: unknown is '-', never 0"
        assert rows[3][:3] == ["gpu-03", "disconnected", "gone 12 s (lost in 18 s)"]
        gpus = columns(r.out, "  GPU ")
        assert [row[:5] for row in gpus[1:]] == [
            ["0", "h100-80g", "80.0 GiB", "healthy", "yes"],
            ["1", "a100-80g", "80.0 GiB", "healthy", "no"],
            ["1/mig1", "a100-80g-mig-3g.40gb", "40.0 GiB", "unhealthy", "yes"],
        ]
        assert gpus[3][5] == "uncorrectable ECC errors: 3"
        storage = columns(r.out, "  FABRIC ")
        assert storage[1:] == [["eth", "/data", "no", "0", "0", "the directory vanished mid-scan"],
                               ["ib-a", "/nfs/models", "yes", "1", "1", "-"]]
        assert "warning: node gpu-01: nvidia-smi is missing" in r.out
        assert "llmgw ctl nodes forget NAME" in r.out


def test_nodes_json_is_the_api_document_and_no_nodes_says_how_to_add_one() -> None:
    r = ctl(["--json", "nodes"], FakeApi().on("GET", "/api/v1/nodes", json_body=NODES))
    assert json.loads(r.out) == NODES
    empty = ctl(["nodes"], FakeApi().on("GET", "/api/v1/nodes", json_body={"nodes": []}))
    assert empty.rc == 0 and "llmgw agent --control" in empty.out


def test_forget_sends_one_delete_with_a_key() -> None:
    api = FakeApi().on("DELETE", "/api/v1/nodes/gpu-02", json_body={"forgotten": "gpu-02"})
    r = ctl(["nodes", "forget", "gpu-02"], api)
    assert r.rc == 0 and r.out.strip() == "forgot node gpu-02"
    [request] = api.requests
    assert request.headers["idempotency-key"]


def test_forgetting_a_connected_node_is_one_error_line() -> None:
    words = "node gpu-01 is connected: stop its agent first (a node is forgotten once lost)"
    api = FakeApi().on("DELETE", "/api/v1/nodes/gpu-01", 409,
                       json_body={"error": {"code": "node_not_lost", "message": words}})
    r = ctl(["nodes", "forget", "gpu-01"], api)
    assert r.rc == 1 and r.out == ""
    assert r.err.strip() == f"error: node_not_lost: {words}"


def test_a_pending_node_shows_as_pending_with_how_to_approve_it() -> None:
    pending = {"nodes": [{**NODES["nodes"][0], "node": "gpu-09", "approval": "pending"},
                         {**NODES["nodes"][0], "approval": "approved"}]}
    r = ctl(["nodes"], FakeApi().on("GET", "/api/v1/nodes", json_body=pending))
    assert r.rc == 0
    rows = {line.split()[0]: line for line in r.out.splitlines() if line.startswith("gpu-0")}
    assert "connected, pending" in rows["gpu-09"] and "pending" not in rows["gpu-01"]
    assert "llmgw ctl nodes approve NAME" in r.out


def test_approve_sends_one_post_with_a_key_and_says_what_it_did() -> None:
    api = FakeApi().on("POST", "/api/v1/nodes/gpu-09/approve",
                       json_body={"approved": "gpu-09", "already": False, "approved_at": 1.0})
    r = ctl(["nodes", "approve", "gpu-09"], api)
    assert r.rc == 0 and r.out.strip() == "node gpu-09: approved"
    [request] = api.requests
    assert request.headers["idempotency-key"]
    again = FakeApi().on("POST", "/api/v1/nodes/gpu-09/approve",
                         json_body={"approved": "gpu-09", "already": True, "approved_at": 1.0})
    assert ctl(["nodes", "approve", "gpu-09"], again).out.strip() == "node gpu-09: already approved"


def test_cordoned_and_draining_nodes_show_so_with_the_drain_progress() -> None:
    doc = {"nodes": [{**NODES["nodes"][0], "node": "gpu-07", "cordon": "drain",
                      "drain": {"left": 2, "moving": "llama", "blocked": None,
                                "words": "draining: 2 replicas left; moving llama (waiting for its replacement "
                                         "to be ready)"}},
                     {**NODES["nodes"][0], "node": "gpu-08", "cordon": "cordon", "drain": None},
                     {**NODES["nodes"][0], "cordon": "none", "drain": None}]}
    r = ctl(["nodes"], FakeApi().on("GET", "/api/v1/nodes", json_body=doc))
    assert r.rc == 0
    rows = {line.split()[0]: line for line in r.out.splitlines() if line.startswith("gpu-0")}
    assert "connected, draining" in rows["gpu-07"] and "connected, cordoned" in rows["gpu-08"]
    assert "cordoned" not in rows["gpu-01"] and "draining" not in rows["gpu-01"]
    assert "node gpu-07: draining: 2 replicas left; moving llama" in r.out
    assert "llmgw ctl nodes uncordon NAME" in r.out


def test_cordon_drain_and_uncordon_each_send_one_post() -> None:
    for verb, answer, said in (
            ("cordon", {"node": "n1", "cordon": "cordon", "changed": True, "drain": None},
             "node n1: cordoned: nothing new is placed on it"),
            ("drain", {"node": "n1", "cordon": "drain", "changed": True,
                       "drain": {"left": 1, "moving": None, "blocked": "nowhere to go for m: no node has sim",
                                 "words": "draining: 1 replica left; blocked: nowhere to go for m: no node has sim"}},
             "node n1: draining: 1 replica left; blocked: nowhere to go for m: no node has sim"),
            ("uncordon", {"node": "n1", "cordon": "none", "changed": False, "drain": None},
             "node n1: uncordoned: it takes replicas again (already so)")):
        api = FakeApi().on("POST", f"/api/v1/nodes/n1/{verb}", json_body=answer)
        r = ctl(["nodes", verb, "n1"], api)
        assert r.rc == 0 and r.out.strip() == said, r.out
        [request] = api.requests
        assert request.headers["idempotency-key"]


def test_drain_wait_follows_the_drain_until_the_node_is_empty() -> None:
    drained = {"nodes": [{"node": "n1", "state": "connected", "cordon": "drain",
                          "drain": {"left": 0, "moving": None, "blocked": None, "words": "drained: no replica left"}}]}
    api = (FakeApi().on("POST", "/api/v1/nodes/n1/drain", json_body={"node": "n1", "cordon": "drain", "changed": True})
           .on("GET", "/api/v1/nodes", json_body=drained))
    r = ctl(["nodes", "drain", "n1", "--wait"], api)
    assert r.rc == 0 and r.out.strip() == "node n1: drained: no replica left", r.out
    assert [(q.method, q.url.path) for q in api.requests] == [("POST", "/api/v1/nodes/n1/drain"),
                                                              ("GET", "/api/v1/nodes")]
    gone = FakeApi().on("POST", "/api/v1/nodes/n1/drain", json_body={}).on(
        "GET", "/api/v1/nodes", json_body={"nodes": [{"node": "n1", "cordon": "none", "drain": None}]})
    r = ctl(["nodes", "drain", "n1", "--wait"], gone)
    assert r.rc != 0 and "no longer draining" in r.err


# --- ctl nodes show ------------------------------------------------------------------------------------------------


SHOWN = {"node": {**NODES["nodes"][0], "cordon": "drain",
                  "drain": {"left": 2, "moving": "chat", "blocked": None,
                            "words": "draining: 2 replicas left; moving chat"}},
         "agent_reported": True,
         "placements": [
             {"replica_id": "chat-r1", "model": "chat", "gpus": [0], "group": None, "rank": None, "asleep": False,
              "placed": True, "state": "starting", "phase": "loading", "error": None, "since": 1.0},
             {"replica_id": "embed-r2", "model": "embed", "gpus": [], "group": None, "rank": None, "asleep": True,
              "placed": True, "state": "sleeping", "phase": None, "error": None, "since": 2.0},
             {"replica_id": "new-r1", "model": "new", "gpus": [1101], "group": None, "rank": None, "asleep": False,
              "placed": True, "state": None, "phase": None, "error": None, "since": None},
             {"replica_id": "old-r9", "model": "old", "gpus": None, "group": None, "rank": None, "asleep": False,
              "placed": False, "state": "failed", "phase": None, "error": "exit 1", "since": 3.0}]}


def _replicas(out: str) -> list[dict[str, str]]:
    head, *rows = columns(out.split("\nreplicas\n", 1)[1], "  REPLICA")
    return [dict(zip(head, row)) for row in rows]


def test_show_prints_one_node_its_replicas_with_what_the_agent_says_and_its_gpus() -> None:
    api = FakeApi().on("GET", "/api/v1/nodes/gpu-01", json_body=SHOWN)
    r = ctl(["nodes", "show", "gpu-01"], api)
    assert r.rc == 0, r.err
    facts = dict(line.split(": ", 1) for line in r.out.split("\n\n", 1)[0].splitlines())
    assert facts["state"] == "connected, draining" and facts["memory"] == "512.0 GiB"
    assert facts["gpus"] == "1/3 usable" and facts["drain"] == "draining: 2 replicas left; moving chat"
    assert facts["engines"] == "llama.cpp, sim 0.4.0, vllm 0.6.3"
    replicas = _replicas(r.out)
    assert [(row["REPLICA"], row["GPUS"], row["STATE"], row["ERROR"]) for row in replicas] == [
        ("chat-r1", "0", "starting (loading)", "-"),
        ("embed-r2", "CPU", "sleeping, asleep", "-"),
        ("new-r1", "1101", "not running yet", "-"),
        ("old-r9", "-", "failed; no placement here (stopping)", "exit 1")]
    assert "\nGPUs\n" in r.out and "uncorrectable ECC errors: 3" in r.out
    assert "`llmgw ctl nodes uncordon gpu-01` ends the drain" in r.out


def test_show_of_a_lost_node_says_unknown_not_zero_and_an_unknown_name_is_one_error_line() -> None:
    lost = {"node": NODES["nodes"][1], "agent_reported": False,
            "placements": [{"replica_id": "chat-r3", "model": "chat", "gpus": [0, 1], "asleep": False, "placed": True,
                            "state": None, "phase": None, "error": None, "since": None}]}
    r = ctl(["nodes", "show", "gpu-02"], FakeApi().on("GET", "/api/v1/nodes/gpu-02", json_body=lost))
    assert r.rc == 0, r.err
    facts = dict(line.split(": ", 1) for line in r.out.split("\n\n", 1)[0].splitlines())
    assert facts["gpus"] == "-" and facts["cpus"] == "-" and facts["since"].startswith("gone 95 s")
    assert [(row["REPLICA"], row["STATE"]) for row in _replicas(r.out)] == [("chat-r3", "-")]
    missing = FakeApi().on("GET", "/api/v1/nodes/nope", status=404, json_body={
        "error": {"code": "node_not_found", "message": "no node named 'nope' is known to the leader"}})
    r = ctl(["nodes", "show", "nope"], missing)
    assert r.rc != 0 and "no node named 'nope' is known to the leader" in r.err
