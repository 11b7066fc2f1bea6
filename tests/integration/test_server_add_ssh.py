"""`llmgw server add` against a real sshd (Debian's openssh-server): the test makes a network namespace (the
"remote machine", 10.231.N.2 on a veth pair whose host end is 10.231.N.1/30), keys of its own (ssh-keygen),
and starts `/usr/sbin/sshd -D -e -f CONFIG` inside it as root. A real control plane listens on the host end,
where the namespace reaches it. The remote machine shares this filesystem, so each add gets a remote dir
of its own under tmp_path; the zipapp is built once (build.py, shiv) and copied over scp as to any machine.

Then: an agent joins with its own certificate; a second add of it refuses and changes nothing; a gateway
follows the leader; a control plane is added to the Raft group and catches up; and the faults — sshd
stopped (refused), a key not authorized, no Python there, a port taken there, a control URL the machine
does not reach, a Python too old and a clock 30 s ahead (a remote Python that says so: the world's edge),
each reported before anything is changed; and a machine that does not join in time, with what it says.

Needs root (network namespaces, sshd) and sshd, ssh, ssh-keygen, ip: skipped with the reason otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.support.processes import free_port
from llmgw.trust.files import MachineFiles
from tests.support.cluster import ADMIN_KEY, Cluster

pytestmark = pytest.mark.slow

PROGRAMS = ("/usr/sbin/sshd", "ssh", "scp", "ssh-keygen", "ip")


def sh(*argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"`{' '.join(argv)}` failed ({done.returncode}): {done.stderr.strip()}")
    return done


def why_not_here() -> str | None:
    if os.geteuid() != 0:
        return "needs root: a network namespace of its own, and sshd started as root"
    missing = [p for p in PROGRAMS if shutil.which(p) is None]
    if missing:
        return f"needs {', '.join(missing)} (Debian: openssh-server, openssh-client, iproute2; .ci/system-packages.sh)"
    probe = f"llmgw-sa-probe-{os.getpid()}"
    done = sh("ip", "netns", "add", probe, check=False)
    if done.returncode != 0:
        return f"`ip netns add` is not permitted here: {done.stderr.strip()}"
    sh("ip", "netns", "del", probe, check=False)
    return None


@dataclass
class Remote:
    """The namespace playing the remote machine, and the address each side has on the veth pair."""

    ns: str
    host_addr: str  # this side (the control plane listens here)
    addr: str  # the remote machine's

    def run(self, *argv: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns, *argv]


def _free_subnet() -> int:
    used: str = sh("ip", "-o", "addr").stdout
    for n in (os.getpid() % 200 + 20, *range(20, 250)):
        if f"10.231.{n}." not in used:
            return int(n)
    raise AssertionError("no free 10.231.N.0/30 for the test's veth pair")


@pytest.fixture(scope="module")
def remote() -> Iterator[Remote]:
    why = why_not_here()
    if why:
        pytest.skip(why)
    n, tag = _free_subnet(), os.getpid() % 100000
    r = Remote(f"llmgw-sa-{tag}", f"10.231.{n}.1", f"10.231.{n}.2")
    outside, inside = f"sah{tag}", f"sar{tag}"
    sh("ip", "netns", "add", r.ns)
    try:
        sh("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
        sh("ip", "link", "set", inside, "netns", r.ns)
        sh("ip", "addr", "add", f"{r.host_addr}/30", "dev", outside)
        sh("ip", "link", "set", outside, "up")
        sh(*r.run("ip", "link", "set", "lo", "up"))
        sh(*r.run("ip", "addr", "add", f"{r.addr}/30", "dev", inside))
        sh(*r.run("ip", "link", "set", inside, "up"))
        yield r
    finally:
        # What still runs in the namespace was started by the test (sshd, the services it started): each by pid.
        for pid in sh("ip", "netns", "pids", r.ns, check=False).stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        sh("ip", "link", "del", outside, check=False)
        sh("ip", "netns", "del", r.ns, check=False)


@dataclass
class Keys:
    dir: Path
    client: Path  # authorized
    stranger: Path  # not authorized
    host: Path
    known_hosts: Path


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    d = tmp_path_factory.mktemp("ssh")
    k = Keys(d, d / "client_ed25519", d / "stranger_ed25519", d / "host_ed25519", d / "known_hosts")
    for path in (k.client, k.stranger, k.host):
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f", str(path))
    (d / "authorized_keys").write_text((d / "client_ed25519.pub").read_text())
    return k


class Sshd:
    """`sshd -D -e -f CONFIG` in the namespace, as root, on port 22 of the remote address."""

    def __init__(self, remote: Remote, keys: Keys, shiv_root: Path) -> None:
        self.remote = remote
        self.config = keys.dir / "sshd_config"
        self.log = keys.dir / "sshd.log"
        self.config.write_text("\n".join([
            f"ListenAddress {remote.addr}",
            "Port 22",
            f"HostKey {keys.host}",
            f"AuthorizedKeysFile {keys.dir / 'authorized_keys'}",
            f"PidFile {keys.dir / 'sshd.pid'}",
            "UsePAM no",
            "StrictModes no",
            "PermitRootLogin prohibit-password",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PubkeyAuthentication yes",
            "Subsystem sftp internal-sftp",  # scp speaks SFTP (OpenSSH 9), as Debian's own config allows
            # shiv unpacks the zipapp here rather than in root's home
            f"SetEnv SHIV_ROOT={shiv_root}",
            "",
        ]))
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation dir (Debian's package makes it at boot)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.remote.run("/usr/sbin/sshd", "-D", "-e", "-f", str(self.config)),
                                         stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:  # until it listens (a connect from inside the namespace)
            if sh(*self.remote.run(sys.executable, "-c", f"import socket; socket.create_connection(('{self.remote.addr}', 22), 1)"),
                  check=False).returncode == 0:
                return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"sshd did not listen: {self.log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)


@pytest.fixture(scope="module")
def sshd(remote: Remote, keys: Keys, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    d = Sshd(remote, keys, tmp_path_factory.mktemp("shiv"))
    d.start()
    yield d
    d.stop()


@pytest.fixture(scope="module")
def pyz(runtime_zipapp: Path) -> Path:
    """The zipapp (runtime dependencies only: what a machine runs), built once for the session."""
    return runtime_zipapp


@pytest.fixture(scope="module")
def cluster(remote: Remote, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One control plane on the host end of the veth pair, where the remote machine reaches it."""
    c = Cluster(tmp_path_factory.mktemp("cluster"), size=1)
    m = c.members[0]
    m.host, m.raft_addr, m.admin_port = remote.host_addr, f"{remote.host_addr}:{free_port(remote.host_addr)}", \
        free_port(remote.host_addr)
    try:
        trio.run(c.start)
        yield c
    finally:
        c.close()


