"""The cluster summary at fleet scale: capacity per GPU class (MIG included), free whole nodes
and stored weights per fabric, models counted against what they should have now, the
unasked-for, and a `ctl status` page that stays short at 200 nodes and 50 models."""

from __future__ import annotations

from typing import Any

from llmgw.cli.ctl.render.fleet import bar, idle_for, render_status
from llmgw.domain import summary
from llmgw.domain.observed import NodeInfo, Observed
from llmgw.reconcile import ModelView
from llmgw.testing.builders import (
    ReconcileLoop,
    model,
    node,
    observed,
    placed,
    replica,
    state_with,
    store_with,
)


def view(name: str, desired: int, ready: int, state: str, reason: str = "", starting: int = 0) -> ModelView:
    return ModelView(name, desired, ready + starting, ready, starting, state, reason)


def storage(path: str, fabric: str, *names: str, shared: bool = False, error: str = "") -> dict[str, Any]:
    return {"path": path, "fabric": fabric, "shared": shared, "error": error, "not_weights": [],
            "models": [{"name": n, "path": f"{path}/{n}.gguf", "kind": "gguf", "size": 1} for n in names]}


def with_storage(info: NodeInfo, *reports: dict[str, Any]) -> NodeInfo:
    return NodeInfo(**{**info.__dict__, "storage": tuple(reports)})


# --- capacity -------------------------------------------------------------------------


def test_capacity_per_class_counts_used_free_and_unusable_mig_instances_as_classes() -> None:
    nodes = [node("a").gpus(4, "h100-80g", unhealthy=[3]).fabric("ib-a"),
             node("b").gpus(1, "a100-80g").mig(1, "a100-80g", ("3g.40gb", 40), ("3g.40gb", 40)).fabric("ib-a")]
    state = state_with([model("m").gpus(2), model("s").classes("a100-80g-mig-3g.40gb").gpus(1)],
                       [placed("m", "a", [0, 1]), placed("s", "b", [1100])])
    built = summary.summarize(state, observed(nodes), None, {}).to_doc()
    rows = {c["class"]: c for c in built["capacity"]}
    assert {k: rows["h100-80g"][k] for k in ("used", "free", "unusable", "total", "nodes")} == \
        {"used": 2, "free": 1, "unusable": 1, "total": 4, "nodes": 1}
    assert (rows["a100-80g-mig-3g.40gb"]["used"], rows["a100-80g-mig-3g.40gb"]["free"]) == (1, 1)
    assert rows["a100-80g-mig-3g.40gb"]["mig"] is True and rows["h100-80g"]["mig"] is False
    # Card 1 of node b is carved: it counts as its instances, not as one more (unusable) a100.
    assert {k: rows["a100-80g"][k] for k in ("used", "free", "unusable")} == {"used": 0, "free": 1, "unusable": 0}
    assert any(w.startswith("1 h100-80g device(s) unusable") for w in built["warnings"])


def test_a_lost_nodes_devices_are_unknown_not_free() -> None:
    state = state_with([model("m").gpus(1)], [placed("m", "gone", [0])])
    built = summary.summarize(state, observed([node("a").gpus(2)], lost={"gone": 5.0}), None, {}).to_doc()
    (row,) = built["capacity"]
    assert (row["used"], row["free"]) == (0, 2)
    assert any(w.startswith("1 node(s) not connected: gone") for w in built["warnings"])


def test_usage_bars() -> None:
    assert bar(5, 15, 0, width=20) == "[#####...............] 25% used"
    assert bar(2, 1, 1, width=4) == "[##.x] 50% used"
    assert bar(None, 3, 0) is None and bar(0, 0, 0, width=2) == "[  ]"


# --- fabrics: whole free nodes, storage -------------------------------------------------


