"""`llmgw init` as an operator runs it on a fresh machine (the built-in supervisor; real processes on
loopback): every step said, the first admin key shown once and kept nowhere (only its hash, until the
group holds it), the control plane answering over TLS with it; a second run changes nothing and says so
step by step; and its faults: a port taken (it says the control plane did not answer, and why to look),
bad flags refused before anything is made."""

from __future__ import annotations

import json
import os
import re
import signal
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.processes import free_port

pytestmark = pytest.mark.slow


class Site:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.state = root / "state"
        self.services = root / "services"
        self.raft, self.admin = free_port(), free_port()
        self.env = {**os.environ, "LLMGW_SERVICE_DIR": str(self.services),
                    "LLMGW_TIMEOUTS": "init_ready_s=30,service_restart_first_s=0.2"}

    def init(self, *extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "llmgw", "init", "--state-dir", str(self.state),
                               "--raft-addr", f"127.0.0.1:{self.raft}", "--admin-addr", f"127.0.0.1:{self.admin}",
                               "--manager", "builtin", *extra], capture_output=True, text=True, env=self.env,
                              timeout=180)

    def stop(self) -> None:
        subprocess.run([sys.executable, "-m", "llmgw", "service", "stop", "--manager", "builtin"],
                       capture_output=True, env=self.env, timeout=120)
        state = self.services / "control.state.json"
        if state.exists():
            for pid in (json.loads(state.read_text()).get(k) for k in ("pid", "supervisor_pid")):
                if isinstance(pid, int):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    s = Site(tmp_path)
    yield s
    s.stop()


def steps(out: str) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in re.finditer(r"(?m)^(state dir|cluster secret|admin key|service|started|"
                                                       r"answering|credentials)\s+(.*)$", out)}


def every_file(root: Path) -> Iterator[Path]:
    for path in root.rglob("*"):
        if path.is_file():
            yield path


def test_init_makes_the_first_control_plane_then_changes_nothing(site: Site) -> None:
    r = site.init()
    assert r.returncode == 0, r.stdout + r.stderr
    said = steps(r.stdout)
    assert said["state dir"].endswith("made (0700)") and said["cluster secret"].endswith("made (0600)")
    assert said["admin key"].startswith("made; shown once") and said["service"].startswith("control: installed")
    assert said["started"].startswith("control: running") and "answers over TLS" in said["answering"]
    key = re.search(r"(?m)^    (sk-llmgw-\S+)$", r.stdout)
    assert key, r.stdout
    admin = key.group(1)
    ca = site.state / "tls" / "ca.pem"
    url = f"https://127.0.0.1:{site.admin}"
    r2 = httpx.get(url + "/api/v1/keys", headers={"authorization": f"Bearer {admin}"}, verify=ssl.create_default_context(cafile=str(ca)))
    assert r2.status_code == 200, r2.text  # the key shown is the cluster's admin key
    assert not (site.state / "first-admin-key.json").exists()  # the hash went once the group held it
    for path in [*every_file(site.state), *every_file(site.services)]:
        assert admin.encode() not in path.read_bytes(), f"the admin key is written in {path}"
    creds = json.loads((site.state / "credentials.json").read_text())
    assert creds == {"admin_url": url, "ca_file": str(ca)}
    assert (site.state / "credentials.json").stat().st_mode & 0o777 == 0o600
    ctl = subprocess.run([sys.executable, "-m", "llmgw", "ctl", "status", "--state-dir", str(site.state),
                          "--key", admin], capture_output=True, text=True, timeout=60)
    assert ctl.returncode == 0, ctl.stdout + ctl.stderr  # ctl finds the URL and the CA from credentials.json

    pid = json.loads((site.services / "control.state.json").read_text())["pid"]
    again = site.init()
    assert again.returncode == 0, again.stdout + again.stderr
    said = steps(again.stdout)
    assert said == {
        "state dir": f"{site.state}: exists, kept",
        "cluster secret": f"{site.state / 'cluster.secret'}: present, kept",
        "admin key": "the group has started before: no key made (`llmgw ctl keys create` makes more)",
        "service": f"control: installed as asked, unchanged ({site.services})",
        "started": f"control: running already (pid {pid}, builtin)",
        "answering": f"{url}: the admin API answers over TLS (CA {ca})",
        "credentials": f"{site.state / 'credentials.json'}: unchanged",
    }
    assert "sk-llmgw-" not in again.stdout
    assert json.loads((site.services / "control.state.json").read_text())["pid"] == pid


def test_a_taken_admin_port_is_said_and_where_to_look(site: Site) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", site.admin))
        taken.listen()
        site.env["LLMGW_TIMEOUTS"] = "init_ready_s=3,service_restart_first_s=0.2"
        r = site.init()
    assert r.returncode == 1, r.stdout + r.stderr
    assert "did not answer" in r.stderr and "llmgw service status control" in r.stderr
    assert "sk-llmgw-" not in r.stdout  # no key shown for a cluster that did not start


def test_bad_flags_are_refused_before_anything_is_made(site: Site) -> None:
    r = subprocess.run([sys.executable, "-m", "llmgw", "init", "--state-dir", str(site.state), "--raft-addr",
                        "127.0.0.1:1", "--admin-addr", "127.0.0.1:2", "--manager", "nope"],
                       capture_output=True, text=True, env=site.env, timeout=60)
    assert r.returncode != 0 and not site.state.exists() and not site.services.exists()
