"""A LoRA adapter of a llama.cpp model, through the whole system on CPU: a real control plane, an agent that runs
llama.cpp (xllamacpp) on the tiny random-weight GGUF the suite writes, and the gateway. The adapter is a tiny LoRA
GGUF written here with the `gguf` package. Defined on a running base, it replaces the base's replica by one
started with the adapter (llama.cpp takes adapters at launch), the agent reports it loaded only once llama.cpp
lists it at /lora-adapters, and a request for the adapter is answered with it applied (its `lora` field), which
changes the answer; the base answers as before, on the same replica."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmgw.domain.model import ModelDef
from llmgw.domain.observed import NodeInfo
from tests.support.one_node import one_node, wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("xllamacpp") is None, reason="the llamacpp extra is not installed"),
    pytest.mark.skipif(importlib.util.find_spec("gguf") is None, reason="the gguf package (test extra) is missing"),
]

ADMIN = "sk-admin-lora-llamacpp"
CLIENT = "sk-client-lora-llamacpp"


def chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, "temperature": 0,
            "seed": 1}


async def test_a_llamacpp_adapter_is_launched_with_its_base_listed_and_applied(tmp_path: Path) -> None:
    from tests.support.tiny_gguf import write_tiny_llama, write_tiny_lora

    weights = tmp_path / "weights"
    weights.mkdir()
    base_file = write_tiny_llama(weights / "tiny.gguf")
    lora_file = write_tiny_lora(weights / "pirate-lora.gguf")
    (weights / "not-an-adapter.gguf").write_bytes(base_file.read_bytes())  # a GGUF, but a model: left out
    base = ModelDef.from_doc({"name": "tiny", "engine": "llama.cpp", "source": str(base_file),
                              "args": ["--ctx-size", "512"], "profile": {"cpu": True, "memory_gib": 0.01}})
    node = NodeInfo("x", hostname="test-node", cpus=2, memory_total=8 << 30, engines=("llama.cpp",))
    async with one_node(tmp_path, [base], admin_key=ADMIN, client_key=CLIENT, node=node) as cluster:
        router, control = cluster.router, cluster.control
        async with httpx.AsyncClient(base_url=control.admin_url, headers={"authorization": f"Bearer {ADMIN}"},
                                     timeout=30) as admin, \
                httpx.AsyncClient(base_url=cluster.gateway_url, headers={"authorization": f"Bearer {CLIENT}"},
                                  timeout=120) as client:
            assert (await admin.put("/api/v1/settings/models.weights_dirs", json=[str(weights)])).status_code == 200
            await wait_for(lambda: (r := router.route("tiny")) is not None and r.state == "ready")
            before = (await client.post("/v1/chat/completions", json=chat("tiny"))).json()
            [first] = router.route("tiny").endpoints  # type: ignore[union-attr]
            for name, file in (("pirate", lora_file), ("fake", weights / "not-an-adapter.gguf")):
                r = await admin.post("/api/v1/models", json={"name": name, "base": "tiny", "source": str(file)})
                assert r.status_code == 201, r.text
            # The request waits while the base's replica is replaced by one started with the adapters.
            r = await client.post("/v1/chat/completions", json=chat("pirate"))
            assert r.status_code == 200, r.text
            with_lora = r.json()["choices"][0]["message"]["content"]
            route = router.route("pirate")
            assert route is not None and route.lora_id == 0 and route.base == "tiny"
            [second] = router.route("tiny").endpoints  # type: ignore[union-attr]
            assert second.replica_id != first.replica_id  # rolled: started with the adapter
            after = (await client.post("/v1/chat/completions", json=chat("tiny"))).json()
            base_text = before["choices"][0]["message"]["content"]
            assert after["choices"][0]["message"]["content"] == base_text  # the base is untouched (scale 0)
            assert with_lora != base_text  # the adapter applied changes the answer
            # The file that is no adapter was left out of the launch; the base started anyway, and it says why.
            r = await client.post("/v1/chat/completions", json=chat("fake"))
            assert r.status_code == 503 and "not a LoRA adapter GGUF" in r.json()["error"]["message"], r.text
            status = (await admin.get("/api/v1/models/pirate")).json()["model"]["status"]
            assert list(status["adapter_on"].values()) == ["loaded"]