def test_free_whole_nodes_per_fabric_follow_placements_and_groups() -> None:
    nodes = [node("a1").gpus(8).fabric("ib-a"), node("a2").gpus(8).fabric("ib-a"), node("a3").gpus(8).fabric("ib-a"),
             node("b1").gpus(8).fabric("ib-b"), node("c1").gpus(8), node("cpu")]
    state = state_with([model("m").gpus(1)], [placed("m", "a2", [7])])
    fabrics = {f["fabric"]: f for f in summary.summarize(state, observed(nodes), None, {}).to_doc()["fabrics"]}
    assert fabrics["ib-a"]["whole_free_nodes"] == 2 and fabrics["ib-a"]["nodes"] == 3
    assert fabrics["ib-a"]["gpus_used"] == 1 and fabrics["ib-a"]["gpus_free"] == 23
    assert fabrics["ib-b"]["whole_free_nodes"] == 1
    # No fabric configured: listed, with its free nodes; a CPU-only node is never whole free.
    assert fabrics[""]["nodes"] == 2 and fabrics[""]["whole_free_nodes"] == 1


def test_a_shared_directory_counts_once_per_fabric_local_ones_per_node() -> None:
    a1 = with_storage(node("a1").gpus(1).fabric("ib-a").build(), storage("/lustre", "ib-a", "llama", shared=True),
                      storage("/nvme", "ib-a", "qwen"))
    a2 = with_storage(node("a2").gpus(1).fabric("ib-a").build(), storage("/lustre", "ib-a", "llama", shared=True),
                      storage("/nvme", "ib-a", "qwen", "llama"))
    b1 = with_storage(node("b1").gpus(1).fabric("ib-b").build(), storage("/nvme", "ib-b", "qwen"))
    never_asked = node("b2").gpus(1).fabric("ib-b").build()
    built = summary.summarize(state_with(), Observed(nodes={n.node: n for n in (a1, a2, b1, never_asked)}), None, {}).to_doc()
    fabrics = {f["fabric"]: f for f in built["fabrics"]}
    ib_a = fabrics["ib-a"]
    assert ib_a["shared"] == [{"path": "/lustre", "nodes": 2, "models": ["llama"]}]
    assert (ib_a["local_dirs"], ib_a["local_nodes"]) == (2, 2)
    assert ib_a["models"] == [{"name": "llama", "shared": True, "local_nodes": 1},
                              {"name": "qwen", "shared": False, "local_nodes": 2}]
    # Local storage is never read as shared: one node's copy is that node's.
    assert fabrics["ib-b"]["models"] == [{"name": "qwen", "shared": False, "local_nodes": 1}]
    assert fabrics["ib-b"]["shared"] == [] and fabrics["ib-b"]["nodes"] == 2
    weights = {w["name"]: w for w in built["weights"]}
    assert weights["llama"] == {"name": "llama", "fabrics": ["ib-a"], "shared_on": ["ib-a"], "local_nodes": 1}
    assert weights["qwen"]["fabrics"] == ["ib-a", "ib-b"] and weights["qwen"]["local_nodes"] == 3


def test_an_unreadable_storage_directory_is_one_warning_per_fabric() -> None:
    infos = [with_storage(node(f"n{i}").gpus(1).fabric("ib-a").build(), storage("/m", "ib-a", error="permission denied"))
             for i in range(30)]
    built = summary.summarize(state_with(), Observed(nodes={n.node: n for n in infos}), None, {}).to_doc()
    said = [w for w in built["warnings"] if "storage" in w]
    assert said == ["30 storage directories on ib-a could not be read: n0:/m: permission denied ..."]


# --- models, against what they should have now --------------------------------------------


def test_a_parked_model_that_should_run_reads_0_of_1_and_is_not_satisfied() -> None:
    store = store_with([model("broken").llamacpp().always().replicas(1), model("ok").sim().replicas(1)])
    built = summary.summarize(store.snapshot(), Observed(), {
        "broken": view("broken", 1, 0, "parked", "parked after 5 failed starts in a row: boom"),
        "ok": view("ok", 1, 1, "ready")}, {}).to_doc()
    rows = {m["name"]: m for m in built["models"]}
    assert (rows["broken"]["ready"], rows["broken"]["desired"], rows["broken"]["satisfied"]) == (0, 1, False)
    assert rows["ok"]["satisfied"] is True
    page = render_status(built)
    assert "0/1" in next(line for line in page.splitlines() if line.startswith("broken"))


