"""`llmgw up` bound off loopback makes its CA silently and serves TLS on the admin API and /v1;
credentials.json names the CA file, and `llmgw ctl` uses it. On loopback (the README's way) both stay
plain HTTP (tests/e2e/test_up.py)."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support.processes import UpProcess

pytestmark = pytest.mark.slow


def test_up_bound_off_loopback_serves_tls_with_its_own_ca_and_ctl_uses_it(tmp_path: Path) -> None:
    up = UpProcess(tmp_path / "state", extra_args=["--host", "0.0.0.0"]).start()
    try:
        creds = up.credentials
        assert creds["admin_url"].startswith("https://") and creds["gateway_url"].startswith("https://"), creds
        ca_file = Path(creds["ca_file"])
        assert ca_file.is_file() and (ca_file.stat().st_mode & 0o077) == 0
        cluster = ssl.create_default_context(cafile=str(ca_file))
        gateway, admin = creds["gateway_url"], creds["admin_url"]
        assert "0.0.0.0" not in gateway + admin, "a wildcard is no address to reach it at"
        with httpx.Client(verify=cluster, headers={"authorization": f"Bearer {creds['client_key']}"}) as client:
            assert client.get(gateway + "/models").status_code == 200
        with pytest.raises(httpx.HTTPError):  # plain HTTP on the same port: no answer a client could take
            httpx.get(gateway.replace("https://", "http://") + "/models", timeout=5).raise_for_status()
        with pytest.raises(httpx.ConnectError):  # a client that does not trust the cluster's CA
            httpx.get(admin + "/health", verify=ssl.create_default_context(), timeout=5)
        # ctl finds the URL, the key and the CA in credentials.json
        done = subprocess.run([sys.executable, "-m", "llmgw", "ctl", "--state-dir", str(tmp_path / "state"),
                               "--json", "status"], capture_output=True, text=True, timeout=60,
                              env={k: v for k, v in os.environ.items() if k != "SSL_CERT_FILE"})
        assert done.returncode == 0, done.stderr
        assert "cluster" in json.loads(done.stdout)
    finally:
        up.stop()
