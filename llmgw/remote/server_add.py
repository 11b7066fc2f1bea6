"""`llmgw server add USER@HOST --role agent|control|gateway`: one machine added to the cluster over ssh, each step
reported as an `Event` as it goes.

1. checks, changing nothing: ssh works, and the probe (`preflight.PROBE`) run by the remote Python says its
   version, the role's ports, its clock, its free disk and whether it joined before; the admin API says
   whether the cluster knows the name. Every problem is reported, then the add stops (`AddFailed`);
2. the zipapp copied to DIR/llmgw.pyz (kept when the same file is there) and run once (`--version`);
3. a join token for the role and the name, made through the admin API (as `ctl nodes token create`);
4. a control plane's cluster secret, copied to DIR/cluster.secret (0600);
5. the service installed (`llmgw service install ROLE --env-stdin -- FLAGS`: the token on stdin, never on a
   command line) and started (`llmgw service start ROLE`: systemd where its unit is installed, else the
   built-in supervisor);
6. a control plane added to the Raft group (`POST /api/v1/cluster/members`, once it listens);
7. waited for, within `server_add_join_s`: an agent connected with its own certificate; a control plane a
   healthy member, caught up; a gateway following the leader. If not, the service's status and log tail.

On the remote machine: DIR/llmgw.pyz, DIR/ROLE/ (the state dir), DIR/services/ (the service), DIR/cluster.secret.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import sys
import time
import urllib.parse
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import trio

from llmgw.domain.timeouts import Timeouts
from llmgw.interfaces import RemoteShell
from llmgw.remote import Ran, RemoteError
from llmgw.remote.admin import AdminApi, AdminCallFailed
from llmgw.remote.preflight import DISK_SPARE_BYTES, PROBE, Asked, Facts, Known, Problem, ProbeError, judge, \
    probe_input
from llmgw.service.spec import SERVICE_ROLES

Role = Literal["agent", "control", "gateway"]
DEFAULT_DIR = "/var/lib/llmgw"
Status = Literal["ok", "problem", "fail", "wait", "note"]


@dataclass(frozen=True)
class Event:
    """One step's outcome (or a problem found, or a wait going on), for a terminal line or a JSON line."""

    step: str
    status: Status
    words: str
    data: Mapping[str, Any] = field(default_factory=dict)

    def to_doc(self) -> dict[str, Any]:
        return {"step": self.step, "status": self.status, "words": self.words, **self.data}


Report = Callable[[Event], None]


class AddFailed(Exception):
    """The add stopped: `problems` found before anything changed, or the step that failed (in words)."""

    def __init__(self, words: str, problems: tuple[Problem, ...] = ()) -> None:
        super().__init__(words)
        self.words = words
        self.problems = problems


