"""The tests' side of the cluster's trust (docs/security.md): one root CA for the whole test session,
and machines joined to process control planes with a join token, as an operator joins them.

`test_ca_root()` makes the session's root once (tests/conftest.py calls it before any test; a bench
script run on its own gets one at its first control process): LLMGW_TEST_CA_ROOT names its dir
(root.pem, root.key), every `llmgw control` the harness starts is given it (`--ca-root`), and
SSL_CERT_FILE names its root.pem, so that httpx here and every process the tests start (ctl, agents
and gateways without --ca-hash, sim-fleet) verify every test cluster's admin API like a site whose
root is in its machines' trust store.
"""

from __future__ import annotations

import atexit
import os
import shutil
import ssl
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from llmgw.trust import ca
from llmgw.trust.files import MachineFiles, write_private
from llmgw.trust.join import JoinRequest, client_context, ensure_credentials

ENV = "LLMGW_TEST_CA_ROOT"
TOKENS_PATH = "/api/v1/trust/tokens"


def test_ca_root() -> Path:
    """The session's root CA dir, made (and put in the environment) at the first call; a dir an outer
    run already named in LLMGW_TEST_CA_ROOT is used as it is."""
    given = os.environ.get(ENV)
    if given and (Path(given) / "root.pem").is_file() and (Path(given) / "root.key").is_file():
        root = Path(given)
    else:
        root = Path(tempfile.mkdtemp(prefix="llmgw-test-ca-"))
        atexit.register(shutil.rmtree, root, True)
        made = ca.make_root("tests", time.time())
        write_private(root / "root.key", made.key_pem)
        write_private(root / "root.pem", made.cert_pem)
        os.environ[ENV] = str(root)
    os.environ["SSL_CERT_FILE"] = str(root / "root.pem")
    return root


test_ca_root.__test__ = False  # type: ignore[attr-defined]  # not a test, whatever its name


def ca_root_args() -> list[str]:
    """What every `llmgw control` the tests start is given: the session's root (`--ca-root DIR`)."""
    return ["--ca-root", str(test_ca_root())]


def _token_request(role: str, name: str | None, ttl_s: float | None) -> dict[str, object]:
    body: dict[str, object] = {"role": role}
    if name:
        body["name"] = name
    if ttl_s is not None:
        body["ttl_s"] = ttl_s
    return body


def _answer(r: httpx.Response) -> dict[str, Any]:
    if r.status_code != 201:
        raise AssertionError(f"POST {TOKENS_PATH}: {r.status_code} {r.text}")
    doc: dict[str, Any] = r.json()
    return doc


def create_token(admin_url: str, admin_key: str, role: str, name: str | None = None, *, ttl_s: float | None = None,
                 wait_s: float = 0.0, proc: subprocess.Popen[Any] | None = None) -> dict[str, Any]:
    """A new join token for a `role` machine (named `name`, if given), made through the admin API with
    the admin key, as `llmgw ctl nodes token create` makes it: the answer ({"token", "ca_hash", "id",
    ...}). With `wait_s`, a control plane still starting (not listening yet, or no CA yet: 503) is
    asked again until then; `proc`: the control process, whose exit ends the wait at once."""
    deadline = time.monotonic() + wait_s
    while True:
        r: httpx.Response | None = None
        error: httpx.TransportError | None = None
        try:
            r = httpx.post(admin_url.rstrip("/") + TOKENS_PATH, json=_token_request(role, name, ttl_s), timeout=30,
                           headers={"Authorization": f"Bearer {admin_key}"})
        except httpx.TransportError as e:
            error = e
        if r is not None and r.status_code != 503:
            return _answer(r)
        if time.monotonic() > deadline or (proc is not None and proc.poll() is not None):
            if r is not None:
                return _answer(r)
            raise AssertionError(f"POST {admin_url}{TOKENS_PATH}: {error!r}") from error
        time.sleep(0.05)  # a retry of a start still under way, bounded by wait_s


def join_token(admin_url: str, admin_key: str, role: str, name: str | None = None, *, ttl_s: float | None = None,
               wait_s: float = 0.0, proc: subprocess.Popen[Any] | None = None) -> str:
    """`create_token`'s token alone."""
    token: str = create_token(admin_url, admin_key, role, name, ttl_s=ttl_s, wait_s=wait_s, proc=proc)["token"]
    return token


async def ajoin_token(admin_url: str, admin_key: str, role: str, name: str | None = None, *,
                      ttl_s: float | None = None) -> str:
    """`join_token` from a trio task (the loop keeps running while control answers)."""
    async with httpx.AsyncClient(timeout=30) as client:
        r = await client.post(admin_url.rstrip("/") + TOKENS_PATH, json=_token_request(role, name, ttl_s),
                              headers={"Authorization": f"Bearer {admin_key}"})
    token: str = _answer(r)["token"]
    return token


async def machine_tls(admin_url: str, admin_key: str, role: str, name: str, state_dir: Path) -> ssl.SSLContext:
    """The TLS context of an in-process agent or gateway (`AgentConfig.tls`, `GatewayConfig.tls`) against
    process control planes: a certificate got once with a join token (kept in STATE_DIR/tls, as a
    machine keeps it; a second call with the same dir uses it)."""
    files = MachineFiles.of(state_dir)
    token = None if files.complete() else await ajoin_token(admin_url, admin_key, role, name)
    await ensure_credentials(files, [admin_url], JoinRequest(role, name, token))
    return client_context(files)


def offline_credentials(state_dir: Path, role: str, name: str, hosts: tuple[str, ...] = ("127.0.0.1",)) -> MachineFiles:
    """STATE_DIR/tls as a machine that joined earlier holds it, made here from the session's root (an
    intermediate of its own, no control plane): for a start that must get past its credential
    without a cluster (a busy port, a refused flag). No cluster of the tests accepts it."""
    root_dir = test_ca_root()
    now = time.time()
    root = ca.Issued((root_dir / "root.pem").read_text(), (root_dir / "root.key").read_text())
    inter = ca.make_intermediate(root, now)
    files = MachineFiles.of(state_dir)
    cert = ca.sign_request(ca.make_request(files.key_pem(), role, name), inter, role=role, name=name, hosts=hosts,
                           now=now)
    files.write(cert + inter.cert_pem, root.cert_pem + inter.cert_pem)
    return files
