"""The console's Nodes, Models and Guardrails pages show the facts of a constructed state (GPUs by class, MIG
instances as card/migN, health reasons, engines, storage per fabric, last contact; models' state, replicas,
last error, memory estimate, activation; policies, judges and what is wrong, refusals by hazard), and
their listings sort, filter and page on the server at 200 nodes and 2,000 models (counts, not time)."""

from __future__ import annotations

import json
import re
from typing import Any

import trio

from console_world import ADMIN, NOW, VIEWER, World, rows, sign_in, text_of
from llmgw.console import guardrails
from llmgw.domain import commands
from llmgw.domain.commands import usage
from llmgw.domain.guard import GuardPolicy
from llmgw.domain.observed import Gpu, NodeInfo
from llmgw.reconcile import ModelView
from llmgw.testing import MemoryStore
from llmgw.testing.builders import GIB, model, node, placed, store_with


def mig_node() -> NodeInfo:
    """A node whose card 0 is in MIG mode, carved in two 3g.40gb instances, and whose card 1 is whole."""
    card = Gpu(0, "GPU-m-0", "A100", "a100-80g", 80 * GIB, None, placeable=False, reason="MIG mode: its instances "
               "are placed")
    instances = [Gpu(1000 + n, f"MIG-m-{n}", "A100 MIG 3g.40gb", "a100-80g-mig-3g.40gb", 40 * GIB, 0,
                     mig_profile="3g.40gb", parent_index=0) for n in range(2)]
    whole = Gpu(1, "GPU-m-1", "A100", "a100-80g", 80 * GIB, 0)
    return NodeInfo("mig-1", hostname="mig-1", cpus=64, memory_total=512 * GIB, gpus=(card, *instances, whole),
                    engines=("vllm",), engine_versions={"vllm": "0.6.3"}, fabric="ib-b", version="1.2.3",
                    storage=({"path": "/models", "fabric": "ib-b", "shared": True,
                              "models": [{"name": "qwen", "path": "/models/qwen.gguf", "kind": "gguf", "size": 1}],
                              "not_weights": [], "error": ""},))


def sick_node() -> NodeInfo:
    info = node("gpu-1").gpus(2, "h100-80g").fabric("ib-a").engines("sim", "llama.cpp").build()
    bad = Gpu(1, "GPU-gpu-1-1", "H100", "h100-80g", 80 * GIB, 0, healthy=False, reason="Xid 79: fell off the bus")
    return NodeInfo(**{**info.__dict__, "gpus": (info.gpus[0], bad),
                       "storage": ({"path": "/scratch", "fabric": "local", "shared": False, "models": [],
                                    "not_weights": [], "error": "permission denied"},)})


# --- Nodes -------------------------------------------------------------------------------------------


async def test_nodes_show_gpus_by_class_mig_labels_health_engines_storage_and_contact() -> None:
    world = World(nodes=[mig_node(), sick_node(), node("gone").gpus(1).build()])
    world.hub.disconnect(world.links["gone"])  # within its grace period: disconnected, its inventory unknown
    world.now = NOW + 12
    async with world.client() as c:
        await sign_in(c)
        html = (await c.get("/nodes")).text
    table = {r[0]: r for r in rows(html, "nodes-table")}
    assert set(table) == {"mig-1", "gpu-1", "gone"}
    mig = table["mig-1"]
    assert mig[1] == "connected" and mig[2] == "ib-b"
    assert "a100-80g: 1 free of 1" in mig[3] and "a100-80g-mig-3g.40gb: 2 free of 2 (0/mig0, 0/mig1)" in mig[3]
    assert "GPU 0 (a100-80g) not placeable: MIG mode" in mig[4]
    assert mig[5] == "vllm 0.6.3" and mig[6] == "ib-b: /models (shared, 1 weights)"
    assert mig[7] == "12 s ago" and mig[8] == "1.2.3"
    sick = table["gpu-1"]
    assert "h100-80g: 1 free of 1" in sick[3]  # the unhealthy card is not capacity
    assert "GPU 1 (h100-80g) unhealthy: Xid 79: fell off the bus" in sick[4]
    assert "local: /scratch (local, 0 weights; permission denied)" in sick[6]
    gone = table["gone"]
    assert gone[1] == "disconnected for 12 s (lost in 18 s)" and gone[7] == "12 s ago"  # last heard then
    assert gone[3] == gone[4] == gone[5] == gone[6] == "unknown"  # gone: unknown, never "none" or healthy
    assert "3 node(s) known: 2 connected, 1 disconnected" in text_of(html, "nodes-counts")


