"""The Prometheus families: every model the reconciler judged has a ready series (0 included), unknown is
left out, names follow Prometheus' rules, labels stay bounded, and the gateway's counters add up."""

from __future__ import annotations

import re

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from llmgw.domain import summary
from llmgw.domain.observed import NodeInfo
from llmgw.gateway.guard import GuardStats
from llmgw.gateway.requestlog import RequestRecord
from llmgw.guard.prompt import JudgeFailure, Verdict
from llmgw.metrics import gateway as gw
from llmgw.domain.conditions import Condition
from llmgw.domain.summary import Summary
from llmgw.metrics.control import Scrape, registry_for
from llmgw.metrics.expose import render
from llmgw.reconcile import ModelView
from llmgw.domain.limits import Listener
from llmgw.wire.gate import GateStats
from llmgw.testing.builders import NodeBuilder, model, node, observed, placed, replica, state_with

NAME = re.compile(r"llmgw_[a-z0-9_]+\Z")
# Every label the code may use: none carries a request id, a key or a prompt.
BOUNDED_LABELS = {"model", "node", "class", "mig", "state", "code", "status", "member", "engine", "version",
                  "judge", "hazard", "outcome", "standing", "direction", "kind", "subject", "severity", "role", "le",
                  "scope", "reason", "endpoint"}


def view(name: str, desired: int, ready: int, state: str, starting: int = 0, failures: int = 0) -> ModelView:
    return ModelView(name, desired, ready + starting, ready, starting, state, "", failures)


def with_engines(info: NodeInfo, versions: dict[str, str]) -> NodeInfo:
    return NodeInfo(**{**info.__dict__, "engine_versions": versions})


def fleet_doc(a_reserves: tuple[int, ...] = ()) -> Summary:
    state = state_with([model("down").gpus(1), model("up").gpus(1), model("never").gpus(8), model("fresh")],
                       [placed("up", "a", [0]), placed("down", "a", [1])])
    a = NodeInfo(**{**node("a").gpus(4, unhealthy=[3]).build().__dict__, "reserved_gpus": a_reserves})
    nodes: list[NodeInfo | NodeBuilder] = [with_engines(a, {"vllm": "0.9.1", "sim": ""}),
             node("b").gpus(1, "a100-80g").mig(1, "a100-80g", ("3g.40gb", 40), ("3g.40gb", 40))]
    obs = observed(nodes, [replica("up-r1", "a"), replica("down-r1", "a", "failed", error="boom")],
                   lost={"gone": 1234.0})
    views = {"down": view("down", 1, 0, "starting", failures=3), "up": view("up", 1, 1, "ready"),
             "never": view("never", 1, 0, "unplaceable")}  # "fresh": not judged yet
    return summary.summarize(state, obs, views, {}, 2000.0)


def gate_stats(listener: Listener) -> GateStats:
    return GateStats(listener, open=3, limit=192, per_address=96, refused_listener_full=1, refused_address_full=2,
                     evicted=4)


RAFT = {"ready": True, "leader": "n1:1", "is_leader": True, "term": 4, "commit_index": 120, "last_applied": 118,
        "partners": {"n2:1": 2, "n3:1": 0}, "match_index": {"n2:1": 119, "n3:1": 7}}


def scrape_text(s: Scrape) -> str:
    return render(registry_for(lambda: s)).decode()


def parse(text: str) -> dict[str, list[Sample]]:
    return {f.name: list(f.samples) for f in text_string_to_metric_families(text)}


def value(samples: dict[str, list[Sample]], name: str, **labels: str) -> float | None:
    found = [s.value for fam in samples.values() for s in fam if s.name == name and s.labels == labels]
    assert len(found) <= 1
    return found[0] if found else None


