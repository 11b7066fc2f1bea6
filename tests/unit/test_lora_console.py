"""LoRA adapters as operators see them: `ctl models` lists each adapter under its base with where it is
loaded, `ctl model show` its state on each replica; the console's Models page lists it under its base, and its
own page says the same. And how engines are launched for them (vLLM's runtime loading, llama-server's --lora)."""

from __future__ import annotations

from pathlib import Path

from console_world import World, rows, sign_in
from ctl_fakes import FakeApi, ctl
from llmgw.cli.ctl.render import render_model, render_models
from llmgw.engines.llama_server import server_argv
from llmgw.domain.observed import ReplicaObs
from llmgw.reconcile import ModelView
from llmgw.testing.builders import cpu_node, model, placed, store_with


def test_ctl_models_lists_adapters_under_their_base_with_where_they_are_loaded() -> None:
    base = {"name": "base", "engine": "sim", "role": "chat", "mode": "always", "replicas": {"min": 2, "max": 2},
            "status": {"ready": 2, "desired": 2, "state": "ready", "reason": "", "adapters": ["pirate"]}}
    pirate = {"name": "pirate", "base": "base", "engine": "sim", "role": "chat", "mode": "always",
              "status": {"ready": 1, "desired": 0, "state": "ready", "reason": "",
                         "adapter_on": {"base-r1": "loaded", "base-r2": "failed: HTTP 400: No adapter found"}}}
    other = {**base, "name": "another", "status": {**base["status"], "adapters": []}}
    lines = render_models({"models": [other, base, pirate]}).splitlines()
    assert [line.split()[0] for line in lines[1:]] == ["another", "base", "└"]
    assert lines[3].split()[1] == "pirate" and "adapter" in lines[3] and "1 loaded / 2" in lines[3]
    assert "loaded on base-r1" in lines[3]
    shown = render_model(pirate)
    assert "adapter of:" in shown and "ON THE REPLICAS OF base" in shown
    assert "base-r2" in shown and "failed: HTTP 400: No adapter found" in shown
    assert "adapters:           pirate" in render_model(base)


async def test_the_models_page_lists_adapters_under_their_base() -> None:
    store = store_with([model("base"), model("zeta"), model("pirate").adapter_of("base")], [placed("base", "n1")])
    [rid] = store.snapshot().placements
    views = {"base": ModelView("base", 1, 1, 1, 0, "ready", ""), "zeta": ModelView("zeta", 1, 0, 0, 0, "starting", ""),
             "pirate": ModelView("pirate", 0, 0, 1, 0, "ready", "")}
    world = World(store=store, nodes=[cpu_node("n1")], views=views)
    world.hub.report_replicas(world.links["n1"], [ReplicaObs(rid, "base", "n1", "ready", "http://n1:1",
                                                             adapters={"pirate": "loaded"})])
    async with world.client() as c:
        await sign_in(c)
        html = (await c.get("/models")).text
        page = (await c.get("/models/pirate")).text
        base_page = (await c.get("/models/base")).text
    table = rows(html, "models-table")
    assert [r[0] for r in table] == ["base", "↳ pirate", "zeta"]
    assert table[1][3] == "adapter of base" and table[1][5] == "1 / 1 loaded" and table[1][6] == f"loaded on {rid}"
    assert rows(page, "adapter-replicas") == [[rid, "loaded"]]
    assert 'href="/models/pirate"' in base_page and "LoRA adapters" in base_page


def test_ctl_model_serve_base_sends_an_adapter_without_an_engine() -> None:
    api = FakeApi().on("POST", "/api/v1/models", 201, json_body={"model": {"name": "pirate"}})
    argv = ["model", "serve", "--name", "pirate", "--base", "base", "--source", "/models/lora/pirate.safetensors"]
    r = ctl(argv, api)
    assert r.rc == 0, r.err
    assert api.bodies() == [{"name": "pirate", "base": "base", "source": "/models/lora/pirate.safetensors"}]
    assert ctl(["model", "serve", "--name", "x", "--source", "/y"], FakeApi()).rc == 2  # neither engine nor base


def test_vllm_with_enable_lora_may_load_adapters_at_run_time_and_llama_server_gets_them_at_launch(
        tmp_path: Path) -> None:
    from test_engines_launch import spec, vllm_bin

    model = tmp_path / "qwen"
    model.mkdir()
    launch = spec("vllm", str(model), bin_dir=vllm_bin(tmp_path), devices=("GPU-1",), args=("--enable-lora",))
    assert "--enable-lora" in launch.argv and launch.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    plain = spec("vllm", str(model), bin_dir=vllm_bin(tmp_path), devices=("GPU-1",))
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in plain.env
    argv = server_argv("llama-server", weights="/m/t.gguf", model="t", host="127.0.0.1", port=1, role="chat",
                       tokens=[], gpu=True, lora=["/m/a.gguf", "/m/b.gguf"])
    assert argv[argv.index("--lora"):argv.index("--lora") + 5] == ["--lora", "/m/a.gguf", "--lora", "/m/b.gguf",
                                                                  "--lora-init-without-apply"]
