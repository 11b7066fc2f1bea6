"""`ctl plan` and `POST /api/v1/plan`: a what-if placement of a definition (a file, flags, or a
defined model changed by flags) against the live state: where it would land, or every node's
verdict grouped by reason; nothing changes (the state's revision is the same after)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from ctl_fakes import CATALOG, MODEL, FakeApi, columns, ctl
from llmgw.control.api import make_app
from llmgw.control.context import Context
from llmgw.control.ops.plan import groups, plan_doc
from llmgw.control.hub import AgentHub
from llmgw.control.reconciler import Reconciler
from llmgw.domain import commands
from llmgw.domain.keys import hash_key
from llmgw.domain.observed import NodeInfo
from llmgw.placement import NEVER, NOT_NOW, Refusal
from llmgw.testing.builders import model, node, observed, placed, state_with, store_with

ADMIN = "sk-admin-plan"

FITS = {"model": "big", "revision": 7, "nodes": 3, "fits": True, "reason": "",
        "choice": {"node": "gpu-2", "gpus": [0, 1, 2, 3], "score": 87.5, "members": [], "fabric": ""},
        "estimate": {"bytes": 40 * 2**30, "source": "profile", "detail": "profile.memory_gib", "complete": True},
        "existing": {"defined": False, "same_definition": False, "replicas": 0},
        "groups": [{"verdict": "not_now", "code": "gpus_busy", "count": 2, "nodes": ["gpu-0", "gpu-1"],
                    "messages": [{"message": "needs 4 free GPUs, 2 free", "nodes": ["gpu-0", "gpu-1"]}]}],
        "refusals": []}
NOWHERE = {**FITS, "fits": False, "choice": None, "reason": "no node fits — gpu-0: no GPU of class b200",
           "existing": {"defined": True, "same_definition": False, "replicas": 2},
           "groups": [
               {"verdict": "not_now", "code": "gpus_busy", "count": 6, "nodes": [f"n{i}" for i in range(6)],
                "messages": [{"message": "needs 8 free GPUs, 2 free", "nodes": [f"n{i}" for i in range(5)]},
                             {"message": "needs 8 free GPUs, 0 free", "nodes": ["n5"]}]},
               {"verdict": "never", "code": "memory", "count": 1, "nodes": ["n9"],
                "messages": [{"message": "no GPU has 90 GiB", "nodes": ["n9"], "short_bytes": 10}]}]}


# --- ctl: what it sends --------------------------------------------------------------------


def test_flags_make_one_definition_and_nothing_but_the_plan_is_asked() -> None:
    api = FakeApi().on("POST", "/api/v1/plan", json_body=FITS)
    r = ctl(["plan", "--name", "big", "--engine", "vllm", "--source", "hf://o/r", "--gpus", "4",
             "--class", "h100-80g", "--class", "a100-80g", "--memory-gib", "40"], api)
    assert r.rc == 0, r.err
    assert api.bodies() == [{"name": "big", "engine": "vllm", "source": "hf://o/r",
                             "profile": {"gpus": 4, "tp": 4, "pp": 1, "classes": ["h100-80g", "a100-80g"],
                                         "memory_gib": 40}}]
    assert [(q.method, q.url.path) for q in api.requests] == [("POST", "/api/v1/plan")]


def test_a_multi_node_plan_keeps_tp_equal_to_every_gpu_of_the_replica() -> None:
    api = FakeApi().on("POST", "/api/v1/plan", json_body=FITS)
    ctl(["plan", "--name", "huge", "--engine", "vllm", "--source", "hf://o/r", "--gpus", "8", "--nodes", "2"], api)
    assert api.bodies()[0]["profile"] == {"gpus": 8, "tp": 16, "pp": 1, "nodes": 2}


def test_a_defined_model_is_planned_as_it_is_or_changed_by_flags() -> None:
    api = (FakeApi().on("GET", "/api/v1/models/demo", json_body={"model": {**MODEL, "estimate": {"bytes": 1}}})
           .on("POST", "/api/v1/plan", json_body=FITS))
    r = ctl(["plan", "--model", "demo", "--gpus", "2", "--nodes", "1"], api)
    assert r.rc == 0, r.err
    sent = json.loads(api.requests[-1].content)
    assert "status" not in sent and "estimate" not in sent and sent["source"] == "sim://demo"
    assert sent["profile"]["gpus"] == 2 and sent["profile"]["tp"] == 2 and sent["profile"]["cpu"] is True


def test_a_catalog_file_plans_each_model_or_the_one_named(tmp_path: Path) -> None:
    path = tmp_path / "catalog.toml"
    path.write_text(CATALOG)
    api = FakeApi().on("POST", "/api/v1/plan", json_body=FITS)
    assert ctl(["plan", "--file", str(path)], api).rc == 0
    names = [b["name"] for b in api.bodies()]
    assert len(names) > 1 and names[0] == "demo"
    api = FakeApi().on("POST", "/api/v1/plan", json_body=FITS)
    r = ctl(["--json", "plan", "--file", str(path), "--name", "demo"], api)
    assert [b["name"] for b in api.bodies()] == ["demo"] and json.loads(r.out) == FITS


@pytest.mark.parametrize("argv", [
    ["plan", "--name", "x"],
    ["plan", "--file", "catalog.toml", "--gpus", "2"],
    ["plan", "--file", "catalog.toml", "--model", "demo"],
])
def test_usage_errors_send_nothing(argv: list[str]) -> None:
    api = FakeApi()
    r = ctl(argv, api)
    assert r.rc == 2 and r.err.startswith("error: ") and api.requests == []


# --- ctl: what it prints -------------------------------------------------------------------


def test_where_it_would_land() -> None:
    r = ctl(["plan", "--name", "big", "--engine", "vllm", "--source", "hf://o/r"],
            FakeApi().on("POST", "/api/v1/plan", json_body=FITS))
    lines = r.out.splitlines()
    assert lines[0] == "plan for big (revision 7, 3 nodes connected; nothing was changed)"
    assert lines[1] == "fits: node gpu-2, devices 0,1,2,3, score 87.5 of 100"
    assert "memory: 40.0 GiB (profile.memory_gib)" in r.out


def test_fits_nowhere_reads_every_reason_grouped() -> None:
    r = ctl(["plan", "--name", "big", "--engine", "vllm", "--source", "hf://o/r"],
            FakeApi().on("POST", "/api/v1/plan", json_body=NOWHERE))
    assert "fits nowhere now: no node fits\n" in r.out  # each node's reason is in the table, not repeated
    assert "already defined with another definition (a change): 2 replica(s) placed" in r.out
    rows = columns(r.out, "VERDICT ")
    assert rows[0] == ["VERDICT", "REASON", "NODES", "WHY", "E.G."]
    assert rows[1] == ["not now", "gpus_busy", "5", "needs 8 free GPUs, 2 free", "n0, n1, n2, n3 +1"]
    assert rows[2] == ["not now", "gpus_busy", "1", "needs 8 free GPUs, 0 free", "n5"]
    assert rows[3] == ["never", "memory", "1", "no GPU has 90 GiB [short_bytes=10]", "n9"]
    summary = {**NOWHERE, "summary": "no fabric with 4 free whole nodes: ib-a has 1"}
    r = ctl(["plan", "--name", "big", "--engine", "vllm", "--source", "hf://o/r"],
            FakeApi().on("POST", "/api/v1/plan", json_body=summary))
    assert "fits nowhere now: no fabric with 4 free whole nodes: ib-a has 1\n" in r.out
    alone = {**NOWHERE, "groups": [], "reason": "no agent is connected"}
    r = ctl(["plan", "--name", "big", "--engine", "vllm", "--source", "hf://o/r"],
            FakeApi().on("POST", "/api/v1/plan", json_body=alone))
    assert "fits nowhere now: no agent is connected" in r.out and "REFUSED" not in r.out


# --- the answer: pure -----------------------------------------------------------------------


def test_the_plan_is_what_placement_decides_with_every_refusal_grouped() -> None:
    nodes = [node("a").gpus(8), node("b").gpus(2), node("c").gpus(2), node("d").gpus(8, "a100-80g")]
    state = state_with([model("m").vllm().gpus(4)], [placed("m", "a", [0, 1, 2, 3, 4, 5])])
    doc = plan_doc(model("big").vllm().gpus(4).classes("h100-80g").build(), state,
                   observed(n.engines("vllm") for n in nodes))
    assert doc["fits"] is False and doc["choice"] is None and doc["nodes"] == 4
    by_code = {g["code"]: g for g in doc["groups"]}
    assert {c: g["nodes"] for c, g in by_code.items()} == {"gpus_busy": ["a"], "gpu_count": ["b", "c"],
                                                          "class": ["d"]}
    assert by_code["class"]["nodes"] == ["d"] and by_code["class"]["verdict"] == NEVER
    assert sorted(r["node"] for r in doc["refusals"]) == ["a", "b", "c", "d"]
    assert doc["groups"][0]["verdict"] == NOT_NOW  # what could change first, first
    fits = plan_doc(model("small").vllm().gpus(2).build(), state, observed(n.engines("vllm") for n in nodes))
    assert fits["fits"] is True and fits["choice"]["node"] in {"a", "b", "c", "d"}
    assert len(fits["choice"]["gpus"]) == 2 and 0 <= fits["choice"]["score"] <= 100
    assert fits["existing"] == {"defined": False, "same_definition": False, "replicas": 0}
    json.dumps(doc)  # JSON all the way down


def test_refusals_group_by_verdict_and_code_then_by_message() -> None:
    refusals = (Refusal("a", NEVER, "class", "no GPU of class x"), Refusal("b", NOT_NOW, "gpus_busy", "2 free"),
                Refusal("c", NOT_NOW, "gpus_busy", "2 free"), Refusal("d", NOT_NOW, "gpus_busy", "0 free"))
    out = groups(refusals)
    assert [(g["verdict"], g["code"], g["count"]) for g in out] == [(NOT_NOW, "gpus_busy", 3), (NEVER, "class", 1)]
    assert [(m["message"], m["nodes"]) for m in out[0]["messages"]] == [("2 free", ["b", "c"]), ("0 free", ["d"])]


# --- the route: nothing changes -----------------------------------------------------------


def app_with(nodes: list[NodeInfo]) -> tuple[Any, Any]:
    store = store_with([model("demo").sim()], [placed("demo", "n1")])
    store.submit_nowait(commands.add_key(hash_key(ADMIN), "admin", "admin", 0.0))
    hub = AgentHub(clock=lambda: 1000.0)
    for info in nodes:
        send, _ = trio.open_memory_channel[dict[str, Any]](10)
        hub.report_inventory(hub.connect(info.node, send), info)
    deps = Context(store=store, hub=hub, reconciler=Reconciler(store, hub), clock=lambda: 1000.0)
    return store, make_app(deps)


async def test_the_route_answers_a_plan_and_changes_nothing() -> None:
    store, app = app_with([node("n1").gpus(2).engines("sim", "vllm").build(),
                           node("n2").gpus(8).engines("sim", "vllm").build()])
    before = store.snapshot()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://cp.test",
                                 headers={"Authorization": f"Bearer {ADMIN}"}) as c:
        r = await c.post("/api/v1/plan", json=model("big").vllm().gpus(4).doc())
        assert r.status_code == 200, r.text
        doc = r.json()
        assert doc["fits"] is True and doc["choice"]["node"] == "n2" and len(doc["choice"]["gpus"]) == 4
        assert [(g["code"], g["nodes"]) for g in doc["groups"]] == [("gpu_count", ["n1"])]
        again = await c.post("/api/v1/plan", json=model("demo").sim().doc())
        assert again.json()["existing"] == {"defined": True, "same_definition": True, "replicas": 1}
        bad = await c.post("/api/v1/plan", json={"name": "x", "engine": "nope", "source": "sim://x"})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_model"
        listed = await c.post("/api/v1/plan", json=[1])
        assert listed.status_code == 400 and listed.json()["error"]["code"] == "invalid_model"
        unauthorized = await c.post("/api/v1/plan", json=model("big").doc(), headers={"Authorization": "Bearer no"})
        assert unauthorized.status_code == 401
    assert store.snapshot().revision == before.revision and store.snapshot() == before