async def test_one_node_lists_each_device_by_label_and_its_storage() -> None:
    world = World(nodes=[mig_node()])
    async with world.client() as c:
        await sign_in(c)
        html = (await c.get("/nodes/mig-1")).text
        missing = (await c.get("/nodes/nope")).text
    gpus = rows(html, "node-gpus")
    assert [g[0] for g in gpus] == ["0", "0/mig0", "0/mig1", "1"]
    assert gpus[1][1] == "a100-80g-mig-3g.40gb" and gpus[1][2] == "40.0 GiB" and gpus[1][3] == "0.0 GiB"
    assert gpus[0][3] == "unknown" and gpus[0][5] == "no"  # memory used not said: unknown, not 0
    assert rows(html, "node-storage") == [["ib-b", "/models", "shared", "qwen", "0", ""]]
    assert "No node named nope is known" in text_of(missing, "node-missing")


def fleet_world() -> World:
    infos = [node(f"n{i:03}").gpus(8, "h100-80g" if i % 2 else "a100-80g").fabric(f"ib-{i % 4}").build()
             for i in range(200)]
    return World(nodes=infos)


def node_names(html: str) -> list[str]:
    return re.findall(r'data-testid="node-link">([^<]+)<', html)


async def test_200_nodes_sort_filter_and_page_on_the_server() -> None:
    world = fleet_world()
    async with world.client() as c:
        await sign_in(c)
        first = (await c.get("/nodes")).text
        assert node_names(first) == [f"n{i:03}" for i in range(50)]
        assert "rows 1–50 of 200 (page 1 of 4)" in first
        last = (await c.get("/nodes?page=4")).text
        assert node_names(last) == [f"n{i:03}" for i in range(150, 200)]
        every = (await c.get("/nodes?per_page=200")).text
        assert len(node_names(every)) == 200 and 'data-testid="pager-next"' not in every
        desc = (await c.get("/nodes?sort=node&dir=desc")).text
        assert node_names(desc)[:2] == ["n199", "n198"]
        a100 = (await c.get("/nodes?class=a100-80g&per_page=200")).text
        assert len(node_names(a100)) == 100 and all(int(n[1:]) % 2 == 0 for n in node_names(a100))
        assert "200 node(s) known: 200 connected; 100 match." in text_of(a100, "nodes-counts")
        text = (await c.get("/nodes?q=ib-3&per_page=100")).text  # the text filter reads the fabric too
        assert len(node_names(text)) == 50
        nothing = (await c.get("/nodes?state=lost")).text
        assert node_names(nothing) == [] and "no node matches" in nothing
        # The pager's links keep the filter and sort.
        page2 = re.search(r'href="([^"]+)" data-testid="pager-next"', (await c.get("/nodes?class=h100-80g")).text)
        assert page2 is not None and "class=h100-80g" in page2.group(1) and "page=2" in page2.group(1)


# --- Models ------------------------------------------------------------------------------------------


def models_world() -> World:
    store = store_with([model("chat").vllm().gpus(2).memory(40).replicas(2), model("broken").sim(),
                        model("lazy").sim().on_demand(activation_window_s=120)],
                       [placed("chat", "gpu-1", [0, 1]), placed("chat", "mig-1", [1000]),
                        placed("lazy", "gpu-1", at=NOW - 30)])
    for _ in range(5):
        store.submit_nowait(commands.start_failed("broken", "broken-r1", "ImportError: no module named torch", 1.0))
    views = {"chat": ModelView("chat", 2, 2, 2, 0, "ready", ""),
             "broken": ModelView("broken", 1, 0, 0, 0, "parked", "parked after 5 failed starts"),
             "lazy": ModelView("lazy", 1, 1, 0, 1, "starting", "1 replica starting")}
    return World(store=store, nodes=[sick_node(), mig_node()], views=views)


