"""What `llmgw ctl` prints: `--json` is the API's answer verbatim; the status page,
the models table and one model are readable, and unknown is `-`, never 0."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ctl_fakes import MODEL, STATUS, FakeApi, columns, ctl


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
    assert members[2][:3] == ["cp-2", "standby", "missing"]
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
    replicas = columns(r.out, "REPLICA ")
    assert replicas[1] == ["r-1", "cpu-02", "ready", "http://127.0.0.1:40001", "-"]


def test_model_show_says_when_the_failures_were_flaps() -> None:
    status = {**MODEL["status"], "parked": True, "failures_in_row": 5, "flaps": 5, "flap_ready_s": 3.2}
    api = FakeApi().on("GET", "/api/v1/models/demo", json_body={"model": {**MODEL, "status": status}})
    r = ctl(["model", "show", "demo"], api)
    assert r.rc == 0, r.err
    assert "failures in a row:  5 (ready for 3.2 s at most, then failed: 5 times)" in r.out, r.out
    plain = FakeApi().on("GET", "/api/v1/models/demo", json_body={"model": MODEL})
    assert "then failed" not in ctl(["model", "show", "demo"], plain).out


def test_model_show_says_a_simulated_model_takes_no_gpu() -> None:
    api = FakeApi().on("GET", "/api/v1/models/demo", json_body={"model": MODEL})
    r = ctl(["model", "show", "demo"], api)
    assert r.rc == 0, r.err
    profile = next(line for line in r.out.splitlines() if line.startswith("profile:"))
    assert profile.split(":", 1)[1].strip() == "simulated (no GPU, CPU or memory reserved)"
    assert "gpus=" not in r.out  # MODEL's stored profile says gpus=1; the simulator takes none


def test_model_show_prints_the_profile_of_a_real_engine() -> None:
    model = {**MODEL, "engine": "llama.cpp", "source": "/models/m.gguf"}
    api = FakeApi().on("GET", "/api/v1/models/demo", json_body={"model": model})
    r = ctl(["model", "show", "demo"], api)
    assert r.rc == 0, r.err
    assert "profile:            gpus=1 tp=1 pp=1 nodes=1 classes=any memory=estimated cpu=yes\n" in r.out