@dataclass(frozen=True)
class AddRequest:
    role: Role
    host: str  # the machine's address as ssh reaches it (USER@HOST's HOST)
    zipapp: Path
    name: str | None = None  # an agent's node name or a gateway's name (default: the machine's host name)
    dir: str = DEFAULT_DIR
    python: str = "python3"
    manager: Literal["auto", "builtin", "systemd"] = "auto"
    controls: tuple[str, ...] = ()  # the admin URLs the machine dials (default: every member's)
    engine_host: str | None = None  # agent: where its engines listen (default: HOST)
    storage: tuple[str, ...] = ()  # agent: PATH:FABRIC[:shared]
    fabric: str | None = None  # agent
    listen: str | None = None  # gateway: HOST:PORT (default 0.0.0.0:8080)
    raft_addr: str | None = None  # control (default HOST:7000)
    admin_addr: str | None = None  # control (default HOST:8081)
    floating_address: str | None = None  # control: ADDR/PREFIX
    floating_interface: str | None = None
    cluster_secret: str | None = None  # control: the group's secret (a copy of the first member's)
    token_ttl_s: float | None = None

    @property
    def pyz(self) -> str:
        return f"{self.dir}/llmgw.pyz"

    @property
    def state_dir(self) -> str:
        return f"{self.dir}/{self.role}"

    @property
    def services_dir(self) -> str:
        return f"{self.dir}/services"

    @property
    def secret_path(self) -> str:
        return f"{self.dir}/cluster.secret"

    def raft(self) -> str:
        return self.raft_addr or f"{self.host}:7000"

    def admin(self) -> str:
        return self.admin_addr or f"{self.host}:8081"

    def ports(self) -> tuple[tuple[str, str, int], ...]:
        """The ports the role will listen on there: (what, host, port)."""
        def split(what: str, addr: str) -> tuple[str, str, int]:
            host, _, port = addr.rpartition(":")
            return what, host.strip("[]") or "0.0.0.0", int(port)

        if self.role == "gateway":
            return (split("gateway", self.listen or "0.0.0.0:8080"),)
        if self.role == "control":
            return split("Raft", self.raft()), split("admin API", self.admin())
        return ()

    def problems(self) -> list[str]:
        """What is wrong with the request itself (a usage error), before anyone is asked."""
        out = []
        if self.role not in SERVICE_ROLES:
            out.append(f"--role {self.role!r}: give agent, control or gateway")
        if not self.dir.startswith("/"):
            out.append(f"--remote-dir {self.dir!r}: give an absolute path")
        for what, addr in (("--listen", self.listen), ("--raft-addr", self.raft_addr), ("--admin-addr", self.admin_addr)):
            if addr is not None and not addr.rpartition(":")[2].isdigit():
                out.append(f"{what} {addr!r}: give HOST:PORT")
        if self.role == "control":
            if self.cluster_secret is None:
                out.append("a control plane needs the group's secret: --cluster-secret-file (a copy of the first "
                           "member's STATE_DIR/cluster.secret) or LLMGW_CLUSTER_SECRET")
            if (self.floating_address is None) != (self.floating_interface is None):
                out.append("--floating-address and --floating-interface go together")
        elif self.floating_address or self.floating_interface:
            out.append("--floating-address is for a control plane (--role control)")
        if not self.zipapp.is_file():
            out.append(f"--zipapp {self.zipapp}: no such file")
        return out


def running_zipapp() -> Path | None:
    """The zipapp this program runs from, if it runs as one (what `server add` installs by default)."""
    path = sys.argv[0]
    if path and os.path.isfile(path) and zipfile.is_zipfile(path):
        return Path(path).resolve()
    return None


def dials(controls: list[str], peers: list[str]) -> list[tuple[str, str, int]]:
    """What the machine must reach, as the probe dials it: each control URL's host and port (the admin API),
    and a control plane each member's Raft address."""
    out = []
    for url in controls:
        parts = urllib.parse.urlsplit(url)
        if parts.hostname:
            out.append(("admin API", parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)))
    for addr in peers:
        host, _, port = addr.rpartition(":")
        if port.isdigit():
            out.append(("Raft", host.strip("[]"), int(port)))
    return out


def mirror_check(role: str, controls: list[str], facts: Facts) -> tuple[Status, str]:
    """What the model mirror will make of the machine once added (docs/mirror.md, "Who may fetch"), said before
    anything changes: it serves agents (their join gives them a certificate from the cluster's CA) and control
    planes, at each control plane's admin URL (`/mirror/blobs/...`), over TLS; "note" when it would refuse."""
    if role == "gateway":
        return "ok", "the model mirror will not serve it, as none of the cluster's gateways: gateways fetch no model files"
    plain = [u for u in controls if u.startswith("http://")]
    if plain and len(plain) == len(controls):
        return "note", (f"the model mirror would refuse it: the control plane at {plain[0]} serves plain HTTP (llmgw up "
                        f"on loopback), where only the machines inside its own process may fetch")
    admin = [r for r in facts.reached if r.what == "admin API"]
    gone = [f"{r.host}:{r.port}" for r in admin if not r.free]
    if admin and len(gone) == len(admin):
        return "note", (f"the model mirror would refuse it: it reaches no control plane's admin port ({', '.join(gone)}), "
                        f"where mirror files are served: a mirror:// model cannot start there")
    if gone:
        return "note", (f"it fetches mirror files only from the control planes it reaches: not from {', '.join(gone)} "
                        f"(when the leader is busy, those standbys cannot serve it)")
    return "ok", (f"the model mirror will serve it once it joined: its {role} certificate from the cluster's CA is its "
                  f"credential, and it reaches every control plane's admin port (a revoked or expired certificate "
                  f"is refused)")