async def test_models_show_state_replicas_where_last_error_memory_and_activation() -> None:
    world = models_world()
    async with world.client() as c:
        await sign_in(c)
        html = (await c.get("/models")).text
        detail = (await c.get("/models/chat")).text
        lazy = (await c.get("/models/lazy")).text
    table = {r[0]: r for r in rows(html, "models-table")}
    assert table["chat"][1:7] == ["vllm", "chat", "always", "ready", "2 / 2", "gpu-1, mig-1"]
    assert table["chat"][8] == "40.0 GiB (2 devices)"
    assert table["broken"][4] == "parked" and table["broken"][7] == "ImportError: no module named torch"
    assert table["broken"][8].startswith("unknown")  # a sim model has no weights: unknown, not 0
    assert "1 starting for 30 s of its 120 s activation window" in table["lazy"][4]
    assert table["lazy"][5] == "0 / 1, 1 starting"
    replicas = rows(detail, "model-replicas")
    assert [(r[1], r[2]) for r in replicas] == [("gpu-1", "0, 1"), ("mig-1", "0/mig0")]
    assert ["source", "hf://org/model"] in rows(detail, "model-definition")
    assert 'data-elapsed-s="30" data-window-s="120"' in lazy


async def test_a_parked_model_offers_retry_to_an_admin_and_says_so_to_a_viewer() -> None:
    world = models_world()
    async with world.client() as c:
        await sign_in(c)
        admin = (await c.get("/models/broken")).text
    async with world.client() as c:
        await sign_in(c, VIEWER)
        viewer = (await c.get("/models/broken")).text
    assert 'data-testid="retry-form"' in admin and "Parked (why: above)" in admin
    assert 'data-testid="retry-form"' not in viewer and "an admin can retry it from Do" in viewer


def big_models_world() -> World:
    store = MemoryStore()
    for i in range(2000):
        store.submit_nowait(commands.put_model(model(f"m{i:04}").sim().build(), 0.0))
    views = {f"m{i:04}": ModelView(f"m{i:04}", 1, 0, 0, 0, "unplaceable", "no node fits") if i % 3 == 0
             else ModelView(f"m{i:04}", 1, 1, 1, 0, "ready", "") for i in range(2000)}
    return World(store=store, views=views)


def model_names(html: str) -> list[str]:
    return re.findall(r'data-testid="model-link">([^<]+)<', html)


async def test_2000_models_sort_filter_and_page_on_the_server() -> None:
    world = big_models_world()
    async with world.client() as c:
        await sign_in(c)
        first = (await c.get("/models")).text
        assert model_names(first) == [f"m{i:04}" for i in range(50)]
        assert "rows 1–50 of 2000 (page 1 of 40)" in first and len(first) < 120_000
        last = (await c.get("/models?page=40")).text
        assert model_names(last) == [f"m{i:04}" for i in range(1950, 2000)]
        beyond = (await c.get("/models?page=99")).text  # past the end: the last page
        assert model_names(beyond) == model_names(last)
        stuck = (await c.get("/models?state=unplaceable&per_page=200")).text
        assert "667 match" in stuck and len(model_names(stuck)) == 200
        assert all(int(n[1:]) % 3 == 0 for n in model_names(stuck))
        desc = (await c.get("/models?sort=name&dir=desc&per_page=25")).text
        assert model_names(desc)[:2] == ["m1999", "m1998"] and len(model_names(desc)) == 25
        by_state = (await c.get("/models?sort=state")).text  # ready before unplaceable (the states' order)
        assert model_names(by_state)[0] == "m0001"
        one = (await c.get("/models?q=m1234")).text
        assert model_names(one) == ["m1234"]


# --- Guardrails --------------------------------------------------------------------------------------


def test_hazards_are_read_from_guard_rule_each_once() -> None:
    rule = "judge: S6,Specialized Advice; S1,Violent Crimes | judge: S6,Specialized Advice"
    assert guardrails.hazards(rule) == ["S6", "S1"]
    assert guardrails.hazards("judge: safe") == [] and guardrails.hazards("") == []
    assert guardrails.hazards("judge: error the judge did not answer within 2 s") == [guardrails.JUDGE_ERROR]
    found = guardrails.count([{"guard_rule": rule, "model": "chat", "time": 5.0},
                              {"guard_rule": "judge: S6,Specialized Advice", "model": "code", "time": 9.0},
                              {"guard_rule": "", "model": "chat", "status": 400}])
    assert found.read == 2 and found.by_hazard == {"S6": 2, "S1": 1} and found.last["S6"] == 9.0


