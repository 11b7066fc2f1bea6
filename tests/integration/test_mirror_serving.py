"""A control plane serves its mirror files (`GET /mirror/blobs/<sha256>`, issue 24 point 5) to the cluster's
machines only: an agent's and a control plane's certificate get the file, whole or by a byte range (206, 416 past
the end), 404 for a file it does not hold; no credential, an admin key, a gateway's certificate and a revoked
agent's are refused (401/403, with the reason), and logged. On plain loopback HTTP (`llmgw up`) only a machine
inside the process fetches, by its in-memory credential."""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import httpx
import pytest
import trio

from llmgw.control.service import ControlConfig, ControlHandle, Seed
from llmgw.control.service import serve as control_serve
from llmgw.trust import tls
from llmgw.trust.files import MachineFiles
from tests.integration.test_trust_credentials import ADMIN, admin_client, files_of, join, tls_control_config
from tests.support.mirror_server import place_in_mirror
from tests.support.processes import free_port

pytestmark = pytest.mark.slow

DATA = os.urandom(5000)
SHA = hashlib.sha256(DATA).hexdigest()


async def test_the_mirror_serves_agents_and_control_planes_only_whole_or_by_range(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async with trio.open_nursery() as nursery:
        control: ControlHandle = await nursery.start(control_serve, tls_control_config(tmp_path / "control"))
        bundle = MachineFiles.of(tmp_path / "control").ca
        await place_in_mirror(control, tmp_path / "control", DATA, "f.gguf")
        async with admin_client(control, bundle) as api:
            agent = await join(api, control, bundle, tmp_path / "agent", "agent", "n1")
            gateway = await join(api, control, bundle, tmp_path / "gateway", "gateway", "gw1")
            revoked = await join(api, control, bundle, tmp_path / "revoked", "agent", "n-revoked")
            gone = await api.post("/api/v1/trust/machines/agent/n-revoked/revoke")
            assert gone.status_code == 200, gone.text
            # An admin key is for people: the mirror is not theirs to read this way (401, no machine's credential).
            refused = await api.get(f"/mirror/blobs/{SHA}")
            assert refused.status_code == 401 and refused.json()["error"]["code"] == "unauthorized", refused.text
        assert control.context is not None and control.context.trust is not None

        def client(cert: tuple[Path, Path] | None) -> httpx.AsyncClient:
            return httpx.AsyncClient(base_url=control.admin_url, timeout=10,
                                     verify=tls.client_context(bundle, *(cert or (None, None))))

        url = f"/mirror/blobs/{SHA}"
        async with client(files_of(agent)) as http:
            whole = await http.get(url)
            assert whole.status_code == 200 and whole.content == DATA and whole.headers["accept-ranges"] == "bytes"
            part = await http.get(url, headers={"range": "bytes=1000-1999"})
            assert part.status_code == 206 and part.content == DATA[1000:2000]
            assert part.headers["content-range"] == f"bytes 1000-1999/{len(DATA)}"
            tail = await http.get(url, headers={"range": "bytes=4990-"})
            assert tail.status_code == 206 and tail.content == DATA[4990:]
            past = await http.get(url, headers={"range": f"bytes={len(DATA)}-"})
            assert past.status_code == 416 and past.headers["content-range"] == f"bytes */{len(DATA)}"
            assert past.json()["error"]["code"] == "range_not_satisfiable"
            missing = await http.get("/mirror/blobs/" + "0" * 64)
            assert missing.status_code == 404 and missing.json()["error"]["code"] == "mirror_file_not_found"
            bad = await http.get("/mirror/blobs/not-a-sha")
            assert bad.status_code == 400
        async with client(files_of(control.context.trust.files)) as http:  # a standby pulling from the leader
            assert (await http.get(url, headers={"range": "bytes=0-9"})).content == DATA[:10]
        caplog.set_level(logging.WARNING, "llmgw.control.mirror")
        async with client(files_of(gateway)) as http:
            answer = await http.get(url)
            assert answer.status_code == 403 and answer.json()["error"]["code"] == "forbidden", answer.text
        async with client(files_of(revoked)) as http:
            answer = await http.get(url)
            assert answer.status_code == 403 and answer.json()["error"]["code"] == "revoked", answer.text
        async with client(None) as http:
            answer = await http.get(url)
            assert answer.status_code == 401 and DATA not in answer.content
        refusals = [r.getMessage() for r in caplog.records if "refused a mirror fetch" in r.getMessage()]
        assert any("revoked" in m for m in refusals) and len(refusals) >= 3, refusals
        nursery.cancel_scope.cancel()


async def test_on_plain_loopback_only_a_machine_inside_the_process_fetches(tmp_path: Path) -> None:
    config = ControlConfig(state_dir=tmp_path, raft_addr=f"127.0.0.1:{free_port()}", admin_host="127.0.0.1",
                           admin_port=0, seed=Seed(admin_key=ADMIN))
    async with trio.open_nursery() as nursery:
        control: ControlHandle = await nursery.start(control_serve, config)
        assert control.context is not None
        await place_in_mirror(control, tmp_path, DATA, "f.gguf")
        agent = control.context.local_credential("agent", "n1")
        gateway = control.context.local_credential("gateway", "gw1")
        async with httpx.AsyncClient(base_url=control.admin_url, timeout=10) as http:
            ok = await http.get(f"/mirror/blobs/{SHA}", headers={"authorization": f"Bearer {agent}"})
            assert ok.status_code == 200 and ok.content == DATA
            for headers, status in (({}, 401), ({"authorization": f"Bearer {ADMIN}"}, 401),
                                    ({"authorization": "Bearer llmgw-local-forged"}, 401),
                                    ({"authorization": f"Bearer {gateway}"}, 403)):
                answer = await http.get(f"/mirror/blobs/{SHA}", headers=headers)
                assert answer.status_code == status, (headers, answer.text)
        nursery.cancel_scope.cancel()
