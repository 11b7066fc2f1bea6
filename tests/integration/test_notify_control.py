"""The notifier wired into a real control plane (`serve`: Raft store, reconciler, admin API over HTTP): a
failure seen in `GET /api/v1/status` is posted to a real webhook server when it starts and when it resolves,
and `GET /api/v1/notify/status` keeps the deliveries."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import httpx
import pytest
import trio

from llmgw.control.service import ControlConfig, Seed, serve
from llmgw.domain.timeouts import TIMEOUTS
from llmgw.testing.webhooks import WebhookReceiver
from tests.support.processes import free_port

pytestmark = pytest.mark.slow

ADMIN = "sk-admin-notify"


async def test_an_unplaceable_model_is_posted_then_resolved(tmp_path: Path) -> None:
    timeouts = dataclasses.replace(TIMEOUTS, notify_check_s=0.1, notify_resolve_hold_s=0.5, agent_report_grace_s=0.5)
    cfg = ControlConfig(state_dir=tmp_path, raft_addr=f"127.0.0.1:{free_port()}", admin_host="127.0.0.1",
                        admin_port=0, seed=Seed(admin_key=ADMIN), timeouts=timeouts)
    receiver = WebhookReceiver()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            url = await nursery.start(receiver.serve)
            handle = await nursery.start(serve, cfg)
            async with httpx.AsyncClient(base_url=handle.admin_url,
                                         headers={"Authorization": f"Bearer {ADMIN}"}) as api:
                r = await api.put("/api/v1/settings/notify.webhooks", json=[url + "/hook"])
                assert r.status_code == 200, r.text
                r = await api.post("/api/v1/models", json={"name": "big", "engine": "sim", "source": "sim://big",
                                                           "mode": "always", "profile": {"gpus": 4, "tp": 4}})
                assert r.status_code == 201, r.text
                (started,) = [r.json() for r in await receiver.wait_for(1, "/hook")]
                assert started["event"] == "started" and started["condition"]["subject"] == "big"
                assert started["cluster"]["leader"] == cfg.raft_addr
                status = (await api.get("/api/v1/status")).json()
                assert started["condition"]["kind"] in {c["kind"] for c in status["conditions"]}
                assert (await api.delete("/api/v1/models/big")).status_code == 200
                (_, resolved) = [r.json() for r in await receiver.wait_for(2, "/hook")]
                assert resolved["event"] == "resolved" and resolved["condition"] == started["condition"]
                kept = (await api.get("/api/v1/notify/status")).json()
                assert [d["event"] for d in kept["webhooks"][0]["deliveries"]] == ["resolved", "started"]
                assert kept["active"] == []
            nursery.cancel_scope.cancel()
