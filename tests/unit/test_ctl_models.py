"""`llmgw ctl model ...`: paths, remove and retry, and `model serve` from a file or from
flags, with each refusal and each usage error said in full."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from ctl_fakes import CATALOG, FakeApi, ctl
from llmgw.cli.ctl.render import render_model
from llmgw.domain.model import DefinitionError, ModelDef


def test_model_names_are_url_encoded_in_paths() -> None:
    api = FakeApi().on("GET", "/api/v1/models/a%2Fb%20c%3F", json_body={"model": {"name": "a/b c?"}})
    r = ctl(["model", "show", "a/b c?"], api)
    assert r.rc == 0, r.err
    assert api.requests[0].url.raw_path == b"/api/v1/models/a%2Fb%20c%3F"


def test_remove_and_retry_say_what_they_did() -> None:
    api = (
        FakeApi()
        .on("DELETE", "/api/v1/models/demo", json_body={"removed": "demo"})
        .on("POST", "/api/v1/models/demo/retry", json_body={"retried": "demo"})
    )
    assert ctl(["model", "remove", "demo"], api).out == "removed model demo\n"
    assert ctl(["model", "retry", "demo"], api).out.startswith("retrying model demo")


def test_serve_file_sends_each_catalog_definition(tmp_path: Path) -> None:
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(CATALOG)
    answers = iter([201, 200, 201])

    def serve(request: httpx.Request) -> httpx.Response:
        return httpx.Response(next(answers), json={"model": json.loads(request.content)})

    api = FakeApi()
    api.routes[("POST", "/api/v1/models")] = serve
    r = ctl(["model", "serve", "--file", str(catalog)], api)
    assert r.rc == 0, r.err
    assert r.out == "created model demo\nreplaced model demo-embed\ncreated model smollm2-135m\n"
    sent = api.bodies()
    assert [d["name"] for d in sent] == ["demo", "demo-embed", "smollm2-135m"]
    assert sent[0] == {
        "name": "demo",
        "engine": "sim",
        "role": "chat",
        "source": "sim://demo",
        "mode": "always",
        "replicas": {"min": 1, "max": 1},
        "args": [],
        "profile": {"gpus": 1, "cpu": True},
    }
    assert sent[2]["args"] == ["--ctx-size", "2048"] and sent[2]["profile"] == {"cpu": True, "memory_gib": 0.5}
    assert all("guard" not in d and "policies" not in d for d in sent)


def validating_api() -> FakeApi:
    """POST /api/v1/models answered as the admin API does: ModelDef.from_doc decides,
    and a refusal is `invalid_model` with the DefinitionError's text."""

    def serve(request: httpx.Request) -> httpx.Response:
        try:
            model = ModelDef.from_doc(json.loads(request.content))
        except DefinitionError as e:
            return httpx.Response(400, json={"error": {"code": "invalid_model", "message": str(e)}})
        return httpx.Response(201, json={"model": model.to_doc()})

    api = FakeApi()
    api.routes[("POST", "/api/v1/models")] = serve
    return api


def test_serve_file_takes_the_example_catalog() -> None:
    api = validating_api()
    r = ctl(["model", "serve", "--file", str(Path(__file__).parents[2] / "examples" / "catalog.toml")], api)
    assert r.rc == 0, r.err
    assert {"demo", "demo-embed", "smollm2-135m"} <= {d["name"] for d in api.bodies()}


def test_serve_prints_every_problem_of_a_definition() -> None:
    flags = ["--name", "has space", "--engine", "sim", "--source", "sim://x", "--role", "judge"]
    flags += ["--min", "3", "--max", "2"]
    r = ctl(["model", "serve", *flags], validating_api())
    assert (r.rc, r.out) == (1, "")
    assert r.err == (
        "error: invalid_model: "
        "name: use 1-128 letters, digits, '.', '_', ':' or '-', starting with a letter or digit; "
        "role: must be one of chat, embedding, guard, rerank; "
        "replicas.min: must not exceed replicas.max\n"
    )


def test_serve_file_json_prints_a_list_of_answers(tmp_path: Path) -> None:
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(CATALOG)
    api = FakeApi().on("POST", "/api/v1/models", 201, json_body={"model": {"name": "x"}})
    r = ctl(["--json", "model", "serve", "--file", str(catalog)], api)
    assert r.rc == 0, r.err
    assert json.loads(r.out) == [{"model": {"name": "x"}}] * 3


def test_serve_file_with_one_top_level_model(tmp_path: Path) -> None:
    single = tmp_path / "one.toml"
    single.write_text('name = "solo"\nengine = "sim"\nsource = "sim://solo"\n[profile]\ncpu = true\n')
    api = FakeApi().on("POST", "/api/v1/models", 201, json_body={"model": {"name": "solo"}})
    r = ctl(["--json", "model", "serve", "--file", str(single)], api)
    assert r.rc == 0, r.err
    assert api.bodies() == [{"name": "solo", "engine": "sim", "source": "sim://solo", "profile": {"cpu": True}}]
    assert json.loads(r.out) == {"model": {"name": "solo"}}