def test_every_judged_model_has_a_ready_series_and_unknown_has_none() -> None:
    doc = fleet_doc()
    found = [Condition("model_down", "down", "critical", "model down should have 1 replica(s) and none is ready")]
    samples = parse(scrape_text(Scrape("n1:1", True, RAFT, doc, {"down": 57}, found)))
    assert value(samples, "llmgw_model_ready_replicas", model="down") == 0.0  # should run, none ready: 0, not absent
    assert value(samples, "llmgw_model_desired_replicas", model="down") == 1.0
    assert value(samples, "llmgw_model_ready_replicas", model="up") == 1.0
    assert value(samples, "llmgw_model_ready_replicas", model="never") == 0.0
    assert value(samples, "llmgw_model_unplaceable", model="never") == 1.0
    assert value(samples, "llmgw_model_consecutive_start_failures", model="down") == 3.0
    assert value(samples, "llmgw_model_ready_replicas", model="fresh") is None  # unknown is not 0
    assert value(samples, "llmgw_model_state", model="fresh", state="unknown") == 1.0
    assert value(samples, "llmgw_model_restarts_total", model="down") == 57.0
    assert value(samples, "llmgw_model_recent_restarts", model="down") == 0.0  # as the summary counts them
    assert value(samples, "llmgw_condition", kind="model_down", subject="down", severity="critical") == 1.0


def test_gpus_kept_for_other_work_are_a_state_of_their_own() -> None:
    samples = parse(scrape_text(Scrape("n1:1", True, RAFT, fleet_doc(a_reserves=(2,)))))
    assert value(samples, "llmgw_gpus", **{"class": "h100-80g", "mig": "false", "state": "reserved"}) == 1.0
    assert value(samples, "llmgw_gpus", **{"class": "h100-80g", "mig": "false", "state": "free"}) == 0.0
    assert value(samples, "llmgw_node_gpus", node="a", state="reserved") == 1.0
    assert value(samples, "llmgw_node_gpus", node="a", state="free") == 0.0


def test_gpus_by_class_and_state_include_mig_and_unhealthy() -> None:
    samples = parse(scrape_text(Scrape("n1:1", True, RAFT, fleet_doc())))
    assert value(samples, "llmgw_gpus", **{"class": "h100-80g", "mig": "false", "state": "used"}) == 2.0
    assert value(samples, "llmgw_gpus", **{"class": "h100-80g", "mig": "false", "state": "free"}) == 1.0
    assert value(samples, "llmgw_gpus", **{"class": "h100-80g", "mig": "false", "state": "unusable"}) == 1.0
    assert value(samples, "llmgw_gpus", **{"class": "a100-80g-mig-3g.40gb", "mig": "true", "state": "free"}) == 2.0
    assert value(samples, "llmgw_gpus_unhealthy", **{"class": "h100-80g"}) == 1.0
    assert value(samples, "llmgw_nodes", state="lost") == 1.0 and value(samples, "llmgw_nodes", state="connected") == 2
    assert value(samples, "llmgw_node_connected", node="gone") == 0.0
    assert value(samples, "llmgw_node_lost_since_timestamp_seconds", node="gone") == 1234.0
    assert value(samples, "llmgw_node_engine_installed", node="a", engine="vllm", version="0.9.1") == 1.0
    assert value(samples, "llmgw_engine_installs", engine="vllm") == 1.0


def test_raft_lag_per_member_on_the_leader_and_a_standby_says_no_fleet() -> None:
    samples = parse(scrape_text(Scrape("n1:1", True, RAFT, fleet_doc())))
    assert value(samples, "llmgw_raft_member_lag_entries", member="n1:1") == 2.0
    assert value(samples, "llmgw_raft_member_lag_entries", member="n3:1") == 113.0
    assert value(samples, "llmgw_raft_member_connected", member="n3:1") == 0.0
    assert value(samples, "llmgw_raft_term") == 4.0 and value(samples, "llmgw_control_leader") == 1.0
    standby = parse(scrape_text(Scrape("n2:1", False, {**RAFT, "is_leader": False})))
    assert value(standby, "llmgw_control_leader") == 0.0
    assert value(standby, "llmgw_raft_member_lag_entries", member="n3:1") is None  # only the leader knows
    assert not [n for n in standby if n.startswith(("llmgw_model", "llmgw_gpus", "llmgw_nodes"))], \
        "a standby has no agents: its 0s would read as 'nothing ready'"


