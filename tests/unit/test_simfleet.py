"""The fleet simulator's parts without sockets: what a simulated node reports (whole cards, MIG,
fabrics, storage), its in-process engines under a MockClock (the sim's flags honoured, refusals as
the real agent words them), and the one engine server's `/r/<replica id>` dispatch."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio
import trio.testing

from llmgw.agent.gpus.classes import card_class
from llmgw.agent.storage import StorageReport
from llmgw.domain.observed import mig_index
from llmgw.simfleet.engines import EngineServer, SimRunner
from llmgw.simfleet.nodes import GIB, HeldModel, NodeShape, card, node_info, node_names


def sim_model(name: str = "demo", *args: str, profile: dict[str, Any] | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {"name": name, "engine": "sim", "source": f"sim://{name}", "args": list(args)}
    if profile is not None:
        doc["profile"] = profile
    return doc


# --- what a node reports ------------------------------------------------------------------------


def test_a_node_reports_whole_cards_of_its_class_its_fabric_and_what_its_storage_holds() -> None:
    shape = NodeShape(gpus=8, gpu_class="h100-80g", holds=(HeldModel.parse("llama-70b=140"), HeldModel.parse("qwen")))
    info = node_info(shape, "sim-0001", "ib-a")
    assert [g.index for g in info.gpus] == list(range(8))
    assert {g.gpu_class for g in info.gpus} == {"h100-80g"} and all(g.usable for g in info.gpus)
    assert len({g.uuid for g in info.gpus}) == 8, "each GPU its own UUID"
    assert info.fabric == "ib-a" and info.engines == ("sim",) and info.probe == "sim"
    (doc,) = info.storage
    report = StorageReport.from_doc(doc)  # the shape a real agent's scan reports
    assert (report.fabric, report.shared) == ("ib-a", False)
    assert [(m.name, m.size) for m in report.models] == [("llama-70b", 140 * GIB), ("qwen", 8 * GIB)]
    shared = node_info(NodeShape(holds=(HeldModel.parse("qwen"),), shared_storage=True), "sim-0002", "ib-b")
    assert StorageReport.from_doc(shared.storage[0]).shared
    assert node_info(NodeShape(), "sim-0003", "ib-a").storage == (), "told to hold nothing, it reports no storage"


def test_a_mig_node_reports_its_cards_unplaceable_and_their_instances_placeable() -> None:
    info = node_info(NodeShape(gpus=2, gpu_class="a100-80g", mig=("3g.40gb", "3g.40gb")), "sim-0001", "ib-a")
    cards = [g for g in info.gpus if g.parent_index is None]
    instances = [g for g in info.gpus if g.parent_index is not None]
    assert [g.index for g in cards] == [0, 1] and not any(g.placeable for g in cards)
    assert [g.index for g in instances] == [mig_index(0, 0), mig_index(0, 1), mig_index(1, 0), mig_index(1, 1)]
    assert {g.gpu_class for g in instances} == {"a100-80g-mig-3g.40gb"}
    assert all(g.usable and g.mig_profile == "3g.40gb" and g.uuid.startswith("MIG-") for g in instances)
    assert [g.label for g in instances][:2] == ["0/mig0", "0/mig1"]


@pytest.mark.parametrize("gpu_class", ["h100-80g", "a100-40g", "rtx-4090-24g", "l40s-48g", "h200-141g"])
def test_a_class_is_reported_as_discovery_would_name_it(gpu_class: str) -> None:
    name, memory = card(gpu_class)
    assert card_class(name, memory) == gpu_class


@pytest.mark.parametrize(("shape", "words"), [
    (NodeShape(gpu_class="h100"), "a GPU class is"),
    (NodeShape(mig=("3g.40gb", "3g.40gb", "1g.10gb", "1g.10gb")), "do not fit"),
    (NodeShape(mig=("big",)), "a MIG profile is"),
    (NodeShape(fabrics=("",)), "--fabric"),
])
def test_a_shape_no_fleet_could_have_is_refused_with_why(shape: NodeShape, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        shape.check()


def test_held_models_and_names() -> None:
    assert HeldModel.parse("org:model=2.5") == HeldModel("org:model", int(2.5 * GIB))
    with pytest.raises(ValueError, match="GiB"):
        HeldModel.parse("m=0")
    assert node_names(3) == ["sim-0001", "sim-0002", "sim-0003"]
    assert node_names(2, "mig", 9999) == ["mig-09999", "mig-10000"]
    shape = NodeShape(fabrics=("ib-a", "ib-b"))
    assert [shape.fabric_of(i, 5) for i in range(5)] == ["ib-a", "ib-a", "ib-a", "ib-b", "ib-b"]


# --- the in-process engines ---------------------------------------------------------------------


@pytest.fixture
def clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


class Node:
    """One node's runner in a nursery, counting the changes it tells."""

    def __init__(self, nursery: trio.Nursery, shape: NodeShape = NodeShape(gpus=2)) -> None:
        self.changes = 0
        self.server = EngineServer()
        self.server.base = "http://fleet"
        info = node_info(shape, "sim-0001", "ib-a")
        self.runner = SimRunner(nursery, self.changed, lambda: info, node="sim-0001", server=self.server)

    def changed(self) -> None:
        self.changes += 1

    def state(self, rid: str) -> tuple[str, str, str]:
        obs = {r.replica_id: r for r in self.runner.replicas()}[rid]
        return obs.state, obs.url, obs.error