@dataclass
class Added:
    code: int
    events: list[dict[str, Any]]
    stderr: str

    def problems(self) -> dict[str, str]:
        return {e["code"]: e["words"] for e in self.events if e.get("status") == "problem"}

    def __str__(self) -> str:
        return f"exit {self.code}\n" + "\n".join(json.dumps(e) for e in self.events) + "\n" + self.stderr


def server_add(cluster: Cluster, remote: Remote, keys: Keys, pyz: Path, role: str, dir: Path, *extra: str,
               identity: Path | None = None, as_json: bool = True) -> Added:
    argv = [sys.executable, "-m", "llmgw", "server", "add", f"root@{remote.addr}", "--role", role,
            *(["--json"] if as_json else []),
            "--zipapp", str(pyz), "--remote-dir", str(dir), "--identity", str(identity or keys.client),
            "--known-hosts", str(keys.known_hosts), "--url", cluster.members[0].url, "--key", ADMIN_KEY, *extra]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=dir.parent)
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return Added(done.returncode, events, done.stderr if as_json else done.stdout + done.stderr)


def api(cluster: Cluster, path: str) -> Any:
    r = httpx.get(cluster.members[0].url + path, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def stop_services(dir: Path) -> None:
    """The roles the add started there, stopped through their own services' dir (the same filesystem)."""
    if (dir / "services").is_dir():
        subprocess.run([sys.executable, "-m", "llmgw", "service", "stop", "--dir", str(dir / "services"),
                        "--manager", "builtin"], capture_output=True, timeout=120)


def snapshot(dir: Path) -> dict[str, tuple[int, int]]:
    """Every file under `dir`, with its size and mtime: what "nothing changed" compares."""
    return {str(p.relative_to(dir)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(dir.rglob("*"))
            if p.is_file() and "logs" not in p.parts and not p.name.endswith((".log", ".state.json", ".lock"))} \
        if dir.exists() else {}


# --- a machine joins --------------------------------------------------------------------------------


def test_an_agent_joins_over_ssh_with_its_own_certificate_and_a_second_add_changes_nothing(
        cluster: Cluster, remote: Remote, keys: Keys, sshd: Sshd, pyz: Path, tmp_path: Path) -> None:
    dir = tmp_path / "remote-agent"
    try:
        added = server_add(cluster, remote, keys, pyz, "agent", dir, "--name", "ssh-node-1")
        assert added.code == 0, added
        steps = [(e["step"], e["status"]) for e in added.events]
        for step in ("ssh", "cluster", "check", "copy", "token", "install", "start", "join", "done"):
            assert (step, "ok") in steps, (step, added)
        assert steps.index(("check", "ok")) < steps.index(("copy", "ok")) < steps.index(("join", "ok"))

        node = next(n for n in api(cluster, "/api/v1/nodes")["nodes"] if n["node"] == "ssh-node-1")
        assert node["state"] == "connected", node
        own = MachineFiles.of(dir / "agent").identity()  # the certificate the machine holds, made there
        assert (own.role, own.name) == ("agent", "ssh-node-1")
        assert node["certificate"]["serial"] == own.serial and not node["certificate"]["revoked"], node
        spec = json.loads((dir / "services" / "agent.json").read_text())
        assert spec["args"][:2] == ["--control", cluster.members[0].url], spec
        assert "LLMGW_JOIN_TOKEN" in spec["env"] and (dir / "services" / "agent.json").stat().st_mode & 0o077 == 0

        # Again: the machine is in the cluster; every reason is said, and nothing changes there or in the cluster.
        files, tokens = snapshot(dir), api(cluster, "/api/v1/trust/tokens")
        again = server_add(cluster, remote, keys, pyz, "agent", dir, "--name", "ssh-node-1")
        assert again.code == 1, again
        assert {"already_joined", "name_known"} <= set(again.problems()), again
        assert "ssh-node-1" in again.problems()["name_known"]
        assert not any(e["step"] in ("copy", "token", "install", "start") for e in again.events), again
        assert snapshot(dir) == files
        assert api(cluster, "/api/v1/trust/tokens") == tokens
        assert "nothing was changed" in again.stderr
    finally:
        stop_services(dir)


def test_a_gateway_joins_and_follows_the_leader(cluster: Cluster, remote: Remote, keys: Keys, sshd: Sshd, pyz: Path,
                                                tmp_path: Path) -> None:
    dir = tmp_path / "remote-gateway"
    try:
        added = server_add(cluster, remote, keys, pyz, "gateway", dir, "--name", "ssh-gw-1",
                           "--listen", f"{remote.addr}:{free_port()}")
        assert added.code == 0, added
        gateways = api(cluster, "/api/v1/cluster/members")["gateways"]
        assert any(g["name"] == "ssh-gw-1" and g["connected"] for g in gateways), gateways
        assert MachineFiles.of(dir / "gateway").identity().name == "ssh-gw-1"
    finally:
        stop_services(dir)


# --- what stops it, said before anything changes ------------------------------------------------------


def test_a_port_taken_a_python_too_old_a_clock_ahead_and_control_out_of_reach_are_all_said_and_nothing_changes(
        cluster: Cluster, remote: Remote, keys: Keys, sshd: Sshd, pyz: Path, tmp_path: Path) -> None:
    dir = tmp_path / "remote-faults"
    port = free_port()
    holder = subprocess.Popen(remote.run(sys.executable, "-c", (
        "import socket, sys, time\n"
        f"s = socket.socket(); s.bind(('{remote.addr}', {port})); s.listen(); print('held', flush=True)\n"
        "time.sleep(600)")), stdout=subprocess.PIPE)
    # The remote's Python at the world's edge: the real one runs the probe, and its answer is rewritten as
    # an old Python whose clock runs 30 s ahead would give it.
    old = tmp_path / "old-python"
    old.write_text("#!/bin/sh\n/usr/bin/python3 \"$@\" | /usr/bin/python3 -c 'import json, sys; d = json.load(sys.stdin); "
                   "d[\"python\"] = [3, 9, 18]; d[\"time\"] += 30; print(json.dumps(d))'\n")
    old.chmod(0o755)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        taken = server_add(cluster, remote, keys, pyz, "gateway", dir, "--name", "ssh-gw-busy",
                           "--listen", f"{remote.addr}:{port}")
        assert taken.code == 1, taken
        assert set(taken.problems()) == {"port_taken"}, taken
        assert f"{remote.addr}:{port}" in taken.problems()["port_taken"]

        # ... and told to dial the control plane at an address only this machine knows.
        loopback = f"https://127.0.0.1:{cluster.members[0].admin_port}"
        everything = server_add(cluster, remote, keys, pyz, "gateway", dir, "--name", "ssh-gw-busy",
                                "--listen", f"{remote.addr}:{port}", "--remote-python", str(old), "--control", loopback)
        assert everything.code == 1, everything
        problems = everything.problems()
        assert set(problems) == {"port_taken", "python_too_old", "clock_skew", "control_unreachable"}, everything
        assert "3.9.18" in problems["python_too_old"] and "ahead" in problems["clock_skew"]
        assert f"127.0.0.1:{cluster.members[0].admin_port}" in problems["control_unreachable"]
        assert everything.events[-1]["status"] == "fail" and len(everything.events[-1]["problems"]) == 4
        assert not dir.exists(), "a refused add made its remote dir"
        assert not any(t.get("name") == "ssh-gw-busy" for t in api(cluster, "/api/v1/trust/tokens")["tokens"])
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()


def test_a_key_not_authorized_is_said_as_such(cluster: Cluster, remote: Remote, keys: Keys, sshd: Sshd, pyz: Path,
                                              tmp_path: Path) -> None:
    refused = server_add(cluster, remote, keys, pyz, "agent", tmp_path / "remote", "--name", "n",
                         identity=keys.stranger)
    assert refused.code == 1, refused
    assert set(refused.problems()) | {e.get("code") for e in refused.events} >= {"ssh_auth"}, refused
    assert "refused its key" in refused.stderr


def test_sshd_stopped_is_said_as_refused_and_nothing_changes(cluster: Cluster, remote: Remote, keys: Keys, sshd: Sshd,
                                                             pyz: Path, tmp_path: Path) -> None:
    tokens = api(cluster, "/api/v1/trust/tokens")
    sshd.stop()
    try:
        refused = server_add(cluster, remote, keys, pyz, "agent", tmp_path / "remote", "--name", "n")
        assert refused.code == 1, refused
        assert {e.get("code") for e in refused.events} >= {"ssh_refused"}, refused
        assert "nothing listens for ssh" in refused.stderr
        said = server_add(cluster, remote, keys, pyz, "agent", tmp_path / "remote", "--name", "n", as_json=False)
        assert said.code == 1 and said.events == []
        assert said.stderr.startswith("cluster  the admin API at "), said
        assert f"\nssh      FAILED: ssh to root@{remote.addr} was refused" in said.stderr, said
        assert "error: " in said.stderr and "ssh_refused: " in said.stderr, said
        assert api(cluster, "/api/v1/trust/tokens") == tokens
        assert not (tmp_path / "remote").exists()
    finally:
        sshd.start()



def test_no_python_there_is_said(cluster: Cluster, remote: Remote, keys: Keys, sshd: Sshd, pyz: Path,
                                 tmp_path: Path) -> None:
    missing = server_add(cluster, remote, keys, pyz, "agent", tmp_path / "remote", "--name", "n",
                         "--remote-python", "/nonexistent/python3")
    assert missing.code == 1 and set(missing.problems()) == {"no_python"}, missing
    assert not (tmp_path / "remote").exists()


def test_a_machine_that_does_not_join_in_time_says_its_service_status_and_log(
        cluster: Cluster, remote: Remote, keys: Keys, sshd: Sshd, pyz: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Its agent dials a control URL where something takes connections and never answers (the check that the
    machine reaches it passes; its join does not): it never joins; the add's wait (shortened through
    LLMGW_TIMEOUTS, as for any process) ends with what the machine says of it."""
    dir = tmp_path / "remote-lost"
    with socket.socket() as mute:
        mute.bind((remote.host_addr, 0))
        mute.listen()  # connections wait in its backlog, never answered
        nowhere = f"https://{remote.host_addr}:{mute.getsockname()[1]}"
        monkeypatch.setenv("LLMGW_TIMEOUTS", "server_add_join_s=6")
        try:
            lost = server_add(cluster, remote, keys, pyz, "agent", dir, "--name", "ssh-node-lost", "--control", nowhere)
        finally:
            stop_services(dir)
    assert lost.code == 1, lost
    steps = [(e["step"], e["status"]) for e in lost.events]
    assert ("start", "ok") in steps and ("join", "fail") in steps, lost
    said = lost.events[-2]["words"] if lost.events[-1]["step"] == "done" else lost.events[-1]["words"]
    assert "had not joined within 6 s" in said and "service status: agent" in said, lost
    assert "services/agent.log <==" in said and "supervisor agent: started" in said, "the log's last lines are shown"


# --- last: a second control plane (removed again at its end; the group of one it leaves is the fixture's) ----


def test_a_control_plane_is_added_to_the_group_and_catches_up(cluster: Cluster, remote: Remote, keys: Keys,
                                                              sshd: Sshd, pyz: Path, tmp_path: Path) -> None:
    dir = tmp_path / "remote-control"
    raft = f"{remote.addr}:{free_port()}"
    first = cluster.members[0]
    try:
        added = server_add(cluster, remote, keys, pyz, "control", dir, "--raft-addr", raft,
                           "--admin-addr", f"{remote.addr}:{free_port()}", "--cluster-secret-file",
                           str(cluster.secret_file))
        assert added.code == 0, added
        assert ("member", "ok") in [(e["step"], e["status"]) for e in added.events], added
        rows = {r["id"]: r for r in api(cluster, "/api/v1/cluster/members")["members"]}
        assert sorted(rows) == sorted([first.raft_addr, raft]), rows
        assert rows[raft]["state"] == "healthy" and rows[raft]["state_hash"] == rows[first.raft_addr]["state_hash"]
        assert MachineFiles.of(dir / "control").identity().role == "control"
    finally:
        # Out of the group first, so that the first member keeps its quorum of one.
        httpx.delete(f"{first.url}/api/v1/cluster/members/{raft}", headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                     timeout=60)
        stop_services(dir)
