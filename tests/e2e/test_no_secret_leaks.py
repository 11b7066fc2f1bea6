"""No secret leaks (issue 20): distinctive secrets are planted in a running cluster (`llmgw up --tls` and a
`llmgw gateway` joined to it with a join token) and looked for everywhere an operator or an attacker who
reads logs, state files, metrics, error bodies or console pages would see them: 0 hits.

The secrets: up's admin key and client key (LLMGW_ADMIN_KEY / LLMGW_CLIENT_KEY), a client key made through
the admin API, the join token, a wrong key that was sent, a prompt, the cluster secret, the root CA's key,
the intermediate's key (unsealed here from the sealed copy in the Raft journal) and both machines' keys.
Each is looked for as it is, and in its URL-encoded and base64 forms (a key: its private scalar in hex and
base64, the first line of its PEM body, and any PEM private key at all).

Where a secret lives by design, and so is not searched: its own store. cluster.secret holds the cluster
secret, ca/root.key the root key, tls/key.pem a machine's key, and credentials.json up's admin and client
keys (the file `llmgw up` writes for its operator, 0600, checked here).
"""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import signal
import ssl
import stat
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from urllib.parse import quote, quote_plus

import httpx
import pytest

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from llmgw.trust import ca
from tests.support.processes import UpProcess, free_port

pytestmark = pytest.mark.slow

MODEL = "leak-sim"
CATALOG = f"""
[[models]]
name = "{MODEL}"
engine = "sim"
role = "chat"
source = "sim://{MODEL}"
mode = "always"
replicas = {{ min = 1, max = 1 }}
"""
FERNET = re.compile(rb"gAAAAA[A-Za-z0-9_\-]{40,}={0,2}")  # a sealed intermediate key, as the journal holds it