async def test_a_replica_starts_after_its_startup_delay_and_serves_at_its_path(clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        node = Node(nursery)
        node.runner.start("demo-r1", sim_model("demo", "--startup-delay", "5"), [0])
        await trio.sleep(4.9)
        assert node.state("demo-r1") == ("starting", "", "") and "demo-r1" not in node.server.apps
        await trio.sleep(0.2)
        assert node.state("demo-r1") == ("ready", "http://fleet/r/demo-r1", "")
        seen = node.changes
        node.runner.start("demo-r1", sim_model("demo", "--startup-delay", "5"), [0])
        assert node.changes == seen, "the same launch again is a no-op"
        node.runner.stop("demo-r1")
        assert node.runner.replicas() == [] and "demo-r1" not in node.server.apps
        nursery.cancel_scope.cancel()


async def test_exit_after_serves_then_fails_saying_how_long_it_served(clock: trio.testing.MockClock) -> None:
    """A flapping engine (`--exit-after`): ready, then failed with how long it served (control counts it as a flap)."""
    async with trio.open_nursery() as nursery:
        node = Node(nursery)
        node.runner.start("flappy-r1", sim_model("flappy", "--exit-after", "3"), [])
        await trio.sleep(2.9)
        assert node.state("flappy-r1")[0] == "ready" and "flappy-r1" in node.server.apps
        await trio.sleep(0.2)
        state, url, error = node.state("flappy-r1")
        assert (state, url) == ("failed", "")
        assert "status 4 while serving" in error and "(--exit-after)" in error, error
        assert node.runner.replicas()[0].ready_s == 3.0
        assert node.server.apps == {}
        nursery.cancel_scope.cancel()


async def test_fail_start_fails_after_the_delay_with_the_sim_engines_own_words(clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        node = Node(nursery)
        node.runner.start("broken-r1", sim_model("broken", "--fail-start", "--startup-delay", "1"), [])
        await trio.sleep(0.5)
        assert node.state("broken-r1")[0] == "starting"
        await trio.sleep(1)
        state, url, error = node.state("broken-r1")
        assert (state, url) == ("failed", "")
        assert "status 3 before serving" in error and "(--fail-start)" in error and "broken" in error
        assert node.server.apps == {}
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(("args", "gpus", "words"), [
    (["--bogus"], [], "does not accept '--bogus'"),
    (["--tokens-per-s"], [], "needs a value"),
    ([], [7], "gpu 7 is not in this node's inventory"),
    ([], [0], "cannot run an engine: MIG mode is on"),
])
async def test_what_the_real_agent_refuses_is_refused_in_its_words(args: list[str], gpus: list[int], words: str,
                                                                   clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        node = Node(nursery, NodeShape(gpus=1, gpu_class="a100-80g", mig=("3g.40gb",)))
        node.runner.start("demo-r1", sim_model("demo", *args), gpus)
        state, _, error = node.state("demo-r1")
        assert state == "failed" and words in error, error
        node.runner.start("mig-r1", sim_model("mig"), [mig_index(0, 0)])
        await trio.testing.wait_all_tasks_blocked()
        assert node.state("mig-r1")[0] == "ready", "a MIG instance is a device a replica can take"
        nursery.cancel_scope.cancel()


async def test_the_engine_server_answers_each_replica_at_its_path_at_its_tokens_per_s(clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        node = Node(nursery)
        node.runner.start("slow-r1", sim_model("slow", "--tokens-per-s", "2"), [1])
        await trio.testing.wait_all_tasks_blocked()
        transport = httpx.ASGITransport(app=node.server)
        async with httpx.AsyncClient(transport=transport, base_url="http://fleet") as http:
            began = trio.current_time()
            r = await http.post("/r/slow-r1/v1/chat/completions",
                                json={"messages": [{"role": "user", "content": "one two"}]})
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "sim says: one two"
            assert r.json()["model"] == "slow"
            assert trio.current_time() - began == pytest.approx(2.0), "4 tokens at 2 tokens/s"
            assert (await http.get("/r/slow-r1/health")).status_code == 200
            node.runner.stop("slow-r1")
            gone = await http.get("/r/slow-r1/health")
            assert gone.status_code == 404 and "slow-r1" in gone.json()["error"]["message"]
            assert (await http.get("/elsewhere")).status_code == 404
        nursery.cancel_scope.cancel()


async def test_a_replica_sleeps_at_once_and_wakes_after_its_wake_delay(clock: trio.testing.MockClock) -> None:
    """Fast wake in the fleet simulator: `sleep` reports sleeping at once, `wake` starting (phase waking) for the
    model's `--wake-delay`, then ready at the same path; neither applies to a replica in another state."""
    async with trio.open_nursery() as nursery:
        node = Node(nursery)
        node.runner.start("lazy-r1", sim_model("lazy", "--startup-delay", "5", "--wake-delay", "0.5"), [0])
        node.runner.sleep("lazy-r1", 1)  # still starting: nothing to put to sleep
        await trio.sleep(5.1)
        node.runner.wake("lazy-r1")  # ready: nothing to wake
        assert node.state("lazy-r1")[0] == "ready"
        node.runner.sleep("lazy-r1", 1)
        assert node.state("lazy-r1")[0] == "sleeping"
        node.runner.wake("lazy-r1")
        [obs] = node.runner.replicas()
        assert (obs.state, obs.phase) == ("starting", "waking")
        await trio.sleep(0.4)
        assert node.state("lazy-r1")[0] == "starting"
        await trio.sleep(0.2)
        assert node.state("lazy-r1") == ("ready", "http://fleet/r/lazy-r1", "")
        nursery.cancel_scope.cancel()
