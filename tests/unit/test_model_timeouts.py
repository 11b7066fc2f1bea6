"""A model's own upstream timeouts (`timeouts` in its definition): read, refused by field, stored,
sent by `ctl model serve`, and shown with the request limits by `ctl model show`. The gateway's use
of them: tests/integration/test_gateway_model_timeouts.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ctl_fakes import FakeApi, ctl
from llmgw.domain import commands
from llmgw.domain.codec import state_from_json, state_to_json
from llmgw.domain.model import NO_OVERRIDES, DefinitionError, ModelDef, ModelTimeouts
from llmgw.domain.state import ClusterState

SIM = {"name": "m", "engine": "sim", "source": "sim://m"}


def test_timeouts_default_to_the_gateways_and_are_read() -> None:
    assert ModelDef.from_doc(SIM).timeouts == NO_OVERRIDES == ModelTimeouts(None, None, None)
    m = ModelDef.from_doc({**SIM, "timeouts": {"first_byte_s": 30, "chunk_s": 7.5, "connect_s": None}})
    assert m.timeouts == ModelTimeouts(connect_s=None, first_byte_s=30.0, chunk_s=7.5)
    assert m.to_doc()["timeouts"] == {"connect_s": None, "first_byte_s": 30.0, "chunk_s": 7.5}
    assert ModelDef.from_doc(m.to_doc()) == m


@pytest.mark.parametrize(
    ("timeouts", "problems"),
    [
        ([], [("timeouts", "must be an object like {first_byte_s = 30, chunk_s = 10}")]),
        ({"first_byte_s": 0}, [("timeouts.first_byte_s", "must be a number of seconds above 0 and at most 86400")]),
        ({"chunk_s": -1}, [("timeouts.chunk_s", "must be a number of seconds above 0 and at most 86400")]),
        ({"connect_s": 86401}, [("timeouts.connect_s", "must be a number of seconds above 0 and at most 86400")]),
        ({"connect_s": True}, [("timeouts.connect_s", "must be a number")]),
        ({"chunk_s": "5"}, [("timeouts.chunk_s", "must be a number")]),
        ({"chunk_s": float("inf")}, [("timeouts.chunk_s", "must be a finite number")]),
        ({"chunk_s": 10**400}, [("timeouts.chunk_s", "is too large")]),
        ({"read_s": 5, "first_byte_s": 0}, [
            ("timeouts.read_s", "unknown key; known: connect_s, first_byte_s, chunk_s"),
            ("timeouts.first_byte_s", "must be a number of seconds above 0 and at most 86400")]),
    ],
)
def test_bad_timeouts_are_refused_with_the_field(timeouts: Any, problems: list[tuple[str, str]]) -> None:
    with pytest.raises(DefinitionError) as caught:
        ModelDef.from_doc({**SIM, "timeouts": timeouts})
    assert list(caught.value.errors) == problems


def test_timeouts_do_not_change_the_launch_hash() -> None:
    # The gateway reads them per request: changing one restarts no replica.
    assert ModelDef.from_doc({**SIM, "timeouts": {"first_byte_s": 5}}).launch_hash() == ModelDef.from_doc(
        SIM).launch_hash()


def test_a_model_stored_before_timeouts_existed_reads_with_the_defaults() -> None:
    model = ModelDef.from_doc({**SIM, "timeouts": {"chunk_s": 9}})
    state, _ = commands.apply_entry(ClusterState(), commands.put_model(model, at=1.0))
    doc = json.loads(json.dumps(state_to_json(state)))
    assert doc["state"]["models"]["m"]["timeouts"] == {"connect_s": None, "first_byte_s": None, "chunk_s": 9.0}
    assert state_from_json(doc).models["m"].timeouts.chunk_s == 9.0
    del doc["state"]["models"]["m"]["timeouts"]
    assert state_from_json(doc).models["m"].timeouts == NO_OVERRIDES


def test_serve_flags_set_the_models_timeouts() -> None:
    api = FakeApi().on("POST", "/api/v1/models", 201, json_body={"model": {"name": "c"}})
    argv = ["model", "serve", "--name", "c", "--engine", "sim", "--source", "sim://c", "--first-byte-timeout", "30",
            "--chunk-timeout", "7.5"]
    assert ctl(argv, api).rc == 0
    assert api.bodies() == [{"name": "c", "engine": "sim", "source": "sim://c",
                             "timeouts": {"first_byte_s": 30.0, "chunk_s": 7.5}}]


def _show(model: dict[str, Any]) -> dict[str, str]:
    api = FakeApi().on("GET", "/api/v1/models/m", json_body={"model": model})
    r = ctl(["model", "show", "m"], api)
    assert r.rc == 0, r.err
    return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in r.out.splitlines()) if v}


def test_model_show_prints_the_request_limits_and_the_upstream_timeouts() -> None:
    shown = _show(ModelDef.from_doc({**SIM, "limits": {"max_tokens": 4096},
                                     "timeouts": {"first_byte_s": 30, "chunk_s": 7.5}}).to_doc())
    assert shown["request limits"] == "max_tokens <= 4096, n: no limit"
    assert shown["upstream timeouts"] == "connect: default, first byte 30 s, between chunks 7.5 s"
    shown = _show(ModelDef.from_doc(SIM).to_doc())
    assert (shown["request limits"], shown["upstream timeouts"]) == ("none", "the gateway's defaults")
    shown = _show(ModelDef.from_doc({**SIM, "limits": {"concurrency_per_replica": 4}}).to_doc())
    assert shown["request limits"] == "max_tokens: no limit, n: no limit, 4 slots per replica"
    shown = _show({"name": "m"})  # an older server sends neither: unknown, not "none"
    assert (shown["request limits"], shown["upstream timeouts"]) == ("-", "-")