def canary(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


class Gateway:
    """`llmgw gateway` as a process: every line it prints kept, its ready line waited on."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.output: list[str] = []
        self.proc = subprocess.Popen([sys.executable, "-m", "llmgw", "gateway", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, env={**os.environ, **env})
        self.ready = threading.Event()
        self.pump = threading.Thread(target=self._pump, daemon=True)
        self.pump.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)
            if line.startswith("llmgw gateway ready"):
                self.ready.set()

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready.wait(0.1):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("llmgw gateway did not become ready:\n" + "".join(self.output[-40:]))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.pump.join(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def b64_forms(raw: bytes) -> set[str]:
    """`raw` base64-encoded (standard and URL-safe) inside any longer text: for each of the three offsets it can
    start at within a 3-byte group, the characters that its bytes alone decide."""
    found = set()
    for pad in range(3):
        data = b"\0" * pad + raw
        full = len(data) // 3
        for enc in (base64.b64encode, base64.urlsafe_b64encode):
            middle = enc(data[:full * 3]).decode()[(4 if pad else 0):]
            if len(middle) >= 16:
                found.add(middle)
    return found


def forms(secret: str) -> set[str]:
    """`secret` as it is, URL-encoded, and base64-encoded."""
    return {secret, quote(secret, safe=""), quote_plus(secret)} | b64_forms(secret.encode())


def key_forms(pem: str) -> set[str]:
    """A private key's secret part, the EC scalar, in hex and base64, and the first line of its PEM body (the
    scalar's first bytes). Not the whole body: its last lines are the public key, which certificates show."""
    key = serialization.load_pem_private_key(pem.encode(), None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    scalar = key.private_numbers().private_value.to_bytes(32, "big")
    body = [ln for ln in pem.splitlines() if ln and not ln.startswith("-----")]
    return {scalar.hex(), body[0]} | b64_forms(scalar)


def hits(needles: dict[str, set[str]], sources: dict[str, bytes]) -> list[str]:
    """Where each secret was found: `secret (form) in source, line N: ...`."""
    out = []
    for source, data in sources.items():
        for name, variants in needles.items():
            for v in variants:
                if v.encode() in data:
                    for n, line in enumerate(data.splitlines(), 1):
                        if v.encode() in line:
                            out.append(f"{name} ({v[:12]}...) in {source}, line {n}: {line[:200]!r}")
    return out


def test_no_secret_leaks(tmp_path: Path) -> None:
    admin_key = canary("sk-llmgw-admin-LEAKCANARY-")
    client_key = canary("sk-llmgw-LEAKCANARY-")
    wrong_key = canary("sk-llmgw-WRONGKEYCANARY-")
    wrong_token = canary("llmgw-join-WRONGTOKENCANARY")
    prompt_word = canary("PROMPTCANARY")
    prompt = f"please repeat {prompt_word} back to me"
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(CATALOG)
    up_dir, gw_dir = tmp_path / "up", tmp_path / "gw"
    up = UpProcess(up_dir, env={"LLMGW_ADMIN_KEY": admin_key, "LLMGW_CLIENT_KEY": client_key},
                   extra_args=["--tls", "--catalog", str(catalog), "--log-level", "debug"])
    gateway: Gateway | None = None
    bodies: dict[str, bytes] = {}  # every error body, console page and API answer searched
    clients = ExitStack()
    try:
        up.start(timeout=60)
        creds = up.credentials
        assert creds["admin_url"].startswith("https://") and creds["admin_key"] == admin_key
        assert stat.S_IMODE((up_dir / "credentials.json").stat().st_mode) == 0o600
        tls = ssl.create_default_context(cafile=creds["ca_file"])
        admin = clients.enter_context(httpx.Client(base_url=creds["admin_url"], verify=tls, timeout=30,
                                                   headers={"Authorization": f"Bearer {admin_key}"}))
        up_gw = clients.enter_context(httpx.Client(base_url=creds["gateway_url"].removesuffix("/v1"), timeout=30))

        def keep(where: str, r: httpx.Response) -> httpx.Response:
            bodies[where] = r.content + b"\n" + "\n".join(f"{k}: {v}" for k, v in r.headers.items()).encode()
            return r

        made = keep("POST /api/v1/keys", admin.post("/api/v1/keys", json={"name": "leak-test"}))
        assert made.status_code == 201, made.text
        made_key = made.json()["key"]
        del bodies["POST /api/v1/keys"]  # the one answer that shows the new key, by design
        tok = admin.post("/api/v1/trust/tokens", json={"role": "gateway", "name": "gw1"})
        assert tok.status_code == 201, tok.text
        join_token = tok.json()["token"]

        gw_port = free_port()
        gateway = Gateway(["--control", creds["admin_url"], "--ca-file", creds["ca_file"], "--state-dir", str(gw_dir),
                           "--listen", f"127.0.0.1:{gw_port}", "--name", "gw1", "--log-level", "debug"],
                          {"LLMGW_JOIN_TOKEN": join_token})  # in the environment, off the process list
        gateway.wait_ready(45)
        joined = clients.enter_context(httpx.Client(base_url=f"http://127.0.0.1:{gw_port}", timeout=30))

        def chat(client: httpx.Client, key: str, **extra: object) -> httpx.Response:
            return client.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                               json={"model": MODEL, "messages": [{"role": "user", "content": prompt}], **extra})

        for name, client in (("up gateway", up_gw), ("joined gateway", joined)):
            deadline = time.monotonic() + 30  # the replica starting, the joined gateway's table arriving
            while (r := chat(client, client_key)).status_code != 200:
                assert time.monotonic() < deadline, f"{name}: {r.status_code} {r.text}"
                time.sleep(0.1)
            assert prompt_word in r.json()["choices"][0]["message"]["content"]  # the sim echoes it
            answer = r.content
            assert chat(client, made_key).status_code == 200
            assert chat(client, made_key, stream=True).status_code == 200
            # Requests that fail: each error body is searched.
            def post(key: str, body: object) -> httpx.Response:
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                return client.post("/v1/chat/completions", content=data, headers={
                    "Authorization": f"Bearer {key}", "Content-Type": "application/json"})

            malformed = f'{{"model": "{MODEL}", "messages": [{{"role": "user", "content": "{prompt}"'
            failed = [
                (401, keep(f"{name}: wrong key", chat(client, wrong_key))),
                (401, keep(f"{name}: admin key on /v1", chat(client, admin_key))),
                (404, keep(f"{name}: bad model", post(client_key, {
                    "model": "no-such-model", "messages": [{"role": "user", "content": prompt}]}))),
                (400, keep(f"{name}: malformed body", post(client_key, malformed.encode()))),
                (400, keep(f"{name}: bad field", post(made_key, {"model": MODEL, "messages": prompt}))),
            ]
            for status, refused in failed:
                assert refused.status_code == status and "error" in refused.json(), (name, status, refused.text)
        keep("admin API: wrong key", admin.get("/api/v1/status", headers={"Authorization": f"Bearer {wrong_key}"}))
        keep("admin API: client key", admin.get("/api/v1/keys", headers={"Authorization": f"Bearer {client_key}"}))
        for where, token in (("join: the used token again", join_token), ("join: a wrong token", wrong_token)):
            r = keep(where, admin.post("/api/v1/trust/join", json={
                "token": token, "role": "gateway", "name": "gw2",
                "csr": ca.make_request(ca.new_key_pem(), "gateway", "gw2")}))
            assert r.status_code == 403 and r.json()["error"]["code"] == "invalid_join_token", r.text

        # The request log: every answered request is there (by key id, never its prompt).
        deadline = time.monotonic() + 15
        while True:
            doc = (r := admin.get("/api/v1/requests", params={"limit": "200"})).json()
            if len(doc.get("gateways", {}).get("answered", [])) == 2 and len(doc.get("requests", [])) >= 10:
                break
            assert time.monotonic() < deadline, r.text
            time.sleep(0.2)
        for record in r.json()["requests"][:4]:
            keep(f"GET /api/v1/requests/{record['id']}", admin.get(f"/api/v1/requests/{record['id']}"))
        for api_path in ("/api/v1/status", "/api/v1/keys", "/api/v1/requests?limit=200", "/api/v1/usage",
                         "/api/v1/trust/tokens", "/api/v1/trust/machines", "/api/v1/trust/ca", "/api/v1/models",
                         f"/api/v1/models/{MODEL}", "/api/v1/nodes", "/api/v1/settings", "/api/v1/cluster/members",
                         "/api/v1/guard/policies", "/api/v1/notify/status", "/metrics", "/health"):
            keep(f"admin GET {api_path}", admin.get(api_path))
        for name, client in (("up gateway", up_gw), ("joined gateway", joined)):
            for api_path in ("/metrics", "/health"):
                keep(f"{name} GET {api_path}", client.get(api_path))

        # The console, signed in with the admin key (and a sign-in refused for a wrong key first).
        console = clients.enter_context(httpx.Client(base_url=creds["admin_url"], verify=tls, timeout=30))
        form = console.get("/signin")
        csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
        assert csrf, form.text
        keep("console: wrong key sign-in", console.post("/signin", data={"csrf": csrf.group(1), "key": wrong_key}))
        form = console.get("/signin")
        csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
        assert csrf
        signed = console.post("/signin", data={"csrf": csrf.group(1), "key": admin_key})
        assert signed.status_code == 303, signed.text
        assert admin_key not in "".join(f"{c.name}={c.value}" for c in console.cookies.jar)
        nodes = [n["node"] for n in admin.get("/api/v1/nodes").json()["nodes"]]
        pages = ["/", "/nodes", *(f"/nodes/{n}" for n in nodes), "/models", f"/models/{MODEL}", "/requests",
                 "/guardrails", "/settings", "/do", "/console/static/console.js"]
        for page in pages:
            r = keep(f"console {page}", console.get(page))
            assert r.status_code == 200, (page, r.text[:300])
        assert len(nodes) >= 1 and "<table" in bodies["console /requests"].decode()

        # The CA's and machines' keys, read from their own stores; the intermediate's from the journal.
        cluster_secret = (up_dir / "cluster.secret").read_text().strip()
        root_key = (up_dir / "ca" / "root.key").read_text()
        intermediates = []
        for file in (up_dir / "raft").rglob("*"):
            if file.is_file():
                for sealed in FERNET.findall(file.read_bytes()):
                    try:
                        intermediates.append(ca.unseal(sealed.decode(), cluster_secret))
                    except ca.CaError:
                        pass
        assert intermediates, "the intermediate's sealed key is in the journal"
        machine_keys = {"up's machine key": (up_dir / "tls" / "key.pem").read_text(),
                        "the gateway's machine key": (gw_dir / "tls" / "key.pem").read_text()}
    finally:
        clients.close()
        if gateway is not None:
            gateway.stop()
        if up.proc is not None and up.proc.poll() is None:
            up.stop(timeout=20)
        up.kill()

    # Every line the processes printed, and every file of both state dirs but each secret's own store.
    own_stores = {up_dir / "credentials.json", up_dir / "cluster.secret", up_dir / "ca" / "root.key",
                  up_dir / "tls" / "key.pem", gw_dir / "tls" / "key.pem"}
    assert gateway is not None
    sources = {"up's output": "".join(up.output).encode(), "the gateway's output": "".join(gateway.output).encode()}
    for root in (up_dir, gw_dir):
        for file in sorted(root.rglob("*")):
            if file.is_file() and file not in own_stores:
                sources[str(file.relative_to(tmp_path))] = file.read_bytes()
    sources.update(bodies)
    assert any("logs" in s for s in sources) and any("requests" in s for s in sources), sorted(sources)

    needles: dict[str, set[str]] = {
        "admin key": forms(admin_key) | forms(admin_key.rpartition("-")[2]),
        "client key": forms(client_key) | forms(client_key.rpartition("-")[2]),
        "created client key": forms(made_key) | forms(made_key.removeprefix("sk-llmgw-")),
        "wrong key": forms(wrong_key) | forms(wrong_key.rpartition("-")[2]),
        "join token": forms(join_token) | forms(join_token.removeprefix("llmgw-join-")),
        "wrong join token": forms(wrong_token) | forms(wrong_token.removeprefix("llmgw-join-WRONGTOKENCANARY")),
        "prompt": forms(prompt_word) | forms(prompt),
        "cluster secret": forms(cluster_secret),
        "root CA key": key_forms(root_key),
        **{f"intermediate CA key {i}": key_forms(k) for i, k in enumerate(intermediates)},
        **{name: key_forms(k) for name, k in machine_keys.items()},
        "a private key in PEM": {"PRIVATE KEY-----"},
    }
    assert all(needles.values())
    # The search finds what it looks for: each store holds its own secret, and a chat's answer (the sim
    # echoes its prompt) holds the prompt.
    stores = {str(p.relative_to(tmp_path)): p.read_bytes() for p in own_stores} | {"a chat's answer": answer}
    seen = {h.split(" (", 1)[0] for h in hits(needles, stores)}
    assert seen == {"admin key", "client key", "cluster secret", "root CA key", "prompt", "a private key in PEM",
                    *machine_keys}, seen
    found = hits(needles, sources)
    assert not found, f"{len(found)} secret(s) found where none may be:\n" + "\n".join(found)