def test_through_the_reconciler_a_model_parked_after_failed_starts_reads_0_of_1_parked() -> None:
    loop = ReconcileLoop(store_with([model("broken").sim().always().replicas(1)]), [node("n1")])
    loop.outcome = lambda action: "failed"
    for _ in range(60):  # past every backoff, until it parks
        plan = loop.tick(40.0)
    built = summary.summarize(loop.state, loop.observed(), plan.views, {}, loop.now).to_doc()
    (row,) = built["models"]
    assert (row["ready"], row["desired"], row["state"], row["parked"], row["satisfied"]) == (0, 1, "parked", True, False)
    assert built["totals"]["parked"] == 1 and built["totals"]["short"] == 1
    line = next(line for line in render_status(built).splitlines() if line.startswith("broken"))
    assert line.split()[3:5] == ["0/1", "parked"]


def test_asked_for_and_unplaceable_is_not_satisfied_and_unknown_is_not_counted() -> None:
    state = state_with([model("big").vllm().on_demand(), model("new").sim(), model("idle").sim().on_demand()])
    views = {"big": view("big", 1, 0, "unplaceable", "no node fits"),
             "idle": view("idle", 0, 0, "absent", "no replica is wanted yet")}
    built = summary.summarize(state, Observed(), views, {}).to_doc()
    rows = {m["name"]: m for m in built["models"]}
    assert rows["big"]["satisfied"] is False and rows["big"]["unplaceable"] is True
    assert rows["idle"]["satisfied"] is True  # nothing wanted, nothing had
    assert rows["new"]["satisfied"] is None and rows["new"]["desired"] is None  # not judged yet: unknown
    totals = built["totals"]
    assert (totals["models"], totals["satisfied"], totals["short"], totals["unplaceable"], totals["unknown"]) == \
        (3, 1, 1, 1, 1)
    assert totals["replicas"]["desired"] == 1 and totals["replicas"]["ready"] == 0


def test_failed_replicas_are_counted_from_the_agents_reports() -> None:
    state = state_with([model("m").sim().replicas(2)], [placed("m", "n1"), placed("m", "n1")])
    ids = sorted(state.placements)
    obs = observed([node("n1")], [replica(ids[0], "n1", "failed", model="m", error="boom"),
                                  replica(ids[1], "n1", "ready", model="m")])
    built = summary.summarize(state, obs, {"m": view("m", 2, 1, "ready")}, {}).to_doc()
    assert built["models"][0]["failed"] == 1 and built["totals"]["replicas"]["failed"] == 1


# --- the unasked-for -----------------------------------------------------------------------


def test_idle_models_longest_first_and_unknown_last_never_zero() -> None:
    models = [model(n).sim().on_demand(idle_timeout_s=600) for n in ("recent", "old", "unseen")]
    state = state_with([*models, model("unplaced").sim()], [placed("recent", "n1"), placed("old", "n1"),
                                                             placed("unseen", "n1")])
    obs = observed([node("n1")], demand={"recent": 990.0, "old": 100.0, "unplaced": 999.0})
    rows = summary.summarize(state, obs, None, {}, 1000.0).to_doc()["idle"]
    assert [(r["model"], r["idle_s"]) for r in rows] == [("old", 900.0), ("recent", 10.0), ("unseen", -1.0)]
    assert rows[0]["idle_timeout_s"] == 600 and rows[0]["replicas"] == 1
    # Without a clock every idle time is unknown, never 0 (never "just used").
    assert {r["idle_s"] for r in summary.summarize(state, obs, None, {}).to_doc()["idle"]} == {-1.0}


def test_idle_for_is_a_dash_when_unknown() -> None:
    assert idle_for(-1) is None and idle_for(None) is None
    assert idle_for(59.9) == "59 s" and idle_for(600) == "10 min" and idle_for(7500) == "2 h 5 min"


# --- 200 nodes, 50 models: one page -----------------------------------------------------------


