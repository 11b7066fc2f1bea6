"""GET /metrics over real HTTP on `llmgw up` (control plane and gateway in one process): both answer with no
key, their families never collide, they agree with GET /api/v1/status for the same state, and the Grafana
dashboard queries only metrics the code exports."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from tests.support.processes import UpProcess

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docs" / "grafana" / "llmgw.json"
CATALOG = """
[[models]]
name = "demo"
engine = "sim"
role = "chat"
source = "sim://demo"
mode = "always"

[[models]]
name = "huge"
engine = "llama.cpp"
role = "chat"
source = "/nowhere/huge.gguf"
mode = "always"
[models.profile]
gpus = 8
tp = 8
"""


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    base = tmp_path_factory.mktemp("metrics")
    (base / "catalog.toml").write_text(CATALOG)
    # A short grace for the agent to report: `huge` is judged unplaceable (a condition) soon after the start.
    proc = UpProcess(base / "state", extra_args=["--catalog", str(base / "catalog.toml")],
                     env={"LLMGW_TIMEOUTS": "agent_report_grace_s=1"}).start()
    try:
        yield proc
    finally:
        proc.kill()


def status(up: UpProcess) -> dict[str, Any]:
    creds = up.credentials
    r = httpx.get(creds["admin_url"] + "/api/v1/status", headers={"Authorization": f"Bearer {creds['admin_key']}"})
    assert r.status_code == 200, r.text
    doc: dict[str, Any] = r.json()
    return doc


def scrape(url: str) -> dict[str, list[Sample]]:
    r = httpx.get(url + "/metrics")  # no key: Prometheus scrapers carry none
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    return {f.name: list(f.samples) for f in text_string_to_metric_families(r.text)}


def gateway_base(up: UpProcess) -> str:
    return str(up.credentials["gateway_url"]).removesuffix("/v1")


def by_label(samples: list[Sample], label: str) -> dict[str, float]:
    return {s.labels[label]: s.value for s in samples}


@pytest.fixture(scope="module")
def settled(up: UpProcess) -> dict[str, Any]:
    """Wait until demo is ready and huge judged unplaceable (the agents' grace to report over); send a few
    requests."""
    deadline = time.monotonic() + 60
    while True:
        doc = status(up)
        rows = {m["name"]: m for m in doc["models"]}
        reporting = any(w.startswith("waiting for agents to report") for w in doc["warnings"])
        if rows["demo"]["ready"] == 1 and rows["huge"]["state"] == "unplaceable" and not reporting:
            break
        assert time.monotonic() < deadline, doc
        time.sleep(0.2)
    creds = up.credentials
    auth = {"Authorization": f"Bearer {creds['client_key']}"}
    with httpx.Client(base_url=creds["gateway_url"], headers=auth, timeout=30) as client:
        chat = {"model": "demo", "messages": [{"role": "user", "content": "count these words"}]}
        assert client.post("/chat/completions", json=chat).status_code == 200
        with client.stream("POST", "/chat/completions", json={**chat, "stream": True}) as r:
            assert r.status_code == 200
            r.read()
        assert client.post("/chat/completions", json={**chat, "model": "absent"}).status_code == 404
    return doc


def test_the_admin_port_metrics_agree_with_status(up: UpProcess, settled: dict[str, Any]) -> None:
    for _ in range(50):  # the same state: nothing changes once settled, but a scrape and a status race a tick
        doc, samples = status(up), scrape(up.credentials["admin_url"])
        rows = {m["name"]: m for m in doc["models"]}
        ready = by_label(samples["llmgw_model_ready_replicas"], "model")
        if ready == {n: float(m["ready"]) for n, m in rows.items()}:
            break
        time.sleep(0.1)
    assert ready == {"demo": 1.0, "huge": 0.0}, "huge should run and has none ready: its 0 is published"
    assert by_label(samples["llmgw_model_desired_replicas"], "model") == {n: m["desired"] for n, m in rows.items()}
    assert by_label(samples["llmgw_model_unplaceable"], "model") == {"demo": 0.0, "huge": 1.0}
    states = {(s.labels["model"], s.labels["state"]) for s in samples["llmgw_model_state"]}
    assert states == {(n, m["state"]) for n, m in rows.items()}
    nodes = by_label(samples["llmgw_nodes"], "state")
    assert nodes == {"connected": doc["node_counts"]["connected"], "lost": doc["node_counts"]["not_connected"]}
    replicas = by_label(samples["llmgw_replicas"], "state")
    assert replicas == {k: doc["totals"]["replicas"][k] for k in ("ready", "starting", "failed")}
    assert samples["llmgw_status_warnings"][0].value == len(doc["warnings"])
    assert samples["llmgw_control_leader"][0].value == 1.0
    assert samples["llmgw_raft_leader_known"][0].value == 1.0
    installed = {(s.labels["node"], s.labels["engine"]) for s in samples["llmgw_node_engine_installed"]}
    assert installed == {(n["node"], e) for n in doc["nodes"] for e in n["engine_versions"] or ()}
    assert any(e == "sim" for _, e in installed), f"every node has the sim engine: {installed}"  # never vacuous
    assert by_label(samples["llmgw_engine_installs"], "engine")["sim"] == float(doc["node_counts"]["connected"])
    recent = by_label(samples["llmgw_model_recent_restarts"], "model")
    assert recent == {n: float(m["restarts"]) for n, m in rows.items()}
    active = {(s.labels["kind"], s.labels["subject"], s.labels["severity"]) for s in samples["llmgw_condition"]}
    assert active == {(c["kind"], c["subject"], c["severity"]) for c in doc["conditions"]}
    assert ("model_unplaceable", "huge", "critical") in active


def test_the_gateway_counts_requests_by_model_code_and_status(up: UpProcess, settled: dict[str, Any]) -> None:
    samples = scrape(gateway_base(up))
    requests = {(s.labels["model"], s.labels["code"], s.labels["status"]): s.value
                for s in samples["llmgw_gateway_requests"] if s.name.endswith("_total")}
    assert requests[("demo", "", "200")] == 2.0
    assert requests[("", "model_not_found", "404")] == 1.0
    assert not any(m == "" and c == "" for m, c, _ in requests), "scrapes and health probes are not requests"
    count = [s for s in samples["llmgw_gateway_time_to_first_token_seconds"] if s.name.endswith("_count")]
    assert [(s.labels["model"], s.value) for s in count] == [("demo", 1.0)]
    tokens = {s.labels["direction"]: s.value for s in samples["llmgw_gateway_tokens"]
              if s.labels["model"] == "demo" and s.name.endswith("_total")}
    assert tokens["prompt"] > 0 and tokens["completion"] > 0


def test_the_two_roles_of_one_process_export_disjoint_families(up: UpProcess, settled: dict[str, Any]) -> None:
    control, gateway = set(scrape(up.credentials["admin_url"])), set(scrape(gateway_base(up)))
    assert control & gateway == {"llmgw_build_info"}


def dashboard_metrics(dashboard: dict[str, Any]) -> set[str]:
    exprs: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("expr"), str):
                exprs.append(node["expr"])
            if isinstance(node.get("query"), str):
                exprs.append(node["query"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(dashboard)
    assert exprs, "the dashboard has no queries"
    return {name for e in exprs for name in re.findall(r"\bllmgw_[a-zA-Z0-9_]+", e)}


def test_the_dashboard_queries_only_exported_metrics(up: UpProcess, settled: dict[str, Any]) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard.get("title") and isinstance(dashboard.get("panels"), list) and dashboard.get("uid")
    exported: set[str] = set()
    for url in (up.credentials["admin_url"], gateway_base(up)):
        for name, samples in scrape(url).items():
            exported.add(name)
            exported.update(s.name for s in samples)
            exported.update(name + suffix for suffix in ("_total", "_bucket", "_sum", "_count"))
    queried = dashboard_metrics(dashboard)
    assert queried - exported == set(), f"the dashboard queries metrics no role exports: {queried - exported}"
    assert len(queried) >= 15, "the dashboard should cover models, nodes, GPUs, Raft and the gateway"