def guard_world() -> World:
    store = store_with([model("chat").sim(), model("guard-a").sim()])
    store.submit_nowait(commands.set_policy(GuardPolicy("strict", "guard-1", categories=("S1", "S6")), 0.0))
    store.submit_nowait(commands.set_policy(GuardPolicy("code", "guard-a"), 0.0))
    return World(store=store, views={})


async def test_guardrails_show_policies_judges_and_what_is_wrong() -> None:
    world = guard_world()
    async with world.client() as c:
        await sign_in(c)
        html = (await c.get("/guardrails")).text
        world.store.submit_nowait(commands.put_setting("guard.enabled", False, 0.0))
        off = (await c.get("/guardrails")).text
    assert 'data-enabled="true"' in html and 'data-enabled="false"' in off and "guards are OFF" in off
    policies = {r[0]: r for r in rows(html, "guard-policies")}
    assert policies["strict"][1:3] == ["guard-1", "prompt"] and "S6 Specialized Advice" in policies["strict"][4]
    judges = {r[0]: r for r in rows(html, "judges-table")}
    assert judges["guard-1"][2] == "missing" and "no model named guard-1" in judges["guard-1"][3]
    assert judges["guard-a"][2] == "not_a_judge" and "has role chat, not guard" in judges["guard-a"][3]
    assert "No gateway has sent usage" in text_of(html, "refusals-none")


async def fake_gateway(records: list[dict[str, Any]], seen: list[str], *,
                       task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """A gateway's request-log endpoint over loopback: answers every query with `records`."""
    async def answer(stream: trio.SocketStream) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += await stream.receive_some(65536)
        seen.append(data.split(b"\r\n", 1)[0].decode())
        body = json.dumps({"requests": records, "cursor": None, "statistics": {"keeps_log": True}}).encode()
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                              b"connection: close\r\n\r\n%s" % (len(body), body))
        await stream.aclose()

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    task_status.started(listeners[0].socket.getsockname()[1])
    await trio.serve_listeners(answer, listeners)


async def test_refusals_are_counted_by_hazard_from_the_gateways_logs() -> None:
    world = guard_world()
    records = [{"id": f"req-gw1-{i:016x}", "time": NOW - 60 * i, "model": "chat", "key": "key_a", "status": 400,
                "guard_rule": rule}
               for i, rule in enumerate(["judge: S6,Specialized Advice", "judge: S6,Specialized Advice; S1,Violent "
                                         "Crimes", "judge: error the judge did not answer", ""])]
    seen: list[str] = []
    async with trio.open_nursery() as nursery:
        port = await nursery.start(fake_gateway, records, seen)
        rollup = usage.row_doc(3600, "key_a", "chat", 4, 0, 0, 0, 4)
        world.store.submit_nowait(usage.add_usage("gw1", "boot-1", 1, [rollup], f"http://127.0.0.1:{port}", NOW))
        async with world.client() as c:
            await sign_in(c)
            html = (await c.get("/guardrails?hours=1")).text
        nursery.cancel_scope.cancel()
    assert "status=400" in seen[0] and "limit=1000" in seen[0]
    counted = {r[0]: r for r in rows(html, "refusals-table")}
    assert counted["S6"][1:3] == ["Specialized Advice", "2"] and counted["S1"][2] == "1"
    assert counted[guardrails.JUDGE_ERROR][2] == "1" and counted["S6"][4] == "0 s ago"
    assert "3 guard refusal(s) in the last 1 h, from 1 gateway log(s)." in text_of(html, "refusals-read")
    assert len(rows(html, "refusals-recent")) == 3


async def test_every_page_answers_a_viewer_and_a_fragment() -> None:
    world = models_world()
    async with world.client() as c:
        await sign_in(c, VIEWER)
        for path in ("/nodes", "/nodes/gpu-1", "/models", "/models/chat", "/guardrails", "/do"):
            r = await c.get(path)
            assert r.status_code == 200 and "<!doctype html>" in r.text, path
            frag = await c.get(path + "?fragment=1")
            assert frag.status_code == 200 and "<!doctype" not in frag.text and "<h1>" in frag.text, path
    async with world.client(ADMIN) as api:  # a bearer key is not a console session
        assert (await api.get("/nodes")).status_code == 303
