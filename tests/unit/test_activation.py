"""Cold-start progress (llmgw/domain/activation.py) by example and as properties: the ETA, the window a
checkpoint's size needs, which replica stands for the model, Retry-After; what agents report (the size a
launch resolves), what control makes of it (`decide`'s routes and views), the route on the gateway's
wire (an older gateway's reading too), the summary, `ctl status` / `ctl model show`, and the console."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ctl_fakes import STATUS, FakeApi, ctl
from llmgw.console.models import phase_html
from llmgw.domain import activation, summary
from llmgw.domain.activation import Progress
from llmgw.domain.observed import ModelRoute, ReplicaObs
from llmgw.domain.timeouts import TIMEOUTS
from llmgw.engines import launch_spec
from llmgw.engines.sources import checkpoint_bytes
from llmgw.errors import OpenAIError
from llmgw.gateway.checks import wait_budget
from llmgw.reconcile import decide
from llmgw.testing.builders import cpu_node, model, observed, placed, replica, state_with
from llmgw.wire.protocol import route_doc, route_from_doc
from tests.support.tiny_gguf import minimal_gguf

GIB = 1 << 30
MIB = 1 << 20
NOW = 10_000.0
BASE = TIMEOUTS.activation_load_base_s


# --- the rules ------------------------------------------------------------------------------------------


def test_the_eta_is_what_is_left_of_the_estimate_and_none_past_it() -> None:
    p = Progress("loading", since=NOW - 10, bytes_total=13 * GIB, expected_s=100.0)
    assert p.eta_s(NOW) == 90.0
    assert p.eta_s(NOW + 100) is None  # past it: no estimate, never a negative or 0 ETA
    assert Progress("loading", since=NOW, bytes_total=None).eta_s(NOW) is None  # size unknown
    assert Progress("placing", bytes_total=GIB, expected_s=10).eta_s(NOW) is None  # nothing started


def test_the_words_say_phase_size_age_and_time_left() -> None:
    p = Progress("loading", since=NOW - 12, bytes_total=13 * GIB, expected_s=96.0)
    assert p.words(NOW) == "loading the 13.0 GiB checkpoint for 12 s, about 84 s left"
    assert p.words(NOW + 200).endswith("past its estimate of 96 s")
    assert Progress("placing").words(NOW) == "placing a replica"
    assert Progress("starting", since=NOW - 1).words(NOW) == "starting the engine for 1 s"
    assert Progress("fetching", NOW, bytes_done=GIB, bytes_total=4 * GIB).words(NOW).startswith(
        "fetching the checkpoint: 1.0 GiB of 4.0 GiB")


def test_the_window_is_the_definitions_or_the_checkpoints_estimate_if_longer() -> None:
    assert activation.window_s(120, None, 200, BASE) == 120  # unknown size: the definition's
    assert activation.window_s(120, 1 * GIB, 200, BASE) == 120  # 30 + 5 s: well within
    assert activation.window_s(120, 140 * GIB, 200, BASE) == pytest.approx(BASE + 140 * 1024 / 200)  # 747 s


@given(own=st.floats(1, 1e5), size=st.none() | st.integers(0, 1 << 44), rate=st.floats(1, 1e5),
       more=st.integers(0, 1 << 40))
def test_the_window_never_shrinks_the_definitions_and_grows_with_the_size(own: float, size: int | None, rate: float,
                                                                          more: int) -> None:
    window = activation.window_s(own, size, rate, BASE)
    assert window >= own
    if size is not None:
        assert activation.window_s(own, size + more, rate, BASE) >= window


def test_the_most_advanced_replica_stands_for_the_model_then_the_soonest_done() -> None:
    placing = Progress("placing", NOW - 50)
    early = Progress("loading", NOW - 50, bytes_total=GIB, expected_s=100)
    late = Progress("loading", NOW - 5, bytes_total=GIB, expected_s=100)
    starting = Progress("starting", NOW - 90)
    assert activation.best([placing, late, starting, early], NOW) == early
    assert activation.best([placing, starting], NOW) == starting
    assert activation.best([], NOW) is None


@given(eta=st.none() | st.floats(0.001, 1e6), default=st.floats(0.1, 600))
def test_retry_after_is_whole_seconds_at_least_one(eta: float | None, default: float) -> None:
    p = None if eta is None else Progress("loading", NOW, bytes_total=GIB, expected_s=eta)
    n = activation.retry_after_s(p, NOW, default)
    assert isinstance(n, int) and n >= 1
    assert n == max(1, math.ceil(default if eta is None else eta))


progresses = st.builds(Progress, st.sampled_from(activation.PHASES), st.none() | st.floats(0, 2e9),
                       st.none() | st.integers(0, 1 << 50), st.none() | st.integers(0, 1 << 50),
                       st.none() | st.floats(0, 1e6))


@given(progresses)
def test_progress_round_trips_as_a_document(p: Progress) -> None:
    assert Progress.from_doc(p.to_doc()) == p


def test_a_phase_this_release_does_not_know_reads_as_starting() -> None:
    assert Progress.from_doc({"phase": "compiling", "since": "soon"}) == Progress("starting")


# --- the header -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "budget"), [(None, None), (b"true", None), (b"false", 0.0), (b"FALSE", 0.0),
                                               (b"0", 0.0), (b"20", 20.0), (b" 2.5 ", 2.5)])
def test_the_wait_header(value: bytes | None, budget: float | None) -> None:
    headers = [(b"authorization", b"Bearer x")] + ([(b"x-llmgw-wait", value)] if value is not None else [])
    assert wait_budget(headers) == budget


@pytest.mark.parametrize("value", [b"soon", b"-1", b"nan", b"inf", b"", b"1_0", b"+3"])
def test_a_wait_header_that_is_not_a_wait_is_400(value: bytes) -> None:
    with pytest.raises(OpenAIError) as caught:
        wait_budget([(b"x-llmgw-wait", value)])
    assert (caught.value.status, caught.value.code, caught.value.param) == (400, "invalid_wait", "x-llmgw-wait")


# --- what the agent reports: the size a launch resolves ----------------------------------------------------


def test_a_checkpoints_size_on_disk_is_its_file_or_its_directorys_files(tmp_path: Path) -> None:
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(minimal_gguf())
    assert checkpoint_bytes(str(gguf)) == gguf.stat().st_size
    shards = tmp_path / "qwen"
    shards.mkdir()
    (shards / "model-00001.safetensors").write_bytes(b"x" * 1000)
    (shards / "model-00002.safetensors").write_bytes(b"x" * 500)
    (shards / "config.json").write_bytes(b"{}")
    assert checkpoint_bytes(str(shards)) == 1502
    assert checkpoint_bytes(str(tmp_path / "missing")) is None


def test_a_vllm_launch_reports_its_model_directorys_size(tmp_path: Path) -> None:
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "vllm").write_text('#!/bin/sh\n[ "$1" = --version ] && echo 0.11.1\n')
    (folder / "vllm").chmod(0o755)
    weights = tmp_path / "qwen"
    weights.mkdir()
    (weights / "model.safetensors").write_bytes(b"x" * 4096)
    spec = launch_spec("vllm", model="demo", role="chat", source=str(weights), host="127.0.0.1", port=9001,
                       args=[], devices=("GPU-1",), environ={"PATH": str(folder)})
    assert spec.weights_bytes == 4096
    sim = launch_spec("sim", model="demo", role="chat", source="sim://demo", host="127.0.0.1", port=9001, args=[])
    assert sim.weights_bytes is None  # the simulator reads no weights


def test_a_replica_report_carries_its_phase_and_size_and_an_older_agents_reads_without() -> None:
    obs = ReplicaObs("big-r1", "big", "n1", "starting", since=NOW, phase="loading", weights_bytes=13 * GIB)
    assert ReplicaObs.from_doc(obs.to_doc(), "n1") == obs
    old = {k: v for k, v in obs.to_doc().items() if k not in ("phase", "weights_bytes")}
    assert ReplicaObs.from_doc(old, "n1") == dataclasses.replace(obs, phase="", weights_bytes=None)
    assert ReplicaObs.from_doc({**obs.to_doc(), "weights_bytes": "lots"}, "n1").weights_bytes is None


# --- what control makes of it ---------------------------------------------------------------------------


def _big() -> Any:
    return model("big").llamacpp("/models/big.gguf")


def test_control_routes_the_loading_replicas_progress_and_the_window_its_size_needs() -> None:
    s = state_with([_big()], [placed("big", "local", at=NOW - 20)])
    loading = dataclasses.replace(replica("big-r1", "local", "starting", since=NOW - 10), phase="loading",
                                  weights_bytes=140 * GIB)
    plan = decide(s, observed([cpu_node("local")], [loading]), NOW)
    route = plan.routes["big"]
    expected = BASE + 140 * 1024 / 200
    assert route.state == "starting" and route.reason == "replicas are starting"  # words stay out of the route
    assert route.activation == Progress("loading", NOW - 10, None, 140 * GIB, pytest.approx(expected))
    assert route.window_s == pytest.approx(expected)
    assert plan.views["big"].activation == route.activation
    # The same pass a second later publishes the same route: gateways are not sent a table per tick.
    assert decide(s, observed([cpu_node("local")], [loading]), NOW + 1).routes == plan.routes


def test_before_any_agent_reports_the_model_is_placing_with_the_size_storage_reports() -> None:
    s = state_with([_big()], [placed("big", "local", at=NOW - 3)])
    node = dataclasses.replace(cpu_node("local"), storage=(
        {"path": "/models", "models": [{"name": "big", "path": "/models/big.gguf", "kind": "gguf",
                                        "size": 70 * GIB}]},))
    plan = decide(s, observed([node]), NOW)
    assert plan.routes["big"].activation == Progress("placing", NOW - 3, None, 70 * GIB,
                                                     pytest.approx(BASE + 70 * 1024 / 200))
    assert plan.routes["big"].window_s == pytest.approx(BASE + 70 * 1024 / 200)
    # A setting of a faster disk shortens the estimate (and the window to the definition's 120 s).
    fast = state_with([_big()], [placed("big", "local", at=NOW - 3)], settings={"activation.load_mib_per_s": 10_000})
    assert decide(fast, observed([node]), NOW).routes["big"].window_s == 0.0


def test_a_ready_model_has_no_activation_and_a_sim_model_no_window() -> None:
    s = state_with([model("demo")], [placed("demo", "local")])
    plan = decide(s, observed([cpu_node("local")], [replica("demo-r1", "local")]), NOW)
    assert plan.routes["demo"].activation is None and plan.routes["demo"].window_s == 0.0
    starting = decide(s, observed([cpu_node("local")], [replica("demo-r1", "local", "starting", since=NOW)]), NOW)
    assert starting.routes["demo"].activation == Progress("starting", NOW)  # an agent that says no phase


# --- the gateway's wire ---------------------------------------------------------------------------------


def test_a_route_carries_its_activation_and_window_and_an_older_gateway_reads_it_as_before() -> None:
    p = Progress("loading", NOW, None, 13 * GIB, 96.0)
    route = ModelRoute("big", "chat", "starting", (), "replicas are starting", activation=p, window_s=600.0)
    assert route_from_doc(route_doc(route)) == route
    off = ModelRoute("m", "chat", "absent", (), "schedule rule 1 allows no replica until then", off_until=1.8e9)
    assert route_from_doc(route_doc(off)) == off
    assert route_from_doc({**route_doc(off), "off_until": "soon"}).off_until is None  # not a time: not held
    plain = ModelRoute("demo", "chat", "absent")
    assert set(route_doc(plain)) == {"model", "role", "state", "reason", "endpoints"}  # the bytes of before
    # An older gateway reads the fields it knows (this is its whole reader, as it was).
    doc = route_doc(route)
    older = ModelRoute(str(doc["model"]), str(doc.get("role", "")), doc["state"], (), str(doc.get("reason", "")))
    assert older == dataclasses.replace(route, activation=None, window_s=0.0)
    assert route_from_doc({**doc, "window_s": "long", "activation": [1]}).window_s == 0.0


# --- what operators see ---------------------------------------------------------------------------------


def _plan_and_state() -> tuple[Any, Any, Any]:
    s = state_with([_big()], [placed("big", "local", at=NOW - 20)])
    loading = dataclasses.replace(replica("big-r1", "local", "starting", since=NOW - 12), phase="loading",
                                  weights_bytes=13 * GIB)
    obs = observed([cpu_node("local")], [loading])
    return s, obs, decide(s, obs, NOW)


def test_the_summary_and_the_model_status_show_the_progress_as_of_their_time() -> None:
    s, obs, plan = _plan_and_state()
    status = summary.model_status(s, obs, "big", plan.views["big"], NOW + 2)
    assert status["activation"]["phase"] == "loading" and status["activation"]["elapsed_s"] == 14.0
    assert status["activation"]["words"] == "loading the 13.0 GiB checkpoint for 14 s, about 83 s left"
    assert status["window_s"] == 120.0  # 30 + 13 GiB at 200 MiB/s is 96.6 s: the definition's is longer
    [row] = summary.summarize(s, obs, plan.views, {}, NOW).models
    assert row.activation is not None and row.activation["eta_s"] == round(BASE + 13 * 1024 / 200 - 12, 1)
    ready = decide(s, observed([cpu_node("local")], [replica("big-r1", "local")]), NOW)
    assert summary.model_status(s, obs, "big", ready.views["big"], NOW)["activation"] is None


def test_ctl_status_and_model_show_print_the_progress_line() -> None:
    s, obs, plan = _plan_and_state()
    status = {**STATUS, "models": [m.to_doc() for m in summary.summarize(s, obs, plan.views, {}, NOW).models]}
    r = ctl(["status"], FakeApi().on("GET", "/api/v1/status", json_body=status))
    assert r.rc == 0, r.err
    assert "  big: loading the 13.0 GiB checkpoint for 12 s, about 85 s left" in r.out
    doc = {**s.models["big"].to_doc(), "status": summary.model_status(s, obs, "big", plan.views["big"], NOW)}
    shown = ctl(["model", "show", "big"], FakeApi().on("GET", "/api/v1/models/big", json_body={"model": doc}))
    assert shown.rc == 0, shown.err
    assert "activation:" in shown.out and "loading the 13.0 GiB checkpoint for 12 s, about 85 s left" in shown.out
    stretched = {**doc, "status": {**doc["status"], "window_s": 747.0}}
    long = ctl(["model", "show", "big"], FakeApi().on("GET", "/api/v1/models/big", json_body={"model": stretched}))
    assert "747 s (the checkpoint's load estimate; the definition says 120 s)" in long.out


def test_the_console_shows_the_phase_with_its_data() -> None:
    s, obs, plan = _plan_and_state()
    html = phase_html(summary.model_status(s, obs, "big", plan.views["big"], NOW))
    assert 'data-phase="loading"' in html and f'data-bytes-total="{13 * GIB}"' in html
    assert "loading the 13.0 GiB checkpoint for 12 s, about 85 s left (activation window 120 s)" in html
    assert "not activating" in phase_html({"activation": None, "window_s": 120.0})