def machine_name(req: AddRequest, facts: Facts) -> str:
    """What the cluster will call the machine: a control plane by its Raft address, others by --name or
    the remote host name."""
    return req.raft() if req.role == "control" else (req.name or facts.hostname)


def role_flags(req: AddRequest, name: str, controls: list[str], peers: list[str], ca_hash: str) -> list[str]:
    """The role's own flags, as `llmgw service install ROLE -- FLAGS` stores them (the token is not here: it
    goes in the service's environment)."""
    if req.role == "control":
        flags = ["--state-dir", req.state_dir, "--raft-addr", req.raft(), "--admin-addr", req.admin(), "--join",
                 "--cluster-secret-file", req.secret_path, "--ca-hash", ca_hash, "--join-via", controls[0]]
        for peer in peers:
            flags += ["--peer", peer]
        if req.floating_address and req.floating_interface:
            flags += ["--floating-address", req.floating_address, "--floating-interface", req.floating_interface]
        return flags
    flags = [a for url in controls for a in ("--control", url)]
    flags += ["--state-dir", req.state_dir, "--ca-hash", ca_hash]
    if req.role == "agent":
        flags += ["--node", name, "--engine-host", req.engine_host or req.host]
        flags += [a for s in req.storage for a in ("--storage", s)]
        flags += ["--fabric", req.fabric] if req.fabric else []
    else:
        flags += ["--name", name, "--listen", req.listen or "0.0.0.0:8080"]
    return flags