def test_serve_file_reports_each_refusal_and_exits_1(tmp_path: Path) -> None:
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(CATALOG)

    def serve(request: httpx.Request) -> httpx.Response:
        doc = json.loads(request.content)
        if doc["name"] == "demo-embed":
            return httpx.Response(400, json={"error": {"code": "invalid_definition", "message": "source: nope"}})
        return httpx.Response(201, json={"model": doc})

    api = FakeApi()
    api.routes[("POST", "/api/v1/models")] = serve
    r = ctl(["model", "serve", "--file", str(catalog)], api)
    assert r.rc == 1
    assert len(api.requests) == 3  # one refusal does not stop the rest
    assert r.out == "created model demo\ncreated model smollm2-135m\n"
    assert "error: demo-embed: invalid_definition: source: nope" in r.err
    assert "error: 1 of 3 models were not served" in r.err


def test_serve_file_stops_at_an_answer_that_is_not_the_api(tmp_path: Path) -> None:
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(CATALOG)
    api = FakeApi().on("POST", "/api/v1/models", 200, headers={"content-type": "text/html"}, text="<html>login</html>")
    r = ctl(["model", "serve", "--file", str(catalog)], api)
    assert r.rc == 1
    assert len(api.requests) == 1
    assert "answered with an HTML page" in r.err


def test_serve_flags_build_one_definition() -> None:
    api = FakeApi().on("POST", "/api/v1/models", 201, json_body={"model": {"name": "m"}})
    argv = [
        "model",
        "serve",
        "--name",
        "m",
        "--engine",
        "llama.cpp",
        "--source",
        "/models/m.gguf",
        "--role",
        "guard",
        "--mode",
        "on-demand",
        "--min",
        "0",
        "--max",
        "3",
        "--gpus",
        "2",
        "--arg",
        "--ctx-size",
        "--arg",
        "4096",
    ]
    r = ctl(argv, api)
    assert (r.rc, r.out) == (0, "created model m\n"), r.err
    assert api.bodies() == [
        {
            "name": "m",
            "engine": "llama.cpp",
            "source": "/models/m.gguf",
            "role": "guard",
            "mode": "on-demand",
            "replicas": {"min": 0, "max": 3},
            "profile": {"gpus": 2, "tp": 2},
            "args": ["--ctx-size", "4096"],
        }
    ]
    api.requests.clear()
    assert ctl(["model", "serve", "--name", "c", "--engine", "sim", "--source", "sim://c", "--cpu"], api).rc == 0
    assert api.bodies() == [{"name": "c", "engine": "sim", "source": "sim://c", "profile": {"cpu": True}}]


def test_serve_flags_set_request_limits() -> None:
    api = FakeApi().on("POST", "/api/v1/models", 201, json_body={"model": {"name": "c"}})
    argv = ["model", "serve", "--name", "c", "--engine", "sim", "--source", "sim://c", "--max-tokens", "512",
            "--max-n", "2"]
    assert ctl(argv, api).rc == 0
    assert api.bodies() == [{"name": "c", "engine": "sim", "source": "sim://c",
                             "limits": {"max_tokens": 512, "max_n": 2}}]
    assert ctl([*argv[:8], "--slots", "4"], api).rc == 0
    assert api.bodies()[-1] == {"name": "c", "engine": "sim", "source": "sim://c",
                                "limits": {"concurrency_per_replica": 4}}


def test_serve_flags_set_fallbacks_and_aliases_and_show_prints_them() -> None:
    api = FakeApi().on("POST", "/api/v1/models", 201, json_body={"model": {"name": "c"}})
    argv = ["model", "serve", "--name", "c", "--engine", "sim", "--source", "sim://c", "--fallback", "b",
            "--fallback", "a", "--alias", "friendly"]
    assert ctl(argv, api).rc == 0
    assert api.bodies() == [{"name": "c", "engine": "sim", "source": "sim://c", "fallbacks": ["b", "a"],
                             "aliases": ["friendly"]}]
    shown = render_model({"name": "c", "fallbacks": ["b", "a"], "aliases": ["friendly"]})
    assert "fallbacks:" in shown and "b, a" in shown and "friendly" in shown
    assert "fallbacks" not in render_model({"name": "c"})  # left out when not set


def test_serve_flags_set_routing_and_the_api_checks_the_range() -> None:
    base = ["model", "serve", "--name", "c", "--engine", "sim", "--source", "sim://c"]
    api = validating_api()
    assert ctl([*base, "--affinity", "off"], api).rc == 0
    assert ctl([*base, "--affinity", "prefix", "--prefix-chars", "512"], api).rc == 0
    assert ctl([*base, "--prefix-chars", "64"], api).rc == 0
    assert [b["routing"] for b in api.bodies()] == [{"affinity": "off"}, {"affinity": "prefix", "prefix_chars": 512},
                                                    {"prefix_chars": 64}]
    r = ctl([*base, "--prefix-chars", "0"], api)  # as --slots: the range is the API's, its 400 said in full
    assert (r.rc, r.out) == (1, "")
    assert r.err == "error: invalid_model: routing.prefix_chars: must be between 1 and 1048576\n"


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--affinity", "sticky"], 'Invalid value "sticky" for --affinity. Choose from: "prefix", "off".'),
        (["--prefix-chars", "many"], 'Invalid value for --prefix-chars: unable to convert "many" into int.'),
    ],
)
def test_serve_refuses_a_bad_routing_flag_before_sending(flags: list[str], words: str) -> None:
    api = FakeApi()
    r = ctl(["model", "serve", "--name", "c", "--engine", "sim", "--source", "sim://c", *flags], api)
    assert r.rc == 2 and words in r.err
    assert api.requests == []


