"""A gateway's /v1 over TLS with an operator's own certificate: reloaded on SIGHUP without dropping a
connection (a kept-alive one goes on with the certificate it began with, the next one gets the new one),
and a control plane reads its request log with its own certificate, never the caller's key. A real
control plane (TLS, its own CA) in this trio run, a real `llmgw gateway` process joined with a token."""

from __future__ import annotations

import http.client
import os
import signal
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import trio

from llmgw.control.service import ControlConfig, ControlHandle, Seed
from llmgw.control.service import serve as control_serve
from llmgw.trust import ca, tls
from llmgw.trust.files import write_private
from llmgw.wire import logquery
from tests.support.processes import free_port

pytestmark = pytest.mark.slow

ADMIN = "sk-admin-gateway-tls-test"


def operator_cert(root: ca.Issued, directory: Path, name: str) -> tuple[Path, Path, str]:
    """A certificate from the operator's own CA for 127.0.0.1: (cert file, key file, its serial)."""
    inter = ca.make_intermediate(root, time.time())
    key = ca.new_key_pem()
    cert = ca.sign_request(ca.make_request(key, "gateway", name), inter, role="gateway", name=name,
                           hosts=("127.0.0.1", "localhost"), now=time.time())
    write_private(directory / f"{name}.pem", cert + inter.cert_pem)
    write_private(directory / f"{name}.key", key)
    return directory / f"{name}.pem", directory / f"{name}.key", ca.identity(cert).serial


def served_serial(connection: http.client.HTTPSConnection) -> str:
    sock = connection.sock
    assert isinstance(sock, ssl.SSLSocket)
    der = sock.getpeercert(binary_form=True)
    assert der is not None
    return ca.identity(der).serial


async def test_a_gateway_serves_the_operators_certificate_and_reloads_it_on_sighup(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        control: ControlHandle = await nursery.start(control_serve, ControlConfig(
            state_dir=tmp_path / "control", raft_addr=f"127.0.0.1:{free_port()}", admin_host="127.0.0.1",
            admin_port=free_port(), seed=Seed(admin_key=ADMIN), tls=True))
        cluster_ca = tmp_path / "control" / "tls" / "ca.pem"
        admin = httpx.AsyncClient(base_url=control.admin_url, verify=tls.client_context(cluster_ca),
                                  headers={"authorization": f"Bearer {ADMIN}"})
        token = (await admin.post("/api/v1/trust/tokens", json={"role": "gateway", "name": "gw1"})).json()["token"]

        root = ca.make_root("operator", time.time())
        write_private(tmp_path / "operator-root.pem", root.cert_pem)
        live_cert, live_key = tmp_path / "tls.pem", tmp_path / "tls.key"
        first_cert, first_key, first = operator_cert(root, tmp_path, "first")
        second_cert, second_key, second = operator_cert(root, tmp_path, "second")
        write_private(live_cert, first_cert.read_text())
        write_private(live_key, first_key.read_text())

        port = free_port()
        log = (tmp_path / "gw.out").open("w")
        proc = subprocess.Popen(
            [sys.executable, "-m", "llmgw", "gateway", "--control", control.admin_url, "--name", "gw1",
             "--listen", f"127.0.0.1:{port}", "--state-dir", str(tmp_path / "gw"), "--ca-file", str(cluster_ca),
             "--tls-cert", str(live_cert), "--tls-key", str(live_key)],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "LLMGW_JOIN_TOKEN": token})
        try:
            output = tmp_path / "gw.out"
            with trio.fail_after(60):
                while "llmgw gateway ready url=https://" not in output.read_text():
                    assert proc.poll() is None, output.read_text()
                    await trio.sleep(0.05)

            trusted = ssl.create_default_context(cafile=str(tmp_path / "operator-root.pem"))

            def get(conn: http.client.HTTPSConnection) -> int:
                conn.request("GET", "/health")
                response = conn.getresponse()
                response.read()
                return response.status

            kept = http.client.HTTPSConnection("127.0.0.1", port, context=trusted, timeout=10)
            assert await trio.to_thread.run_sync(get, kept) == 200
            assert served_serial(kept) == first

            write_private(live_cert, second_cert.read_text())  # the operator renews the files...
            write_private(live_key, second_key.read_text())
            proc.send_signal(signal.SIGHUP)  # ...and tells the gateway
            with trio.fail_after(30):
                while "SIGHUP: serving the certificate" not in output.read_text():
                    await trio.sleep(0.05)

            fresh = http.client.HTTPSConnection("127.0.0.1", port, context=trusted, timeout=10)
            assert await trio.to_thread.run_sync(get, fresh) == 200
            assert served_serial(fresh) == second, "a new connection gets the reloaded certificate"
            assert await trio.to_thread.run_sync(get, kept) == 200, "the connection kept alive goes on"
            assert served_serial(kept) == first
            kept.close()
            fresh.close()

            # The request log: control asks the gateway with its own certificate (the caller's key stays here).
            page: dict[str, object] = {}
            with trio.move_on_after(30):
                while True:
                    page = (await admin.get("/api/v1/requests")).json()
                    if "gw1" in page["gateways"]["answered"]:
                        break
                    await trio.sleep(0.1)
            assert "gw1" in page["gateways"]["answered"], page
            assert page["gateways"]["unavailable"] == [], page["gateways"]
            # Asked by anyone else over TLS without a key or a control plane's certificate: refused.
            async with httpx.AsyncClient(verify=trusted) as stranger:
                refused = await stranger.get(f"https://127.0.0.1:{port}{logquery.PATH}")
            assert refused.status_code == 401, refused.text
        finally:
            proc.send_signal(signal.SIGTERM)
            with trio.move_on_after(20):
                while proc.poll() is None:
                    await trio.sleep(0.05)
            if proc.poll() is None:
                proc.kill()
            log.close()
            await admin.aclose()
        nursery.cancel_scope.cancel()


def test_which_listeners_are_off_loopback() -> None:
    """Bound off loopback, a listener serves TLS (a gateway without an operator's certificate: its own)."""
    from llmgw.net import off_loopback

    assert off_loopback("0.0.0.0") and off_loopback("10.1.2.3") and off_loopback("gw.example")
    assert not off_loopback("127.0.0.1") and not off_loopback("::1") and not off_loopback("localhost")