def test_names_follow_prometheus_rules_and_labels_are_bounded() -> None:
    stats = GuardStats()
    stats.counted("guard", Verdict(("S1", "S6")))
    m = gw.RequestMetrics()
    m.count(RequestRecord("r", 0.0, "k", "demo", 200, latency_ms=12.0, ttft_ms=3.0, tokens_in=3, tokens_out=5))
    texts = [scrape_text(Scrape("n1:1", True, RAFT, fleet_doc(), {"down": 1}, [Condition("no_leader", "", "critical", "w")],
                             {"delivered": 1}, connections=gate_stats("admin"))),
             render(gw.registry_for(m, stats, connections=gate_stats("gateway"))).decode()]
    for text in texts:
        for family in text_string_to_metric_families(text):
            assert NAME.match(family.name), family.name
            if family.type == "counter":
                assert all(s.name.endswith(("_total", "_created")) for s in family.samples), family.name
            else:
                assert not family.name.endswith("_total"), f"{family.name}: _total is for counters"
            for s in family.samples:
                assert set(s.labels) <= BOUNDED_LABELS, (s.name, s.labels)


def test_gateway_requests_are_counted_per_endpoint_and_other_paths_as_one_row() -> None:
    m = gw.RequestMetrics()
    for path in ("/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/responses", "/nope/1", "/nope/2"):
        m.count(RequestRecord("r", 0.0, "k", "demo", 200, endpoint=path, latency_ms=1.0))
    samples = parse(render(gw.registry_for(m)).decode())
    assert value(samples, "llmgw_gateway_endpoint_requests_total", endpoint="/v1/responses") == 2.0
    assert value(samples, "llmgw_gateway_endpoint_requests_total", endpoint="/v1/messages") == 1.0
    assert value(samples, "llmgw_gateway_endpoint_requests_total", endpoint="other") == 2.0  # a client's paths: bounded


def test_gateway_request_rows_are_bounded_whatever_codes_engines_invent() -> None:
    m = gw.RequestMetrics()
    for i in range(gw.MAX_REQUEST_ROWS + 500):
        m.count(RequestRecord("r", 0.0, "", "demo", 502, error=f"engine_code_{i}", latency_ms=1.0))
    assert len(m.requests) == gw.MAX_REQUEST_ROWS + 1  # the cap, then one "other" row
    assert m.requests[("demo", gw.OTHER_CODE, 502)] == 500


def test_gateway_histograms_are_cumulative_with_sums_and_tokens() -> None:
    m = gw.RequestMetrics()
    for ms in (4.0, 40.0, 400.0, 400_000.0):
        m.count(RequestRecord("r", 0.0, "", "demo", 200, latency_ms=ms, ttft_ms=ms / 2, tokens_in=2, tokens_out=3))
    m.count(RequestRecord("r", 0.0, "", "demo", 400, error="invalid_request", latency_ms=1.0))
    samples = parse(render(gw.registry_for(m)).decode())
    assert value(samples, "llmgw_gateway_requests_total", model="demo", code="", status="200") == 4.0
    assert value(samples, "llmgw_gateway_requests_total", model="demo", code="invalid_request", status="400") == 1.0
    bucket = "llmgw_gateway_request_duration_seconds_bucket"
    assert value(samples, bucket, model="demo", le="0.005") == 2.0
    assert value(samples, bucket, model="demo", le="0.05") == 3.0
    assert value(samples, bucket, model="demo", le="300.0") == 4.0
    assert value(samples, bucket, model="demo", le="+Inf") == 5.0
    assert value(samples, "llmgw_gateway_request_duration_seconds_count", model="demo") == 5.0
    assert abs((value(samples, "llmgw_gateway_request_duration_seconds_sum", model="demo") or 0) - 400.445) < 1e-9
    assert value(samples, "llmgw_gateway_time_to_first_token_seconds_count", model="demo") == 4.0
    assert value(samples, "llmgw_gateway_tokens_total", model="demo", direction="completion") == 12.0


