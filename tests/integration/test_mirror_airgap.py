"""An air-gapped site, proven (issue 24 point 7): a control plane, a gateway and an agent as real processes in
network namespaces (tests/support/netns.py) with no route anywhere but to each other (no default route; a connect
to an outside address fails from inside each), the agent's storage empty. A tiny GGUF goes into the mirror with
`llmgw ctl mirror add`, `llmgw ctl model serve --source mirror://...` serves it, and llama.cpp answers a chat
completion through the gateway: the only copy of the file it could load came over the site's own link.

The second test cuts a fetch halfway: the link to the agent throttled (`tc`), the agent SIGKILLed once its
`.part` holds some of the file and the operator's model status says `fetching` with bytes; restarted (the link
whole again), it goes on from what the `.part` holds (the bytes that crossed the link after the restart are
fewer than the file: a fetch from 0 would need them all), verifies, and the engine answers.

One namespace fabric and one set of processes for both (module fixture). Skips, with the reason, where network
namespaces are not permitted."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from tests.support.netns import Fabric, Host, NetnsRefused, thread_in_own_netns
from tests.support.trust import ca_root_args, join_token

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("xllamacpp") is None, reason="the llamacpp extra is not installed"),
    pytest.mark.skipif(importlib.util.find_spec("gguf") is None, reason="the gguf package (test extra) is missing"),
]

ADMIN, CLIENT = "sk-airgap-admin", "sk-airgap-client"
OUTSIDE = "10.255.255.1"  # no route to it from inside the site
T = TypeVar("T")


@dataclass
class Proc:
    name: str
    argv: list[str]
    log: Path
    wrap: list[str]
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen([*self.wrap, sys.executable, "-m", "llmgw", *self.argv], stdout=out,
                                         stderr=subprocess.STDOUT, env={**os.environ, **self.env})

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()


@dataclass
class Site:
    root: Path
    control: Host
    worker: Host
    procs: list[Proc]
    agent: Proc
    url: str  # the control plane's admin API
    gateway: str
    cache: Path  # the agent's mirror cache

    def said(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.log.read_text(errors='replace')[-3000:]}" for p in self.procs
                         if p.log.exists())

    def wait_for(self, what: str, probe: Callable[[], T | None], timeout: float = 60.0) -> T:
        """Poll `probe` until it returns something; the bound only ends a hang (each wait ends on its condition)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                found = probe()
            except httpx.HTTPError:
                found = None
            if found is not None and found is not False:
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not within {timeout:g} s\n{self.said()}")
            time.sleep(0.05)

    def api(self, method: str, path: str, **kw: Any) -> httpx.Response:
        return httpx.request(method, self.url + path, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10, **kw)

    def ctl(self, *argv: str) -> str:
        done = subprocess.run([sys.executable, "-m", "llmgw", "ctl", *argv], capture_output=True, text=True,
                              timeout=120, env={**os.environ, "LLMGW_URL": self.url, "LLMGW_KEY": ADMIN})
        assert done.returncode == 0, f"ctl {' '.join(argv)}: {done.stdout}\n{done.stderr}"
        return done.stdout + done.stderr

    def model(self, name: str) -> dict[str, Any]:
        r = self.api("GET", f"/api/v1/models/{name}")
        assert r.status_code == 200, r.text
        doc: dict[str, Any] = r.json()["model"]
        return doc

    def ready(self, name: str) -> bool:
        status = self.model(name).get("status") or {}
        return any(r.get("state") == "ready" for r in status.get("replicas", ()))

    def chat(self, model: str) -> dict[str, Any]:
        r = httpx.post(f"{self.gateway}/v1/chat/completions", timeout=60,
                       headers={"Authorization": f"Bearer {CLIENT}"},
                       json={"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": "hello"}]})
        assert r.status_code == 200, f"{r.status_code} {r.text}\n{self.said()}"
        answer: dict[str, Any] = r.json()
        return answer


def cut_off(host: Host) -> str:
    """How a connect to an outside address from inside `host`'s namespace fails (an AssertionError if it does not)."""
    probe = (f"import socket\ns = socket.socket()\ns.settimeout(3)\n"
             f"try:\n    s.connect(({OUTSIDE!r}, 80))\nexcept OSError as e:\n    print(type(e).__name__, e)\n"
             f"else:\n    print('CONNECTED')\n")
    done = subprocess.run([*host.wrap, sys.executable, "-c", probe], capture_output=True, text=True, timeout=30)
    words = done.stdout.strip()
    assert done.returncode == 0 and words and "CONNECTED" not in words, f"{host.address}: {words} {done.stderr}"
    return words