def fleet_of_200() -> tuple[dict[str, Any], ReconcileLoop]:
    nodes = []
    for i in range(200):
        fabric = "ib-a" if i < 120 else "ib-b" if i < 190 else ""
        b = node(f"gpu-{i:03}").fabric(fabric)
        if i % 50 == 7:
            b = b.gpus(1, "a100-80g").mig(1, "a100-80g", ("3g.40gb", 40), ("3g.40gb", 40))
        else:
            b = b.gpus(8, "h100-80g", unhealthy=[5] if i % 40 == 3 else [])
        nodes.append(b.engines("sim", "vllm"))
    models = [model(f"chat-{i:02}").vllm(f"hf://org/chat-{i}").gpus(2).replicas(2, 4) for i in range(40)]
    models += [model(f"od-{i}").vllm(f"hf://org/od-{i}").gpus(1).on_demand() for i in range(8)]
    models.append(model("huge").vllm().gpus(8).classes("b200-192g"))  # fits nowhere
    models.append(model("mig-small").vllm().classes("a100-80g-mig-3g.40gb").replicas(2))
    loop = ReconcileLoop(store_with(models), nodes)
    loop.demand = {f"od-{i}": loop.now - 30 * i for i in range(4)}  # od-4.. never asked: unknown
    plan = loop.settle(max_passes=10)
    loop.lose("gpu-150")
    loop.lose("gpu-151")
    cluster = {"leader": "cp-1", "members": [{"id": f"cp-{i}", "role": "leader" if i == 1 else "standby",
                                              "state": "healthy"} for i in (1, 2, 3)]}
    return summary.summarize(loop.state, loop.observed(), plan.views, cluster, loop.now).to_doc(), loop


def test_status_at_200_nodes_and_50_models_fits_one_page() -> None:
    built, loop = fleet_of_200()
    page = render_status(built)
    lines = page.splitlines()
    assert len(lines) <= 60, page
    assert max(len(line) for line in lines) <= 200, page
    assert "gpu-042" not in page  # no per-node rows: `ctl nodes` has them
    assert "198 connected, 2 not connected" in page
    assert any(line.startswith("h100-80g") and "% used" in line for line in lines), page
    assert any(line.startswith("a100-80g-mig-3g.40gb") for line in lines), page
    assert any(line.startswith("ib-a ") for line in lines) and any(line.startswith("(no fabric)") for line in lines)
    huge = next(line for line in lines if line.startswith("huge"))
    assert "unplaceable" in huge and "-/" not in huge
    assert "satisfied not listed (`llmgw ctl models` lists each)" in page
    assert "UNASKED-FOR" in page and "2 node(s) not connected" in page
    totals = built["totals"]
    assert totals["models"] == 50 and totals["unplaceable"] == 1 and totals["short"] >= 1


def test_status_json_at_200_nodes_keeps_every_count() -> None:
    built, loop = fleet_of_200()
    fabrics = {f["fabric"]: f for f in built["fabrics"]}
    assert sum(f["nodes"] for f in built["fabrics"]) == 198
    assert fabrics["ib-b"]["nodes"] == 68  # two were lost
    h100 = next(c for c in built["capacity"] if c["class"] == "h100-80g")
    assert h100["unusable"] == 5 and h100["used"] + h100["free"] + h100["unusable"] == h100["total"]
    connected = loop.observed().nodes
    assert h100["used"] == sum(len(p.gpus) for p in loop.state.placements.values()
                               if p.node in connected and all(i < 1000 for i in p.gpus))


def test_a_crash_loop_behind_one_ready_replica_is_a_warning_with_its_last_error() -> None:
    state = state_with([model("m").sim().replicas(3)])
    crash = ModelView("m", 3, 1, 1, 0, "ready", "", failures_in_row=4, last_error="ImportError: no module x")
    built = summary.summarize(state, Observed(), {"m": crash}, {}).to_doc()
    assert "model m: 4 failed start(s) in a row, 1/3 ready: ImportError: no module x" in built["warnings"]
    row = next(line for line in render_status(built).splitlines() if line.startswith("m "))
    assert row.split()[3] == "1/3" and "4 failed start(s) in a row: ImportError: no module x" in row