def test_requests_served_by_another_model_are_counted_by_both_names() -> None:
    m = gw.RequestMetrics()
    for served in ("backup", "backup", "main", ""):  # a fallback twice; the model itself; none (refused)
        m.count(RequestRecord("r", 0.0, "", "main", 200, served_model=served))
    m.count(RequestRecord("r", 0.0, "", "friendly", 200, served_model="main"))  # an alias
    samples = parse(render(gw.registry_for(m)).decode())
    assert value(samples, "llmgw_gateway_served_by_other_total", model="main", served_model="backup") == 2.0
    assert value(samples, "llmgw_gateway_served_by_other_total", model="friendly", served_model="main") == 1.0
    assert value(samples, "llmgw_gateway_served_by_other_total", model="main", served_model="main") is None


def test_guard_verdicts_by_hazard() -> None:
    stats = GuardStats()
    stats.counted("lg", Verdict(("S1", "S6")))
    stats.counted("lg", Verdict())
    stats.counted("lg", JudgeFailure("down"))
    stats.counted("lg", Verdict(("S6",)))
    samples = parse(render(gw.registry_for(None, stats)).decode())
    assert value(samples, "llmgw_guard_verdicts_total", judge="lg", hazard="S6") == 2.0
    assert value(samples, "llmgw_guard_verdicts_total", judge="lg", hazard="safe") == 1.0
    assert value(samples, "llmgw_guard_verdicts_total", judge="lg", hazard="error") == 1.0
    assert "llmgw_gateway_requests" not in samples  # counting off: no request families


def test_registries_of_up_s_two_roles_never_collide() -> None:
    """`llmgw up` serves both in one process: each role's own registry, the default one untouched."""
    from prometheus_client import REGISTRY
    before = set(REGISTRY._names_to_collectors)
    control = registry_for(lambda: Scrape("n1:1", True, RAFT, fleet_doc(), connections=gate_stats("admin")))
    gateway = gw.registry_for(gw.RequestMetrics(), GuardStats(), connections=gate_stats("gateway"))
    both = CollectorRegistry()
    for r in (control, gateway):
        both.register(r)  # a registry is a collector of its collectors
    names = [f.name for f in text_string_to_metric_families(render(both).decode())]
    assert len(names) == len(set(names)) + 1, "only llmgw_build_info (role label) is in both"
    assert set(REGISTRY._names_to_collectors) == before


def test_a_scrape_renders_a_copy_so_requests_counted_meanwhile_never_tear_it() -> None:
    """The gateway renders in a worker thread: what it renders is a copy taken on the loop."""
    m, stats = gw.RequestMetrics(), GuardStats()
    m.count(RequestRecord("r", 0.0, "", "demo", 200, latency_ms=2.0))
    frozen = gw.Exporter(m, stats).frozen()
    m.count(RequestRecord("r", 0.0, "", "demo", 200, latency_ms=2.0))  # counted after the copy
    stats.counted("lg", Verdict())
    samples = parse(render(frozen).decode())
    assert value(samples, "llmgw_gateway_requests_total", model="demo", code="", status="200") == 1.0
    assert value(samples, "llmgw_gateway_request_duration_seconds_count", model="demo") == 1.0
    assert value(samples, "llmgw_guard_verdicts_total", judge="lg", hazard="safe") is None


def test_replicas_by_state_raft_indexes_and_webhook_deliveries_by_outcome() -> None:
    samples = parse(scrape_text(Scrape("n1:1", True, RAFT, fleet_doc(), {}, [], {"delivered": 3, "failed": 1})))
    assert {s.labels["state"]: s.value for s in samples["llmgw_replicas"]} == {"ready": 1, "starting": 0, "failed": 1}
    assert value(samples, "llmgw_model_failed_replicas", model="down") == 1.0
    assert value(samples, "llmgw_model_starting_replicas", model="up") == 0.0
    assert value(samples, "llmgw_model_parked", model="up") == 0.0
    assert {s.labels["standing"]: s.value for s in samples["llmgw_models"]} == {"satisfied": 1, "short": 2,
                                                                                 "unknown": 1}
    assert value(samples, "llmgw_raft_commit_index") == 120.0 and value(samples, "llmgw_raft_applied_index") == 118.0
    assert value(samples, "llmgw_raft_members") == 3.0
    assert value(samples, "llmgw_webhook_deliveries_total", outcome="delivered") == 3.0
    assert value(samples, "llmgw_webhook_deliveries_total", outcome="failed") == 1.0
    assert value(samples, "llmgw_webhooks_configured") == 0.0  # none set: the LlmgwNoWebhook alert reads this


