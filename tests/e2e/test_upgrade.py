"""`llmgw ctl upgrade`: a cluster of real processes run from a zipapp (three control planes, an agent with a sim
engine, a remote gateway) upgraded to a second build that differs in version and in one new command type
(`tests/support/releases.py`), under a client load through the gateway that sees no failed request; each
machine then reports the new file's hash (the gateway restarted in place: the same pid, a new start), the replica
and its engine are the same, and the new command type is accepted once the group's store level rose. Then: an
upload cut short changes nothing, a gateway asked for a rollback it cannot do refuses with the reason and
changes nothing, the file already running skips every machine, `--rollback` returns the gateway and the agent to
the old file, and a machine that does not come back in its time stops the run with the reason, the rest left as
they were."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.e2e.test_zipapp import bare_python
from tests.support.cluster import Cluster
from tests.support.processes import children_of, free_port, kill_engines_under, until
from tests.support.releases import NEW_OP, build_zipapp, newer_tree
from tests.support.trust import join_token

pytestmark = pytest.mark.slow

ADMIN, CLIENT = "sk-upgrade-admin", "sk-upgrade-client"
@pytest.fixture(scope="session")
def zipapps(runtime_zipapp: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """This tree's zipapp (the session's) and the next release's (version `+next`, one store level up, one new
    command type), each built once for the session, without llama.cpp."""
    tree = tmp_path_factory.mktemp("next-tree")
    newer_tree(tree)
    return runtime_zipapp, build_zipapp(tree, tmp_path_factory.mktemp("releases") / "new.pyz")


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class Machines:
    """Three control planes (`tests/support/cluster.py`), an agent and a gateway, each `python llmgw.pyz ROLE ...`
    from `bin/llmgw.pyz` (a copy of the old zipapp): what a machine runs, with a Python that has nothing else."""

    def __init__(self, root: Path, pyz: Path) -> None:
        self.root = root
        self.pyz = pyz
        self.env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(root), "SHIV_ROOT": str(root / "shiv"),
                    "PYTHONDONTWRITEBYTECODE": "1"}
        self.group = Cluster(root, 3, admin_key=ADMIN)
        for m in self.group.members:
            m.pyz, m.python, m.env = pyz, bare_python(), {**self.env, "LLMGW_CLIENT_KEY": CLIENT}
        self.gw_port = free_port()
        self.gateway_url = f"http://127.0.0.1:{self.gw_port}/v1"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def urls(self) -> list[str]:
        return [m.url for m in self.group.members]

    def start(self, name: str, args: list[str]) -> None:
        # The session's test CA (SSL_CERT_FILE, set by ca_root_args): how a joining machine trusts the control plane.
        trust = {k: os.environ[k] for k in ("SSL_CERT_FILE",) if k in os.environ}
        with (self.root / f"{name}.log").open("ab") as out:
            self.procs[name] = subprocess.Popen([bare_python(), str(self.pyz), *args], stdout=out,
                                                stderr=subprocess.STDOUT, env={**self.env, **trust})

    def ca(self) -> str:
        return str(self.group.members[0].state_dir / "tls" / "ca.pem")

    def api(self, url: str | None = None) -> httpx.Client:
        return httpx.Client(base_url=url or self.urls[0], headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30,
                            verify=ssl.create_default_context(cafile=self.ca()))

    def ctl(self, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "llmgw", "ctl", "--url", self.urls[0], "--key", ADMIN,
                               "--ca-file", self.ca(), *argv], capture_output=True, text=True, timeout=1800,
                              env={**os.environ, **(env or {})})

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in self.root.glob("*.log"))


@pytest.fixture
def machines(tmp_path: Path, zipapps: tuple[Path, Path]) -> Iterator[Machines]:
    (tmp_path / "bin").mkdir()
    pyz = tmp_path / "bin" / "llmgw.pyz"
    shutil.copy2(zipapps[0], pyz)
    c = Machines(tmp_path, pyz)
    try:
        trio.run(c.group.start, 180.0)
        controls = [a for url in c.urls for a in ("--control", url)]
        tokens = {role: join_token(c.urls[0], ADMIN, role, name, wait_s=120)
                  for role, name in (("agent", "worker-1"), ("gateway", "gw-1"))}
        c.start("agent", ["agent", *controls, "--state-dir", str(tmp_path / "agent"), "--node", "worker-1",
                          "--join-token", tokens["agent"]])
        c.start("gateway", ["gateway", *controls, "--listen", f"127.0.0.1:{c.gw_port}", "--state-dir",
                            str(tmp_path / "gateway"), "--name", "gw-1", "--join-token", tokens["gateway"]])
        yield c
    finally:
        for p in c.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in c.procs.values():
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        c.group.close()
        kill_engines_under(tmp_path)


class Load:
    """A client of the gateway throughout: every answer counted, every failure kept."""

    def __init__(self, gateway_url: str) -> None:
        self.url = gateway_url + "/chat/completions"
        self.answered = 0
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        body = {"model": "demo", "messages": [{"role": "user", "content": "during the upgrade"}]}
        with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {CLIENT}"}) as c:
            while not self._stop.is_set():
                try:
                    r = c.post(self.url, json=body)
                    if r.status_code == 200:
                        self.answered += 1
                    else:
                        self.failed.append(f"{r.status_code} {r.text[:200]}")
                except httpx.HTTPError as e:
                    self.failed.append(repr(e))
                time.sleep(0.02)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)


def node(api: httpx.Client) -> dict[str, Any] | None:
    return next((n for n in api.get("/api/v1/nodes").json()["nodes"] if n["node"] == "worker-1"), None)


def gateway(api: httpx.Client) -> dict[str, Any]:
    found = [g for g in api.get("/api/v1/gateways").json()["gateways"] if g["name"] == "gw-1"]
    assert len(found) == 1, found
    return dict(found[0])


def serves(gateway_url: str) -> bool:
    """A chat completion through the gateway answered; False while its port takes no connection yet (a gateway holds
    its port from the start and opens it once it has its table from control: on a busy machine, after the replica
    is ready)."""
    try:
        return httpx.post(gateway_url + "/chat/completions", headers={"Authorization": f"Bearer {CLIENT}"}, timeout=30,
                          json={"model": "demo", "messages": [{"role": "user", "content": "hi"}]}).status_code == 200
    except httpx.ConnectError:
        return False


def test_a_rolling_upgrade_to_a_new_zipapp_and_back(machines: Machines, zipapps: tuple[Path, Path]) -> None:
    old, new = zipapps
    old_sha, new_sha = sha(old), sha(new)
    group = machines.group
    with machines.api() as api:
        try:
            until("the agent connected", lambda: (n := node(api)) is not None and n["state"] == "connected", 120)
        except AssertionError:
            raise AssertionError(machines.logs()) from None
        assert api.post("/api/v1/models", json={"name": "demo", "engine": "sim", "source": "sim://demo"}
                        ).status_code == 201
        status = until("the replica ready", lambda: (s := api.get("/api/v1/models/demo").json()["model"]["status"])
                       ["ready"] == 1 and s, 120)
        [replica] = status["replicas"]
        engines = children_of(machines.procs["agent"].pid)
        assert len(engines) == 1
        until("the gateway serves", lambda: serves(machines.gateway_url), 120)
        pids = {m.name: m.proc.pid for m in group.members if m.proc is not None}

        def selves() -> list[dict[str, Any]]:
            out = []
            for m in group.members:
                with machines.api(m.url) as member:
                    out.append(member.get("/api/v1/cluster/self").json())
            return out

        assert {d["release_sha256"] for d in selves()} == {old_sha}
        assert node(api)["release_sha256"] == old_sha  # type: ignore[index]
        level = selves()[0]["store_level"]
        gateways = api.get("/api/v1/cluster/members").json()["gateways"]
        assert [(g["name"], g["release_sha256"]) for g in gateways if g["connected"]] == [("gw-1", old_sha)]

        # An upload cut short: refused, nothing kept, nothing changed.
        cut = api.put(f"/api/v1/releases/{new_sha}", content=new.read_bytes()[:100_000])
        assert cut.status_code == 422 and cut.json()["error"]["code"] == "sha256_mismatch", cut.text
        assert not (group.members[0].state_dir / "releases" / f"{new_sha}.pyz").exists()

        # The file already running: every machine skipped, said so.
        same = machines.ctl("upgrade", str(old))
        assert same.returncode == 0, same.stdout + same.stderr
        assert same.stdout.count("already runs") == 5, same.stdout

        # A gateway asked for what it cannot do: a release the leader does not hold (refused at once), a rollback
        # with no release run before (refused by the gateway, with the reason): nothing changed.
        gw_before = gateway(api)
        assert gw_before["restartable"] and gw_before["pid"] == machines.procs["gateway"].pid, gw_before
        r = api.post("/api/v1/gateways/gw-1/upgrade", json={"sha256": new_sha})
        assert r.status_code == 404 and r.json()["error"]["code"] == "release_not_found", r.text
        r = api.post("/api/v1/gateways/gw-1/upgrade", json={"rollback": True})
        assert r.status_code == 200, r.text
        refused = until("the gateway refused", lambda: (g := gateway(api))["upgrade_refused"] and g, 60)
        assert refused["upgrade_refused"].startswith("no_previous_release: "), refused
        assert {k: refused[k] for k in ("connected", "started_at", "pid", "release_sha256")} == {
            k: gw_before[k] for k in ("connected", "started_at", "pid", "release_sha256")}

        # The upgrade, under load through the gateway: standbys, the leader, the gateway, then the agent.
        leader = trio.run(group.wait_for, "a leader", group.leader, 30.0)
        with Load(machines.gateway_url) as load:
            done = machines.ctl("--json", "upgrade", str(new))
            time.sleep(1)
        assert done.returncode == 0, done.stdout + done.stderr + machines.logs()
        events = [json.loads(line) for line in done.stdout.splitlines()]
        steps = [(e["kind"], e["machine"], e["outcome"]) for e in events if e["event"] == "machine"]
        assert [k for k, _, _ in steps] == ["member", "member", "member", "gateway", "node"], steps
        assert steps[2][1] == leader.raft_addr and {o for _, _, o in steps} == {"upgraded"}, steps
        assert load.failed == [] and load.answered > 0, (load.answered, load.failed[:5])
        gw_after = gateway(api)
        assert gw_after["release_sha256"] == new_sha and gw_after["connected"], gw_after
        assert gw_after["pid"] == gw_before["pid"] == machines.procs["gateway"].pid, "exec'd in place"
        assert gw_after["started_at"] != gw_before["started_at"] and gw_after["upgrade_refused"] is None
        assert {d["release_sha256"] for d in selves()} == {new_sha}
        assert all(d["version"].endswith("+next") for d in selves())
        assert {m.name: m.proc.pid for m in group.members if m.proc is not None} == pids, "each exec'd in place"
        after = node(api)
        assert after is not None and after["release_sha256"] == new_sha
        assert machines.procs["agent"].poll() is None and children_of(machines.procs["agent"].pid) == engines
        now = api.get("/api/v1/models/demo").json()["model"]["status"]
        assert [(r["replica_id"], r["url"]) for r in now["replicas"]] == [(replica["replica_id"], replica["url"])]
        # The group's store level rose: the new release's command type is written and applied. (It writes a
        # setting as NEW_OP, refused with 409 upgrade_pending while the group's level is below it.)
        until("the group's level rose", lambda: selves()[0]["group_store_level"] == level + 1, 60)
        put = api.put("/api/v1/settings/placement.warn_interval_s", json=120)
        assert put.status_code == 200, (NEW_OP, put.text)

        # Again: every machine already runs it.
        again = machines.ctl("upgrade", str(new))
        assert again.returncode == 0 and again.stdout.count("already runs") == 5, again.stdout + again.stderr

        # Rollback of the gateway and the agent: back to the old file, the agent's engine still the same.
        with Load(machines.gateway_url) as load:
            back = machines.ctl("upgrade", "--rollback")
        assert back.returncode == 0, back.stdout + back.stderr + machines.logs()
        assert load.failed == [] and load.answered > 0, (load.answered, load.failed[:5])
        gw_back = gateway(api)
        assert gw_back["release_sha256"] == old_sha and gw_back["pid"] == machines.procs["gateway"].pid, gw_back
        rolled = node(api)
        assert rolled is not None and rolled["release_sha256"] == old_sha
        assert children_of(machines.procs["agent"].pid) == engines

        # A release whose program exits at once: the first standby is not back in its time; the run stops with
        # the reason, and the machines after it are left as they were.
        bad = machines.root / "bad.pyz"
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as z:
            z.writestr("__main__.py", "raise SystemExit(3)\n")
        bad.write_bytes(buffer.getvalue())
        with Load(machines.gateway_url) as load:
            failed = machines.ctl("upgrade", str(bad), env={"LLMGW_TIMEOUTS": "upgrade_machine_s=20"})
        assert failed.returncode == 1, failed.stdout + failed.stderr
        assert "not back within 20 s" in failed.stderr and "4 machine(s) after it were left" in failed.stderr
        assert load.failed == [] and load.answered > 0, (load.answered, load.failed[:5])
        assert sum(1 for m in group.members if m.running) == 2
        assert {d["release_sha256"] for d in selves_running(machines)} == {new_sha}
    alive = next(m for m in group.members if m.running)
    with machines.api(alive.url) as api:
        assert node(api)["release_sha256"] == old_sha  # type: ignore[index]


def selves_running(machines: Machines) -> list[dict[str, Any]]:
    out = []
    for m in machines.group.members:
        if m.running:
            with machines.api(m.url) as member:
                out.append(member.get("/api/v1/cluster/self").json())
    return out
