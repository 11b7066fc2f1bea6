"""A model that needs an engine a node lacks (issue 25, point 7): llmgw installs no engine itself, so the node
is excluded with the reason ("engine X is not installed on node Y: …", `engine_missing`, NOT_NOW), never tried
in a loop of failed starts: placement reads the engines (and llama.cpp's forms) each agent detected, and an
agent whose start finds the engine gone detects its engines again at once, so its inventory stops offering it.
The edges faked: a `vllm` program (a shell script the agent finds through LLMGW_VLLM), then removed."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from llmgw.agent import service
from llmgw.agent.inventory import HostProbe
from llmgw.agent.storage import StorageScanner
from llmgw.agent.supervisor import Supervisor
from llmgw.domain import commands
from llmgw.domain.state import ClusterState
from llmgw.domain.timeouts import TIMEOUTS
from llmgw.placement import NOT_NOW, place
from llmgw.reconcile import decide
from llmgw.testing.builders import cpu_node, fleet, model, node, observed

LLAMA_GPU = model("chat").llamacpp().gpus(1).memory(4).build()
LLAMA_CPU = model("chat").llamacpp().cpu().build()


def llama_node(name: str, forms: str) -> Any:
    return dataclasses.replace(node(name).gpus(2).engines("llama.cpp", "sim").build(),
                               engine_versions={"llama.cpp": forms, "sim": ""})


def test_a_node_without_the_engine_is_excluded_with_its_name_and_the_hint() -> None:
    result = place(LLAMA_CPU, fleet(cpu_node("cpu-1", "sim")), [])
    assert result.choice is None
    (refusal,) = result.refusals
    assert (refusal.verdict, refusal.code) == (NOT_NOW, "engine_missing")
    assert refusal.node == "cpu-1" and refusal.message.startswith("engine llama.cpp is not installed (install the")
    assert result.reason().startswith("no node fits — cpu-1: engine llama.cpp is not installed"), "names the node"


def test_llama_cpp_on_gpus_needs_llama_server_not_only_the_in_process_binding() -> None:
    binding_only, both = llama_node("bind", "xllamacpp 0.2.1"), llama_node("both", "xllamacpp 0.2.1, llama-server b5000")
    (refusal,) = place(LLAMA_GPU, fleet(binding_only), []).refusals
    assert (refusal.verdict, refusal.code) == (NOT_NOW, "engine_missing")
    assert refusal.node == "bind" and "not installed in the form a replica on GPUs runs" in refusal.message
    assert "only the in-process binding (xllamacpp), not the llama-server binary" in refusal.message
    assert place(LLAMA_GPU, fleet(binding_only, both), []).choice.node == "both"  # type: ignore[union-attr]
    assert place(LLAMA_CPU, fleet(binding_only), []).choice is not None, "on CPU the binding runs it"
    unsaid = node("old").gpus(1).engines("llama.cpp").build()  # an agent that reports no forms: not refused
    assert place(LLAMA_GPU, fleet(unsaid), []).choice is not None


def test_the_reconciler_places_nothing_there_and_says_why() -> None:
    state, _ = commands.apply(ClusterState(), commands.put_model(LLAMA_GPU, 0.0))
    plan = decide(state, observed([llama_node("bind", "xllamacpp 0.2.1")]), 10.0)
    assert not [c for c in plan.commands if c["op"] == "placement.add"] and not plan.actions
    assert "bind: engine llama.cpp is not installed in the form" in plan.unplaceable["chat"]


# --- the agent: a start that finds its engine gone makes it look again at once ------------------------


class Sent:
    def __init__(self) -> None:
        self.inventories: list[dict[str, Any]] = []
        self.arrived = trio.Event()

    async def send(self, text: str) -> None:
        message = json.loads(text)
        if message["type"] == "inventory":
            self.inventories.append(message["inventory"])
            self.arrived.set()


async def test_a_start_that_finds_the_engine_gone_sends_the_inventory_without_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    vllm = tmp_path / "vllm"
    vllm.write_text("#!/bin/sh\necho 'vllm 0.11.2'\n")
    vllm.chmod(0o755)
    monkeypatch.setenv("LLMGW_VLLM", str(vllm))
    weights = tmp_path / "weights"
    weights.mkdir()
    (weights / "config.json").write_text("{}")
    timeouts = dataclasses.replace(TIMEOUTS, storage_rescan_s=1e6)  # no look of its own in this test
    config = service.AgentConfig(controls=["http://c"], tls=None, state_dir=tmp_path, node="n1",
                                 probe=HostProbe("none"), timeouts=timeouts)
    scanner = StorageScanner(())
    link = service._Link(await service._observe_once(config, scanner))
    assert "vllm" in link.inventory.engines, "installed when the agent looked"
    sent = Sent()
    with trio.fail_after(30):
        async with httpx.AsyncClient() as http, trio.open_nursery() as nursery:
            supervisor = Supervisor(nursery, node="n1", host="127.0.0.1", engine_dir=tmp_path / "engines",
                                    on_change=link.mark, http=http, on_engine_missing=link.look_again)
            nursery.start_soon(service._observe, config, scanner, link)
            nursery.start_soon(service._report, sent.send, supervisor, link, link.inventory, 1e6)
            os.remove(vllm)  # uninstalled since
            supervisor.start("m-r1", model("m").vllm(str(weights)).cpu().build().to_doc(), [])
            await sent.arrived.wait()
            [failed] = supervisor.replicas()
            assert failed.state == "failed" and "LLMGW_VLLM" in failed.error
            assert "vllm" not in sent.inventories[-1]["engines"], "the leader hears at once it has no vLLM"
            nursery.cancel_scope.cancel()
