"""`ctl guard judge ask` end to end, in one trio run over real sockets: a control plane, an agent running a
sim judge process (role guard), the operator's ctl. The judge's raw answer and its parse come back; nothing
of the text reaches a file in any state dir or a log line of any role."""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import logging
from pathlib import Path

import httpx
import pytest
import trio

from llmgw.agent import AgentConfig
from llmgw.agent import serve as agent_serve
from llmgw.cli.ctl.app import run_ctl
from llmgw.control.service import ControlConfig, ControlHandle, Seed
from llmgw.control.service import serve as control_serve
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import NodeInfo
from llmgw.domain.timeouts import TIMEOUTS
from llmgw.testing import FakeGpuProbe
from tests.support.processes import free_port

pytestmark = pytest.mark.slow

ADMIN = "sk-admin-guard-ask-test"
FAST = dataclasses.replace(TIMEOUTS, engine_health_poll_s=0.05)
MARKER = "ask-9c41d7e0-never-recorded"


async def ctl(admin_url: str, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    env = {"LLMGW_URL": admin_url, "LLMGW_KEY": ADMIN}
    code = await trio.to_thread.run_sync(functools.partial(run_ctl, list(argv), env=env, stdout=out, stderr=err))
    return code, out.getvalue(), err.getvalue()


async def test_a_judge_reads_a_text_and_nothing_of_it_is_recorded(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    raft_port, admin_port = free_port(), free_port()
    admin_url = f"http://127.0.0.1:{admin_port}"
    seed = Seed(admin_key=ADMIN, models=[
        ModelDef.from_doc({"name": "lg", "engine": "sim", "source": "sim://lg", "role": "guard"})])
    probe = FakeGpuProbe(NodeInfo("x", hostname="test-node", cpus=2, engines=("sim",)))
    async with trio.open_nursery() as nursery:
        control: ControlHandle = await nursery.start(control_serve, ControlConfig(
            state_dir=tmp_path / "control", raft_addr=f"127.0.0.1:{raft_port}", admin_host="127.0.0.1",
            admin_port=admin_port, seed=seed, timeouts=FAST))
        assert control.context is not None
        await nursery.start(agent_serve, AgentConfig(controls=[admin_url], tls=None,
                                                     local_credential=control.context.local_credential("agent", "n1"),
                                                     state_dir=tmp_path / "agent", node="n1", probe=probe,
                                                     timeouts=FAST))
        async with httpx.AsyncClient(base_url=admin_url, headers={"Authorization": f"Bearer {ADMIN}"}) as api:
            with trio.fail_after(30):  # until the judge serves (409 judge_unavailable before)
                while (got := await api.post("/api/v1/guard/judges/ask", json={"text": "hello"})).status_code != 200:
                    assert got.json()["error"]["code"] == "judge_unavailable", got.text
                    await trio.sleep(0.1)
            assert got.json()["parsed"] == {"ok": True, "safe": True, "categories": [], "rule": "judge: safe"}
            unknown = await api.post("/api/v1/guard/judges/ask", json={"text": MARKER, "judge": "nope"})
            assert unknown.status_code == 404 and MARKER not in unknown.text

        code, out, err = await ctl(admin_url, "guard", "judge", "ask", f"{MARKER} [unsafe:S9]")
        assert code == 0, err
        assert 'raw answer: "unsafe\\nS9"' in out, out
        assert "parsed:     unsafe: S9 Indiscriminate Weapons" in out
        assert "guard rule: judge: S9,Indiscriminate Weapons" in out
        code, out, err = await ctl(admin_url, "--json", "guard", "judge", "ask", MARKER, "--answer", "[unsafe:S6]")
        assert code == 0, err
        doc = json.loads(out)
        assert doc["checked"] == "response" and doc["raw"] == "unsafe\nS6" and doc["cached"] is False
        assert doc["judge"] == "lg" and doc["replica"].startswith("lg-")
        nursery.cancel_scope.cancel()
    assert control is not None

    # Not in any file under any state dir (Raft journal and snapshots, engine logs, ...), nor in any log line.
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert files
    for path in files:
        assert MARKER.encode() not in path.read_bytes(), path
    assert caplog.records and MARKER not in caplog.text