DOC_ROW = re.compile(r"^\| `(llmgw_[a-z0-9_]+)` \| (gauge|counter|histogram) \|([^|]*)\|")


def test_every_exported_family_is_in_the_docs_and_every_documented_one_is_exported() -> None:
    """docs/observability.md's tables and the code's families, both ways: name, type and labels."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "observability.md").read_text(encoding="utf-8")
    documented: dict[tuple[str, str], tuple[str, set[str]]] = {}
    role = "control"
    for line in doc.splitlines():
        role = "gateway" if line.startswith("### Gateway") else role
        row = DOC_ROW.match(line)
        if row:
            documented[(role, row.group(1))] = (row.group(2), set(re.findall(r"`([a-z]+)`", row.group(3))))
    stats = GuardStats()
    stats.counted("lg", Verdict(("S1",)))
    m = gw.RequestMetrics()
    m.count(RequestRecord("r", 0.0, "k", "demo", 200, latency_ms=12.0, ttft_ms=3.0, tokens_in=3, tokens_out=5,
                          priority="bulk", queue_ms=40.0))
    found = [Condition("no_leader", "", "critical", "w")]
    exported: dict[tuple[str, str], tuple[str, set[str] | None]] = {}
    for role, text in (
            ("control", scrape_text(Scrape("n1:1", True, RAFT, fleet_doc(), {"down": 1}, found, {"delivered": 1},
                                           connections=gate_stats("admin")))),
            ("gateway", render(gw.registry_for(m, stats, gw._Stats({"dropped": 0, "write_errors": 0, "queued": 0}),
                                               gate_stats("gateway"), [("demo", "demo-r1")],
                                               [0, 1, 0, 2])).decode())):
        for family in text_string_to_metric_families(text):
            name = family.name + ("_total" if family.type == "counter" else "")
            labels = {k for s in family.samples for k in s.labels} - {"le"} if family.samples else None
            exported[(role, name)] = (family.type, labels)  # None: no sample here says what its labels are
    missing = {k for k in exported if k not in documented}
    assert not missing, f"exported, not in docs/observability.md's tables: {sorted(missing)}"
    stale = {k for k in documented if k not in exported}
    assert not stale, f"in docs/observability.md's tables, exported by no role: {sorted(stale)}"
    for key, (kind, labels) in exported.items():
        assert documented[key][0] == kind, (key, kind, documented[key])
        if labels is not None:
            assert documented[key][1] == labels, (key, labels, documented[key])


def test_a_listeners_connections_held_refused_and_evicted() -> None:
    samples = parse(scrape_text(Scrape("n1:1", False, RAFT, connections=gate_stats("admin"))))  # every member
    assert value(samples, "llmgw_admin_connections") == 3.0
    assert value(samples, "llmgw_admin_connections_limit", scope="listener") == 192.0
    assert value(samples, "llmgw_admin_connections_limit", scope="address") == 96.0
    assert value(samples, "llmgw_admin_connections_refused_total", reason="listener_full") == 1.0
    assert value(samples, "llmgw_admin_connections_refused_total", reason="address_full") == 2.0
    assert value(samples, "llmgw_admin_connections_evicted_total") == 4.0
    exporter = gw.Exporter(gw.RequestMetrics())
    exporter.connections = lambda: gate_stats("gateway")
    samples = parse(render(exporter.frozen()).decode())
    assert value(samples, "llmgw_gateway_connections_evicted_total") == 4.0
