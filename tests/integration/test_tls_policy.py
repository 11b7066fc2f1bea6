"""What a TLS listener of llmgw offers, asked from outside as a scanner would: TLS 1.2 and 1.3 only, and
on TLS 1.2 only ECDHE key exchange with an AEAD cipher. Asked of a real control plane's admin API
(its own CA), with Python's `ssl` (clients willing to speak anything, @SECLEVEL=0) and with
`openssl s_client` trying every TLS 1.2 cipher OpenSSL knows, one at a time."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import warnings
from pathlib import Path

import pytest
import trio

from llmgw.control.service import ControlConfig, ControlHandle, Seed
from llmgw.control.service import serve as control_serve
from tests.support.processes import free_port

pytestmark = pytest.mark.slow


def handshake(port: int, *, versions: tuple[ssl.TLSVersion, ssl.TLSVersion], ciphers: str | None = None) -> str:
    """The protocol and cipher a willing client gets from 127.0.0.1:port, or the error's words."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    context.set_ciphers(ciphers or "ALL:@SECLEVEL=0")
    with warnings.catch_warnings():  # asking for TLS 1.0 and 1.1 is the point here
        warnings.simplefilter("ignore", DeprecationWarning)
        context.minimum_version, context.maximum_version = versions
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            cipher = tls.cipher()
            return f"{tls.version()} {cipher[0] if cipher else '?'}"
    except (ssl.SSLError, OSError) as e:
        return f"refused: {e}"


def tls12_ciphers() -> list[str]:
    done = subprocess.run(["openssl", "ciphers", "-v", "ALL:COMPLEMENTOFALL:@SECLEVEL=0"], capture_output=True,
                          text=True, timeout=30, check=True)
    return sorted({line.split()[0] for line in done.stdout.splitlines() if " TLSv1.2 " in f" {line} "
                   or line.split()[1] in ("TLSv1", "SSLv3")})


def s_client_accepts(port: int, cipher: str) -> bool:
    done = subprocess.run(["openssl", "s_client", "-connect", f"127.0.0.1:{port}", "-tls1_2", "-cipher",
                           f"{cipher}:@SECLEVEL=0", "-servername", "localhost"], input="", capture_output=True,
                          text=True, timeout=30)
    return done.returncode == 0 and f"Cipher is {cipher}" in done.stdout


async def test_an_admin_api_speaks_tls_1_2_and_1_3_with_aead_and_forward_secrecy_only(tmp_path: Path) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed (Debian: apt-get install openssl; .ci/system-packages.sh does)")
    async with trio.open_nursery() as nursery:
        port = free_port()
        control: ControlHandle = await nursery.start(control_serve, ControlConfig(
            state_dir=tmp_path / "c", raft_addr=f"127.0.0.1:{free_port()}", admin_host="127.0.0.1", admin_port=port,
            seed=Seed(admin_key="sk-admin-tls-policy"), tls=True))
        assert control.admin_url.startswith("https://")
        v = ssl.TLSVersion

        def ask() -> dict[str, str]:
            return {
                "TLS 1.0": handshake(port, versions=(v.TLSv1, v.TLSv1)),
                "TLS 1.1": handshake(port, versions=(v.TLSv1_1, v.TLSv1_1)),
                "TLS 1.2, CBC with SHA-1": handshake(port, versions=(v.TLSv1_2, v.TLSv1_2),
                                                     ciphers="ECDHE-ECDSA-AES128-SHA:@SECLEVEL=0"),
                "TLS 1.2, CBC with SHA-384": handshake(port, versions=(v.TLSv1_2, v.TLSv1_2),
                                                       ciphers="ECDHE-ECDSA-AES256-SHA384:@SECLEVEL=0"),
                "TLS 1.2, anything": handshake(port, versions=(v.TLSv1_2, v.TLSv1_2)),
                "TLS 1.3": handshake(port, versions=(v.TLSv1_3, v.TLSv1_3)),
            }

        seen = await trio.to_thread.run_sync(ask)
        for old in ("TLS 1.0", "TLS 1.1", "TLS 1.2, CBC with SHA-1", "TLS 1.2, CBC with SHA-384"):
            assert seen[old].startswith("refused"), seen
        assert seen["TLS 1.2, anything"].startswith("TLSv1.2 ECDHE-ECDSA-") and "GCM" in seen["TLS 1.2, anything"] \
            or "CHACHA20" in seen["TLS 1.2, anything"], seen
        assert seen["TLS 1.3"].startswith("TLSv1.3 "), seen

        ciphers = await trio.to_thread.run_sync(tls12_ciphers)
        accepted = [c for c in ciphers if await trio.to_thread.run_sync(s_client_accepts, port, c)]
        assert accepted, "s_client found no cipher at all: the probe is broken"
        weak = [c for c in accepted if not c.startswith("ECDHE-") or not ("GCM" in c or "CHACHA20" in c)]
        assert not weak, f"offered: {accepted}"
        assert set(accepted) <= {"ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-ECDSA-AES256-GCM-SHA384",
                                 "ECDHE-ECDSA-CHACHA20-POLY1305"}, accepted
        nursery.cancel_scope.cancel()
