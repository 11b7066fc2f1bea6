"""A gateway asked to upgrade (`upgrade_gateway` on its stream, `ctl upgrade`) that cannot take the release refuses
with the reason, over its stream: the leader lists it as the gateway's `upgrade_refused` (what ctl stops the run
with), and nothing changed: the gateway did not drain, keeps following and serving, the same program. One trio
run with a real control plane and a gateway over real sockets; the gateway runs from the llmgw package (this
test's process), not a release file, so it refuses whatever it is asked, and the route refuses it at once."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from llmgw.control.gateway_stream import hub_of
from llmgw.control.service import ControlHandle
from llmgw.control.service import serve as control_serve
from llmgw.gateway.app import Handover
from llmgw.gateway.follower import GatewayHandle
from llmgw.gateway.follower import serve as gateway_serve
from tests.integration.test_gateway_follower import ADMIN, CLIENT, FAST, control_config, gateway_config, until
from tests.support.processes import free_port

pytestmark = pytest.mark.slow


async def test_a_gateway_that_cannot_take_a_release_refuses_with_the_reason_and_changes_nothing(
        tmp_path: Path) -> None:
    raft_port, admin_port = free_port(), free_port()
    admin_url = f"http://127.0.0.1:{admin_port}"
    async with trio.open_nursery() as nursery:
        control: ControlHandle = await nursery.start(control_serve, control_config(tmp_path / "control", raft_port,
                                                                                   admin_port))
        assert control.context is not None
        config = dataclasses.replace(gateway_config(admin_url, credential=control.context.local_credential(
            "gateway", "gw-test")), handover=Handover(), state_dir=tmp_path / "gateway", timeouts=FAST)
        assert config.handover is not None
        handover = config.handover
        gw: GatewayHandle = await nursery.start(gateway_serve, config)
        hub = hub_of(control.context.reconciler)
        assert hub is not None
        async with httpx.AsyncClient(base_url=gw.url, headers={"Authorization": f"Bearer {CLIENT}"}) as http, \
                httpx.AsyncClient(base_url=admin_url, headers={"Authorization": f"Bearer {ADMIN}"}) as api:

            async def listed() -> dict[str, Any] | None:
                found = [g for g in (await api.get("/api/v1/gateways")).json()["gateways"] if g["name"] == "gw-test"]
                return found[0] if found else None

            async def follows() -> bool:
                g = await listed()
                return g is not None and g["connected"]
            await until(follows, 30)
            before = await listed()
            assert before is not None and before["restartable"] and before["release_sha256"] is None

            # The route refuses at once: its hello says it runs no release file.
            r = await api.post("/api/v1/gateways/gw-test/upgrade", json={"sha256": "a" * 64})
            assert r.status_code == 409 and r.json()["error"]["code"] == "not_a_zipapp", r.text

            # Asked over its stream all the same (as a leader that believed it could): it refuses, with the reason.
            for ask in ({"type": "upgrade_gateway", "sha256": "a" * 64}, {"type": "upgrade_gateway", "rollback": True}):
                hub.links["gw-test"].upgrade_refused = None
                assert hub.ask("gw-test", ask)

                async def refused() -> bool:
                    g = await listed()
                    return g is not None and bool(g["upgrade_refused"])
                await until(refused, 30)
                after = await listed()
                assert after is not None
                assert after["upgrade_refused"].startswith("not_a_zipapp: "), after
                assert "not a zipapp" in after["upgrade_refused"]
                # Nothing changed: not draining, the same stream and program, still serving, no file written.
                assert not handover.asked.is_set() and config.restart_into == []
                assert (after["connected"], after["connected_at"], after["started_at"], after["pid"]) == (
                    True, before["connected_at"], before["started_at"], before["pid"])
                assert (await http.get("/v1/models")).status_code == 200
            assert not (tmp_path / "gateway" / "release.json").exists()
        nursery.cancel_scope.cancel()
