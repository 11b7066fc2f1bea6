"""A machine's certificate over its life, with clocks injected through the seams: an agent renews at two
thirds of its certificate's life over the stream it already holds (nothing restarts, the stream stays),
and a certificate left to its end becomes the `cert_expiring` condition and the metric's number, then is
refused. A real control plane (TLS, its own CA) and a real agent, in one trio run."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from cryptography.hazmat.primitives import serialization

from llmgw.agent import AgentConfig
from llmgw.agent import serve as agent_serve
from llmgw.control.service import ControlConfig, ControlHandle, Seed
from llmgw.control.service import serve as control_serve
from llmgw.domain.observed import NodeInfo
from llmgw.domain.trust import machine_id
from llmgw.metrics.control import certificate_families
from llmgw.testing import FakeGpuProbe
from llmgw.trust import ca, tls
from llmgw.trust.files import MachineFiles
from llmgw.trust.join import JoinRequest, client_context, ensure_credentials
from llmgw.trust.peer import PeerRefused, authorize
from llmgw.trust.renewal import Renewal, renew_at
from tests.support.processes import free_port

pytestmark = pytest.mark.slow

ADMIN = "sk-admin-renewal-test"
DAY = 86400.0


async def start_control(nursery: trio.Nursery, root: Path) -> ControlHandle:
    cfg = ControlConfig(state_dir=root / "control", raft_addr=f"127.0.0.1:{free_port()}", admin_host="127.0.0.1",
                        admin_port=free_port(), seed=Seed(admin_key=ADMIN), tls=True)
    handle: ControlHandle = await nursery.start(control_serve, cfg)
    return handle


async def join(control: ControlHandle, root: Path, role: str, name: str) -> MachineFiles:
    ca_file = root / "control" / "tls" / "ca.pem"
    async with httpx.AsyncClient(base_url=control.admin_url, verify=tls.client_context(ca_file),
                                 headers={"authorization": f"Bearer {ADMIN}"}) as admin:
        made = await admin.post("/api/v1/trust/tokens", json={"role": role, "name": name})
    assert made.status_code == 201, made.text
    files = MachineFiles.of(root / name)
    await ensure_credentials(files, [control.admin_url], JoinRequest(role, name, made.json()["token"],
                                                                     ca_file=ca_file))
    return files


async def wait_for(predicate: Any, timeout: float = 20.0) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.02)


async def test_an_agent_renews_at_two_thirds_over_its_stream_without_restarting(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        control = await start_control(nursery, tmp_path)
        files = await join(control, tmp_path, "agent", "n1")
        first, first_key = files.identity(), files.key.read_text()
        context = client_context(files)
        shift = [0.0]  # the agent's clock runs this far ahead of the real one
        renewal = Renewal(files, "agent", "n1", context, clock=lambda: time.time() + shift[0])
        cfg = AgentConfig(controls=[control.admin_url], tls=context, renewal=renewal, state_dir=tmp_path / "agent",
                          node="n1", probe=FakeGpuProbe(NodeInfo("n1", cpus=2, engines=("sim",))))
        await nursery.start(agent_serve, cfg)
        link = control.hub.links["n1"]
        assert not renewal.due()

        shift[0] = renew_at(files.cert.read_text()) - time.time() + 1  # just past two thirds of its life
        held = control.store.snapshot().machines
        await wait_for(lambda: len(control.store.snapshot().machines[machine_id("agent", "n1")].serials) == 2)
        await wait_for(lambda: files.identity().serial != first.serial)

        renewed = files.identity()
        assert renewed.not_after > first.not_after and held[machine_id("agent", "n1")].serials == (first.serial,)
        assert control.store.snapshot().machines[machine_id("agent", "n1")].serials == (first.serial, renewed.serial)
        assert control.hub.links["n1"] is link, "the stream that asked is the stream that goes on"
        assert files.key.read_text() != first_key, "a new key, made on the machine"
        shift[0] = 0.0
        assert not renewal.due()
        # The next connection presents the renewed certificate: the context was reloaded in place.
        async with httpx.AsyncClient(verify=context) as client:
            assert (await client.get(control.admin_url + "/health")).status_code == 200
        nursery.cancel_scope.cancel()


async def test_a_certificate_left_to_its_end_is_a_condition_then_refused(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        control = await start_control(nursery, tmp_path)
        files = await join(control, tmp_path, "gateway", "gw1")
        who = files.identity()
        ctx = control.context
        assert ctx is not None
        cluster = ctx.local_cluster()

        def conditions_at(at: float) -> dict[str, str]:
            return {c.subject: c.severity for c in ctx.look(cluster, now=at).conditions if c.kind == "cert_expiring"}

        assert conditions_at(time.time()) == {}
        eight_days_left = who.not_after - 8 * DAY
        six_days_left = who.not_after - 6 * DAY
        assert "gateway/gw1" not in conditions_at(eight_days_left)
        assert conditions_at(six_days_left)["gateway/gw1"] == "warning"
        assert conditions_at(who.not_after + 1)["gateway/gw1"] == "critical"
        # The same fact as a number, for every certificate in use (the control plane's own included).
        look = ctx.look(cluster, now=six_days_left)
        [metric] = list(certificate_families(look.summary.certificates))
        values = {(x.labels["role"], x.labels["name"]): x.value for x in metric.samples}
        assert values[("gateway", "gw1")] == pytest.approx(6 * DAY)
        assert any(role == "control" for role, _ in values) and any(role == "ca" for role, _ in values)
        # Past its end the certificate no longer admits the machine, whatever else holds.
        der = ca.load_cert(files.cert.read_text()).public_bytes(serialization.Encoding.DER)
        assert authorize(der, ctx.state(), time.time(), role="gateway").name == "gw1"
        with pytest.raises(PeerRefused, match="expired"):
            authorize(der, ctx.state(), who.not_after + 1, role="gateway")
        nursery.cancel_scope.cancel()


async def test_a_join_token_lives_at_most_its_longest_life_and_is_shown_once(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        control = await start_control(nursery, tmp_path)
        async with httpx.AsyncClient(base_url=control.admin_url,
                                     verify=tls.client_context(tmp_path / "control" / "tls" / "ca.pem"),
                                     headers={"authorization": f"Bearer {ADMIN}"}) as admin:
            longest = control.reconciler.timeouts.join_token_ttl_max_s
            for ttl in (longest + 1, 0, -5, True, "1h"):
                refused = await admin.post("/api/v1/trust/tokens", json={"role": "agent", "ttl_s": ttl})
                assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_token", ttl
            made = await admin.post("/api/v1/trust/tokens", json={"role": "agent", "ttl_s": longest})
            assert made.status_code == 201 and made.json()["token"].startswith("llmgw-join-")
            listed = (await admin.get("/api/v1/trust/tokens")).json()["tokens"]
            assert [t["id"] for t in listed] == [made.json()["id"]]
            assert made.json()["token"] not in str(listed), "a token is shown once, never listed"
        nursery.cancel_scope.cancel()


async def test_a_join_pinned_by_hash_tries_the_next_control_when_one_is_down_or_not_the_cluster(
        tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        control = await start_control(nursery, tmp_path)
        other = await start_control(nursery, tmp_path / "other")  # another cluster: its CA is not the one pinned
        async with httpx.AsyncClient(base_url=control.admin_url,
                                     verify=tls.client_context(tmp_path / "control" / "tls" / "ca.pem"),
                                     headers={"authorization": f"Bearer {ADMIN}"}) as admin:
            made = (await admin.post("/api/v1/trust/tokens", json={"role": "agent", "name": "n1"})).json()
        down = f"https://127.0.0.1:{free_port()}"
        files = MachineFiles.of(tmp_path / "n1")
        await ensure_credentials(files, [down, other.admin_url, control.admin_url],
                                 JoinRequest("agent", "n1", made["token"], ca_hash=made["ca_hash"]))
        assert files.identity().name == "n1"
        assert ca.roots_hash(files.ca.read_text()) == made["ca_hash"]
        nursery.cancel_scope.cancel()