def tx_bytes(dev: str) -> int:
    """Bytes the hub sent on `dev` (its side of a member's veth: everything that member received)."""
    done = subprocess.run(["ip", "-j", "-s", "link", "show", "dev", dev], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return int(json.loads(done.stdout)[0]["stats64"]["tx"]["bytes"])


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    if shutil.which("tc") is None or shutil.which("nsenter") is None:
        pytest.skip("needs tc and nsenter (iproute2, util-linux)")
    root = tmp_path_factory.mktemp("airgap")
    try:
        netns = thread_in_own_netns()
        netns.__enter__()
    except NetnsRefused as e:
        pytest.skip(str(e))
    procs: list[Proc] = []
    fabric = Fabric()
    try:
        control, worker = fabric.host(1), fabric.host(2)
        for h in (control, worker):
            fabric.seal(h.number)
        url = f"https://{control.address}:8000"
        member = Proc("control", ["control", "--state-dir", str(root / "control"), "--raft-addr",
                                  f"{control.address}:7000", "--admin-addr", f"{control.address}:8000",
                                  *ca_root_args()], root / "control.log", control.wrap,
                      env={"LLMGW_ADMIN_KEY": ADMIN, "LLMGW_CLIENT_KEY": CLIENT})
        procs.append(member)
        member.start()
        gateway = Proc("gateway", ["gateway", "--control", url, "--listen", f"{control.address}:9000",
                                   "--name", "gw-1", "--state-dir", str(root / "gateway")],
                       root / "gateway.log", control.wrap)
        agent = Proc("agent", ["agent", "--control", url, "--state-dir", str(root / "agent"), "--node", "n1",
                               "--engine-host", worker.address, "--mirror-cache", str(root / "agent" / "mirror-cache"),
                               "--stop-engines-on-exit"], root / "agent.log", worker.wrap)
        procs += [gateway, agent]
        s = Site(root, control, worker, procs, agent, url, f"https://{control.address}:9000",
                 root / "agent" / "mirror-cache")
        for proc, role, name in ((agent, "agent", "n1"), (gateway, "gateway", "gw-1")):
            try:
                proc.argv += ["--join-token", join_token(url, ADMIN, role, name, wait_s=60, proc=member.proc)]
            except AssertionError as e:
                raise AssertionError(f"{e}\n{s.said()}") from None
            proc.start()
        yield s
    finally:
        for p in reversed(procs):
            p.stop()
        fabric.close()
        netns.__exit__(None, None, None)


def test_an_air_gapped_site_serves_its_first_model_from_the_mirror(site: Site, tmp_path: Path) -> None:
    from tests.support.tiny_gguf import write_tiny_llama

    # Cut off: from inside, nothing outside the site answers, and the routes say why.
    for h in (site.control, site.worker):
        assert "unreachable" in cut_off(h).lower()
    # The agent holds no model file: its storage is empty, the file is only in the control plane's mirror.
    assert not site.cache.exists() or not any(site.cache.iterdir())
    file = write_tiny_llama(tmp_path / "tiny.gguf")
    sha = hashlib.sha256(file.read_bytes()).hexdigest()
    site.ctl("mirror", "add", str(file), "--name", "tiny.gguf")
    assert (site.root / "control" / "mirror" / "blobs" / sha).is_file()
    site.ctl("model", "serve", "--name", "tiny", "--engine", "llama.cpp", "--source", "mirror://tiny.gguf",
             "--cpu", "--min", "1")
    site.wait_for("the model ready", lambda: site.ready("tiny"), 120)
    answer = site.chat("tiny")
    assert answer["choices"][0]["message"]["content"], answer
    # What the engine loaded is the agent's verified copy, fetched over the site's link.
    assert hashlib.sha256((site.cache / sha).read_bytes()).hexdigest() == sha


def test_a_fetch_cut_halfway_resumes_from_what_it_holds_and_verifies(site: Site, tmp_path: Path) -> None:
    from tests.support.tiny_gguf import write_tiny_llama

    file = write_tiny_llama(tmp_path / "big.gguf", seed=1, pad_bytes=3 << 20)
    size = file.stat().st_size
    sha = hashlib.sha256(file.read_bytes()).hexdigest()
    site.ctl("mirror", "add", str(file), "--name", "big.gguf")
    veth = f"h{site.worker.number}"  # the hub's side of the agent's link: what the agent receives leaves here
    subprocess.run(["tc", "qdisc", "add", "dev", veth, "root", "tbf", "rate", "4mbit", "burst", "32kb",
                    "latency", "2s"], check=True, timeout=30)
    part = site.cache / f"{sha}.part"
    seen: list[dict[str, Any]] = []

    def halfway() -> bool:
        activation = (site.model("big").get("status") or {}).get("activation") or {}
        if activation.get("phase") == "fetching" and (activation.get("bytes_done") or 0) > 0:
            seen.append(activation)
        held = part.stat().st_size if part.exists() else 0
        return bool(seen) and 0 < held < size

    try:
        site.ctl("model", "serve", "--name", "big", "--engine", "llama.cpp", "--source", "mirror://big.gguf",
                 "--cpu", "--min", "1")
        site.wait_for("the fetch halfway, the operator shown its progress", halfway, 120)
        site.agent.kill()
    finally:
        subprocess.run(["tc", "qdisc", "del", "dev", veth, "root"], timeout=30)
    held = part.stat().st_size
    assert 0 < held < size
    # The operator saw the fetch: its phase, bytes and total (what ctl status and the console show).
    assert seen[-1]["bytes_total"] == size and 0 < seen[-1]["bytes_done"] <= size, seen[-1]
    before = tx_bytes(veth)
    site.agent.start()
    site.wait_for("the model ready after the cut", lambda: site.ready("big"), 120)
    after = tx_bytes(veth) - before
    # Resumed: what crossed the link after the restart is about what the .part lacked (and the agent's stream),
    # not the whole file again.
    assert after < size - held // 2, (after, size, held)
    assert not part.exists() and hashlib.sha256((site.cache / sha).read_bytes()).hexdigest() == sha
    assert site.chat("big")["choices"][0]["message"]["content"]