class ServerAdd:
    """One add: the remote machine (`shell`), the admin API (`api`), where events go (`report`)."""

    def __init__(self, req: AddRequest, shell: RemoteShell, api: AdminApi, report: Report, timeouts: Timeouts, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.req = req
        self.shell = shell
        self.api = api
        self.report = report
        self.timeouts = timeouts
        self.clock = clock

    def say(self, step: str, status: Status, words: str, **data: Any) -> None:
        self.report(Event(step, status, words, data))

    async def run(self) -> dict[str, Any]:
        """Add the machine; what was done. Raises AddFailed with the reasons."""
        req = self.req
        known, members = await self.cluster()
        controls = list(req.controls) or self.member_urls(members) or [self.api.url]
        peers = [str(r["id"]) for r in members.get("members") or [] if isinstance(r, Mapping) and r.get("id")]
        facts, before, after = await self.probe(dials(controls, peers if req.role == "control" else []))
        name = machine_name(req, facts)
        asked = Asked(req.role, name, req.dir, req.state_dir, req.zipapp.stat().st_size + DISK_SPARE_BYTES,
                      self.timeouts.server_add_clock_skew_s, req.ports())
        problems = judge(facts, asked, known, before=before, after=after)
        status, words = mirror_check(req.role, controls, facts)
        self.say("mirror", status, words)
        for p in problems:
            self.say("check", "problem", p.words, code=p.code)
        if problems:
            raise AddFailed(f"{len(problems)} problem(s) on {self.shell.target}; nothing was changed",
                            tuple(problems))
        self.say("check", "ok", f"Python {'.'.join(map(str, facts.python))}, {len(facts.ports)} port(s) free, "
                                f"reaches the control plane, clock within "
                                f"{self.timeouts.server_add_clock_skew_s:g} s, {facts.disk_free // 2**20} MiB free, "
                                f"not in the cluster as {name}")
        await self.copy()
        token = await self.token(name)
        if req.role == "control":
            await self.put_secret()
        flags = role_flags(req, name, controls, peers, str(token.get("ca_hash") or ""))
        await self.install(flags, str(token["token"]))
        manager = self.manager(facts)
        await self.start(manager)
        if req.role == "control":
            await self.add_member(name)
        await self.wait_joined(name, manager)
        return {"role": req.role, "name": name, "target": self.shell.target, "dir": req.dir, "manager": manager}

    def manager(self, facts: Facts) -> str:
        """Who runs the role there: as asked; on auto, systemd's unit where systemd runs and the unit is installed
        (it reads the services of /var/lib/llmgw), else the built-in supervisor, saying why."""
        req = self.req
        if req.manager != "auto":
            return req.manager
        if facts.systemd and facts.unit and req.dir == DEFAULT_DIR:
            return "systemd"
        if facts.systemd:
            unit = f"llmgw-{req.role}.service"
            why = (f"{unit} is not installed" if not facts.unit else
                   f"{unit} reads {DEFAULT_DIR}/services, not {req.services_dir}")
            self.say("start", "note", f"systemd runs there but {why}: the built-in supervisor runs the role, which "
                                      f"does not start again at boot (docs/install.md, Services; --manager)")
        return "builtin"

    # -- the steps ----------------------------------------------------------------------------------

    async def remote(self, step: str, argv: list[str], *, stdin: bytes = b"", timeout_s: float | None = None) -> Ran:
        try:
            return await self.shell.run(argv, stdin=stdin, timeout_s=timeout_s or self.timeouts.ssh_command_s)
        except RemoteError as e:
            self.say(step, "fail", e.message, code=f"ssh_{e.kind}")
            raise AddFailed(e.message, (Problem(f"ssh_{e.kind}", e.message),)) from None

    def llmgw(self, *args: str) -> list[str]:
        return [self.req.python, "-I", self.req.pyz, *args]

    async def probe(self, reach: list[tuple[str, str, int]]) -> tuple[Facts, float, float]:
        req = self.req
        given = probe_input(role=req.role, dir=req.dir, state_dir=req.state_dir, services_dir=req.services_dir,
                            ports=req.ports(), reach=reach, connect_s=self.timeouts.agent_connect_s)
        before = self.clock()
        ran = await self.remote("ssh", [req.python, "-c", PROBE, given])
        after = self.clock()
        if not ran.ok:
            missing = ran.returncode == 127
            words = (f"no {req.python} on {self.shell.target} (install Python 3.11 or newer, or give --remote-python)"
                     if missing else f"the checks did not run with {req.python} there: {ran.said()}")
            problem = Problem("no_python" if missing else "probe_failed", words)
            self.say("check", "problem", words, code=problem.code)
            raise AddFailed(f"1 problem(s) on {self.shell.target}; nothing was changed", (problem,))
        self.say("ssh", "ok", f"{self.shell.target} answers over ssh ({(after - before) * 1000:.0f} ms)")
        try:
            return Facts.parse(ran.stdout.decode("utf-8", "replace")), before, after
        except ProbeError as e:
            self.say("check", "problem", str(e), code="probe_failed")
            raise AddFailed(str(e), (Problem("probe_failed", str(e)),)) from None

    async def admin_call(self, step: str, method: str, path: str, body: Any = None) -> Any:
        try:
            return await (self.api.get(path) if method == "GET" else self.api.post(path, body))
        except AdminCallFailed as e:
            self.say(step, "fail", e.message, code=e.code)
            raise AddFailed(f"{method} {path}: {e}") from None

    async def cluster(self) -> tuple[Known, Mapping[str, Any]]:
        members = await self.admin_call("cluster", "GET", "/api/v1/cluster/members")
        nodes = await self.admin_call("cluster", "GET", "/api/v1/nodes")
        machines = await self.admin_call("cluster", "GET", "/api/v1/trust/machines")
        self.say("cluster", "ok", f"the admin API at {self.api.url} answers (leader {members.get('leader')})")
        return Known.from_docs(nodes, members, machines), members

    @staticmethod
    def member_urls(members: Mapping[str, Any]) -> list[str]:
        return [str(r["admin_url"]) for r in members.get("members") or []
                if isinstance(r, Mapping) and str(r.get("admin_url") or "").startswith("https://")]

    async def copy(self) -> None:
        req = self.req
        with req.zipapp.open("rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
        await self.remote("copy", ["mkdir", "-p", "-m", "0700", req.dir])
        there = await self.remote("copy", ["sha256sum", req.pyz])
        if there.ok and there.stdout.split()[:1] == [digest.encode()]:
            self.say("copy", "ok", f"{req.pyz}: the same zipapp is there, kept")
        else:
            partial = req.pyz + ".partial"
            try:
                await self.shell.put(req.zipapp, partial, timeout_s=self.timeouts.ssh_copy_s)
            except RemoteError as e:
                self.say("copy", "fail", e.message, code=f"ssh_{e.kind}")
                raise AddFailed(e.message) from None
            moved = await self.remote("copy", ["mv", "-f", partial, req.pyz])
            if not moved.ok:
                self.fail("copy", f"could not put the zipapp at {req.pyz}: {moved.said()}")
            self.say("copy", "ok", f"{req.zipapp} -> {self.shell.target}:{req.pyz} "
                                   f"({req.zipapp.stat().st_size // 1024} KiB)")
        ran = await self.remote("copy", self.llmgw("--version"))
        if not ran.ok:
            self.fail("copy", f"the zipapp does not run there with {req.python}: {ran.said()}")
        self.say("copy", "ok", f"it runs there: llmgw {ran.stdout.decode('utf-8', 'replace').strip()}")

    def fail(self, step: str, words: str) -> None:
        self.say(step, "fail", words)
        raise AddFailed(words)

    async def token(self, name: str) -> Mapping[str, Any]:
        body: dict[str, Any] = {"role": self.req.role, "name": name}
        if self.req.token_ttl_s is not None:
            body["ttl_s"] = self.req.token_ttl_s
        doc = await self.admin_call("token", "POST", "/api/v1/trust/tokens", body)
        article = "an" if self.req.role == "agent" else "a"
        self.say("token", "ok", f"join token {doc.get('id')} for {article} {self.req.role} named {name}, usable once")
        return dict(doc)

    async def put_secret(self) -> None:
        secret = self.req.cluster_secret or ""
        path = self.req.secret_path
        ran = await self.remote("secret", ["sh", "-c", f"umask 077 && cat > {shlex.quote(path)}"],
                                stdin=secret.encode() + (b"" if secret.endswith("\n") else b"\n"))
        if not ran.ok:
            self.fail("secret", f"could not write {path}: {ran.said()}")
        self.say("secret", "ok", f"the group's secret in {path} (0600)")

    async def install(self, flags: list[str], token: str) -> None:
        req = self.req
        ran = await self.remote("install", self.llmgw("service", "install", req.role, "--dir", req.services_dir,
                                                      "--env-stdin", "--", *flags),
                                stdin=f"LLMGW_JOIN_TOKEN={token}\n".encode())
        if not ran.ok:
            self.fail("install", f"`llmgw service install {req.role}` failed there: {ran.said()}")
        self.say("install", "ok", f"{req.role} installed in {req.services_dir}: llmgw {req.role} {shlex.join(flags)}")

    async def start(self, manager: str) -> None:
        req = self.req
        ran = await self.remote("start", self.llmgw("service", "start", req.role, "--dir", req.services_dir,
                                                    "--manager", manager))
        if not ran.ok:
            self.fail("start", f"`llmgw service start {req.role}` failed there ({manager}): {ran.said()}")
        self.say("start", "ok", ran.stdout.decode("utf-8", "replace").strip() or f"{req.role} started ({manager})")

    async def add_member(self, raft_addr: str) -> None:
        """The membership change, once the new member listens (until then the leader answers 409
        member_unreachable: asked again, within `server_add_join_s`)."""
        deadline = trio.current_time() + self.timeouts.server_add_join_s
        said = ""
        while True:
            try:
                await self.api.post("/api/v1/cluster/members", {"raft_addr": raft_addr})
                self.say("member", "ok", f"{raft_addr} added to the Raft group (a membership change, committed)")
                return
            except AdminCallFailed as e:
                if e.code == "member_exists":
                    self.say("member", "ok", f"{raft_addr} is in the Raft group already")
                    return
                if e.code not in ("member_unreachable", "membership_change_in_progress", "unreachable") \
                        and e.status not in (0, 503):
                    self.fail("member", f"adding {raft_addr} to the group was refused: {e}")
                if e.message != said:
                    said = e.message
                    self.say("member", "wait", f"not added yet: {e}")
            if trio.current_time() > deadline:
                await self.diagnose("member", f"{raft_addr} was not added within {self.timeouts.server_add_join_s:g} s "
                                              f"({said})")
            await trio.sleep(self.timeouts.server_add_poll_s)

    async def joined(self, name: str) -> str | None:
        """None once the machine has joined; else what is still missing, in words."""
        role = self.req.role
        if role == "agent":
            nodes = (await self.api.get("/api/v1/nodes")).get("nodes") or []
            node = next((n for n in nodes if isinstance(n, Mapping) and n.get("node") == name), None)
            if node is None:
                return f"no node {name} yet"
            cert = node.get("certificate")
            if node.get("state") != "connected" or not isinstance(cert, Mapping) or cert.get("revoked"):
                return f"node {name} is {node.get('state')}, certificate {'held' if cert else 'none yet'}"
            return None
        members = await self.api.get("/api/v1/cluster/members")
        if role == "gateway":
            gateways = members.get("gateways") or []
            if any(isinstance(g, Mapping) and g.get("name") == name and g.get("connected") for g in gateways):
                return None
            return f"gateway {name} does not follow the leader yet"
        row = next((r for r in members.get("members") or [] if isinstance(r, Mapping) and r.get("id") == name), None)
        if row is None:
            return f"{name} is not in the group's table yet"
        if row.get("state") != "healthy":
            return f"{name} is {row.get('state')}: {row.get('reason')}"
        return None

    async def wait_joined(self, name: str, manager: str) -> None:
        deadline = trio.current_time() + self.timeouts.server_add_join_s
        said = ""
        while True:
            try:
                missing = await self.joined(name)
            except AdminCallFailed as e:
                missing = str(e)
            if missing is None:
                break
            if missing != said:
                said = missing
                self.say("join", "wait", missing)
            if trio.current_time() > deadline:
                await self.diagnose("join", f"{name} had not joined within {self.timeouts.server_add_join_s:g} s "
                                            f"({said})")
            await trio.sleep(self.timeouts.server_add_poll_s)
        done = {"agent": f"node {name} registered and connected, with its own certificate",
                "control": f"{name} is a member of the group, healthy and caught up",
                "gateway": f"gateway {name} follows the leader"}[self.req.role]
        self.say("join", "ok", done)

    async def diagnose(self, step: str, words: str) -> None:
        """Fail `step` with `words`, and what the machine says of its service and its log's last lines."""
        req = self.req
        extra = []
        try:
            status = await self.shell.run(self.llmgw("service", "status", req.role, "--dir", req.services_dir),
                                          timeout_s=self.timeouts.ssh_command_s)
            extra.append(f"service status: {status.stdout.decode('utf-8', 'replace').strip() or status.said()}")
            tail = await self.shell.run(["tail", "-n", "15", f"{req.services_dir}/{req.role}.log",
                                         f"{req.state_dir}/logs/{req.role}.log"], timeout_s=self.timeouts.ssh_command_s)
            extra.append(tail.stdout.decode("utf-8", "replace").strip())
        except RemoteError as e:
            extra.append(f"(and its status was not read: {e.message})")
        self.fail(step, "\n".join([words, *[e for e in extra if e]]))