@pytest.mark.parametrize(
    ("definition", "shown"),
    [
        ({"role": "chat"}, "prefix affinity on the first 4096 characters (the default for chat models)"),
        ({"role": "guard"}, "prefix affinity on the first 4096 characters (the default for guard models)"),
        ({"role": "embedding"}, "affinity off: the least loaded replica (the default for embedding models)"),
        ({"role": "chat", "routing": {"prefix_chars": 512}},
         "prefix affinity on the first 512 characters (the default for chat models)"),
        ({"role": "embedding", "routing": {"affinity": "prefix", "prefix_chars": 100}},
         "prefix affinity on the first 100 characters"),
        ({"role": "chat", "routing": {"affinity": "off"}}, "affinity off: the least loaded replica"),
        ({"role": "chat", "routing": {"affinity": "off", "prefix_chars": 9}},
         "affinity off: the least loaded replica (prefix_chars 9 unused)"),
    ],
)
def test_model_show_prints_the_routing_in_force(definition: dict[str, object], shown: str) -> None:
    model = ModelDef.from_doc({"name": "m", "engine": "sim", "source": "sim://m", **definition}).to_doc()
    api = FakeApi().on("GET", "/api/v1/models/m", json_body={"model": model})
    r = ctl(["model", "show", "m"], api)
    assert r.rc == 0, r.err
    assert [line.split(":", 1)[1].strip() for line in r.out.splitlines() if line.startswith("routing:")] == [shown]
    assert "\nrouting:" in render_model({"name": "m"}) and "affinity" not in render_model({"name": "m"})  # unknown: -


def test_serve_file_sends_each_model_after_the_fallbacks_it_defines(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[[models]]\nname = "a"\nengine = "sim"\nsource = "sim://a"\nfallbacks = ["b", "elsewhere"]\n'
                    '[[models]]\nname = "b"\nengine = "sim"\nsource = "sim://b"\n'
                    '[[models]]\nname = "c"\nengine = "sim"\nsource = "sim://c"\n')
    api = FakeApi().on("POST", "/api/v1/models", 201, json_body={"model": {"name": "x"}})
    assert ctl(["model", "serve", "--file", str(path)], api).rc == 0
    assert [b["name"] for b in api.bodies()] == ["b", "c", "a"]  # "elsewhere": the catalog's, not the file's


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["model", "serve"], "(missing: --name, --engine, --source)"),
        (["model", "serve", "--name", "m", "--engine", "sim"], "(missing: --source)"),
        (["model", "serve", "--file", "x.toml", "--name", "m"], "--file FILE or the model flags, not both"),
        (["model", "serve", "--file", "/nonexistent/x.toml"], "/nonexistent/x.toml does not exist"),
    ],
)
def test_serve_usage_errors_exit_2_and_send_nothing(argv: list[str], words: str) -> None:
    api = FakeApi()
    r = ctl(argv, api)
    assert r.rc == 2
    assert words in r.err
    assert api.requests == []


@pytest.mark.parametrize(
    ("flags", "missing", "example"),
    [
        ([], "--name, --engine, --source", "--name demo --engine sim --source sim://demo"),
        (["--name", "X", "--engine", "sim"], "--source", "--name X --engine sim --source sim://X"),
        (["--name", "X", "--engine", "vllm"], "--source", "--name X --engine vllm --source hf://ORG/REPO"),
        (["--engine", "llama.cpp"], "--name, --source", "--name demo --engine llama.cpp --source /models/demo.gguf"),
        (["--name", "my model", "--source", "/m/x.gguf"], "--engine",
         "--name 'my model' --engine llama.cpp --source /m/x.gguf"),
    ],
)
def test_serve_says_what_is_missing_and_shows_a_complete_command(
    flags: list[str], missing: str, example: str
) -> None:
    r = ctl(["model", "serve", *flags], FakeApi())
    assert r.rc == 2
    assert r.err == (
        f"error: model serve needs --name, --engine and --source (missing: {missing}); "
        f"e.g. llmgw ctl model serve {example}, or --file FILE\n"
    )


def test_serve_bad_toml_or_no_models_is_a_usage_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[[models]\nname=")
    r = ctl(["model", "serve", "--file", str(bad)], FakeApi())
    assert r.rc == 2 and "is not valid TOML" in r.err
    empty = tmp_path / "empty.toml"
    empty.write_text("[guard]\nx = 1\n")
    r = ctl(["model", "serve", "--file", str(empty)], FakeApi())
    assert r.rc == 2 and "has no [[models]] tables" in r.err
