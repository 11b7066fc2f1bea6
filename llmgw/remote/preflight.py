"""What would stop `llmgw server add`, judged before anything is changed: the probe run on the remote machine
(`PROBE`, Python that any python3 runs, so an old one still says its version) and the pure judges over its
answer and the cluster's (`judge`): Python too old, a port taken, the clocks apart, too little disk, the
machine already in the cluster. Every problem is a `Problem` (code + words), all of them reported at once."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

MIN_PYTHON = (3, 11)
# Free space the remote dir needs beyond the zipapp: the zipapp unpacked once (shiv), logs, the request log.
DISK_SPARE_BYTES = 512 * 1024 * 1024

# Run on the remote machine as `PYTHON -c PROBE JSON`. Written for any Python 3 (no f-strings, no walrus),
# so that one too old to run llmgw still answers with its version.
PROBE = r'''
import json, os, socket, sys, time
asked = json.loads(sys.argv[1])
def free_space(path):
    p = os.path.abspath(path)
    while not os.path.exists(p):
        p = os.path.dirname(p)
    st = os.statvfs(p)
    return {"path": p, "free": st.f_bavail * st.f_frsize}
def bind(host, port):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
        return ""
    except OSError as e:
        return e.strerror or str(e)
    finally:
        s.close()
def reach(host, port):
    try:
        socket.create_connection((host, port), asked["connect_s"]).close()
        return ""
    except (OSError, ValueError) as e:
        return str(e) or type(e).__name__
reached = []
for what, host, port in asked.get("reach", []):
    error = reach(host, port)
    reached.append({"what": what, "host": host, "port": port, "free": not error, "error": error})
ports = []
for what, host, port in asked["ports"]:
    error = bind(host, port)
    ports.append({"what": what, "host": host, "port": port, "free": not error, "error": error})
out = {
    "python": list(sys.version_info[:3]),
    "executable": sys.executable,
    "hostname": socket.gethostname(),
    "uid": os.getuid(),
    "ports": ports,
    "reached": reached,
    "disk": free_space(asked["dir"]),
    "credentials": os.path.isfile(os.path.join(asked["state_dir"], "tls", "cert.pem")),
    "installed": os.path.isfile(os.path.join(asked["services_dir"], asked["role"] + ".json")),
    "systemd": os.path.isdir("/run/systemd/system"),
    "unit": os.path.isfile("/etc/systemd/system/llmgw-" + asked["role"] + ".service"),
    "time": time.time(),
}
sys.stdout.write(json.dumps(out) + "\n")
'''


class ProbeError(ValueError):
    """The probe's answer is not one: the words say what came back."""


@dataclass(frozen=True)
class Port:
    what: str  # "admin API", "Raft", "gateway"
    host: str
    port: int
    free: bool = True
    error: str = ""


@dataclass(frozen=True)
class Facts:
    """What the probe found on the remote machine."""

    python: tuple[int, ...]
    executable: str
    hostname: str
    uid: int
    ports: tuple[Port, ...]
    reached: tuple[Port, ...]  # what it dialled: the control plane's admin API, a member's Raft (free: answered)
    disk_path: str
    disk_free: int
    credentials: bool  # STATE_DIR/tls/cert.pem: this machine already joined a cluster
    installed: bool  # the role's service is installed already
    systemd: bool
    unit: bool  # /etc/systemd/system/llmgw-ROLE.service
    time: float  # its clock (Unix time) when the probe read it

    @classmethod
    def parse(cls, text: str) -> Facts:
        lines = [line for line in text.strip().splitlines() if line.strip()]
        try:
            doc = json.loads(lines[-1]) if lines else None
            if not isinstance(doc, dict):
                raise ValueError("not an object")
            return cls(python=tuple(int(v) for v in doc["python"]), executable=str(doc["executable"]),
                       hostname=str(doc["hostname"]), uid=int(doc["uid"]),
                       ports=tuple(Port(str(p["what"]), str(p["host"]), int(p["port"]), bool(p["free"]),
                                        str(p["error"])) for p in doc["ports"]),
                       reached=tuple(Port(str(p["what"]), str(p["host"]), int(p["port"]), bool(p["free"]),
                                          str(p["error"])) for p in doc.get("reached", [])),
                       disk_path=str(doc["disk"]["path"]), disk_free=int(doc["disk"]["free"]),
                       credentials=bool(doc["credentials"]), installed=bool(doc["installed"]),
                       systemd=bool(doc["systemd"]), unit=bool(doc["unit"]), time=float(doc["time"]))
        except (ValueError, KeyError, TypeError, IndexError) as e:
            raise ProbeError(f"the probe's answer is not what it writes ({e}): {text.strip()[-300:]!r}") from None


def probe_input(*, role: str, dir: str, state_dir: str, services_dir: str, ports: Sequence[tuple[str, str, int]],
                reach: Sequence[tuple[str, str, int]], connect_s: float) -> str:
    """The probe's argument: what to look at there (`ports` to bind, `reach` to dial within `connect_s`)."""
    return json.dumps({"role": role, "dir": dir, "state_dir": state_dir, "services_dir": services_dir,
                       "ports": [list(p) for p in ports], "reach": [list(r) for r in reach], "connect_s": connect_s})


@dataclass(frozen=True)
class Problem:
    """One thing that stops the add: a code scripts read, words an operator reads."""

    code: str
    words: str

    def to_doc(self) -> dict[str, str]:
        return {"code": self.code, "words": self.words}


@dataclass(frozen=True)
class Known:
    """What the cluster already holds that a new machine must not be: node names (agents), gateways'
    names, machines' certificates (role, name), control planes' Raft addresses."""

    nodes: frozenset[str] = frozenset()
    gateways: frozenset[str] = frozenset()
    machines: frozenset[tuple[str, str]] = frozenset()
    members: frozenset[str] = frozenset()

    @classmethod
    def from_docs(cls, nodes: Any, members: Any, machines: Any) -> Known:
        """From the admin API's answers: GET /api/v1/nodes, /cluster/members, /trust/machines."""
        def names(rows: Any, key: str) -> frozenset[str]:
            return frozenset(str(r.get(key)) for r in rows or [] if isinstance(r, Mapping) and r.get(key))

        members = members if isinstance(members, Mapping) else {}
        machines = machines if isinstance(machines, Mapping) else {}
        return cls(nodes=names((nodes or {}).get("nodes") if isinstance(nodes, Mapping) else None, "node"),
                   gateways=names(members.get("gateways"), "name"),
                   machines=frozenset((str(m.get("role")), str(m.get("name"))) for m in machines.get("machines") or []
                                      if isinstance(m, Mapping) and not m.get("revoked")),
                   members=names(members.get("members"), "id"))


def clock_skew(remote: float, before: float, after: float) -> tuple[float, float]:
    """The remote clock's offset from ours, read by a probe sent at `before` and answered at `after` (our
    clock): (offset against the round trip's middle, the most that can be off by: half the round trip)."""
    return remote - (before + after) / 2, max(after - before, 0.0) / 2


def skew_problem(remote: float, before: float, after: float, limit_s: float) -> Problem | None:
    """A problem when the clocks are surely more than `limit_s` apart (beyond what the round trip leaves
    unknown): certificates and join tokens are judged by time."""
    offset, within = clock_skew(remote, before, after)
    if abs(offset) - within <= limit_s:
        return None
    return Problem("clock_skew", f"its clock is {abs(offset):.1f} s {'ahead of' if offset > 0 else 'behind'} this "
                                 f"machine's (more than {limit_s:g} s): certificates and join tokens are judged by "
                                 f"time; set up NTP (chrony, systemd-timesyncd) on both")


@dataclass(frozen=True)
class Asked:
    """What the add will do on the remote machine, as the judges need it."""

    role: str
    name: str  # the node's / gateway's name, or the control plane's Raft address
    dir: str
    state_dir: str
    need_bytes: int  # the zipapp's size, plus DISK_SPARE_BYTES
    skew_limit_s: float
    ports: tuple[tuple[str, str, int], ...] = field(default_factory=tuple)


def judge(facts: Facts, asked: Asked, known: Known, *, before: float, after: float) -> list[Problem]:
    """Every problem the probe's facts and the cluster's show, in the order an operator fixes them."""
    problems: list[Problem] = []
    if tuple(facts.python[:2]) < MIN_PYTHON:
        problems.append(Problem("python_too_old", f"{facts.executable} is Python {'.'.join(map(str, facts.python))}: "
                                                  f"llmgw needs {'.'.join(map(str, MIN_PYTHON))} or newer (give "
                                                  f"another with --remote-python)"))
    for p in facts.ports:
        if not p.free:
            problems.append(Problem("port_taken", f"the {p.what} port {p.host}:{p.port} is taken there ({p.error}): "
                                                  f"stop what holds it, or choose another port"))
    for r in facts.reached:
        if not r.free:
            problems.append(Problem("control_unreachable", f"it does not reach the {r.what} at {r.host}:{r.port} "
                                                           f"({r.error}): a firewall, a route, or an address only "
                                                           f"this machine knows (127.0.0.1?); give --control URL"))
    skew = skew_problem(facts.time, before, after, asked.skew_limit_s)
    if skew is not None:
        problems.append(skew)
    if facts.disk_free < asked.need_bytes:
        problems.append(Problem("disk_space", f"{facts.disk_path} has {facts.disk_free / 2**20:.0f} MiB free: "
                                              f"{asked.need_bytes / 2**20:.0f} MiB needed (the zipapp, unpacked "
                                              f"once, and logs)"))
    problems += already(facts, asked, known)
    return problems


def already(facts: Facts, asked: Asked, known: Known) -> list[Problem]:
    """The machine, or its name, already in the cluster (or in another one)."""
    out: list[Problem] = []
    if facts.credentials:
        out.append(Problem("already_joined", f"{asked.state_dir} already holds a machine certificate (tls/cert.pem): "
                                             f"this machine joined a cluster before; to add it again, remove it "
                                             f"first (`llmgw ctl nodes revoke`, then that state dir)"))
    elif facts.installed:
        services = f"{asked.dir}/services"
        out.append(Problem("already_installed", f"the {asked.role} service is installed there already (an earlier add "
                                                f"that did not finish?): `llmgw service status {asked.role} --dir "
                                                f"{services}` there says what it runs; to add it afresh, `llmgw "
                                                f"service stop {asked.role} --dir {services}` and remove "
                                                f"{services}/{asked.role}.json"))
    where = {"agent": known.nodes, "gateway": known.gateways, "control": known.members}[asked.role]
    if asked.name in where:
        what = {"agent": "a node", "gateway": "a gateway", "control": "a control plane"}[asked.role]
        out.append(Problem("name_known", f"the cluster already has {what} named {asked.name}: give another "
                                         f"name (--name), or forget the old one first"))
    elif (asked.role, asked.name) in known.machines:
        out.append(Problem("name_known", f"the cluster already holds a {asked.role} certificate for {asked.name}: "
                                         f"give another name (--name), or revoke it first (`llmgw ctl nodes revoke "
                                         f"{asked.name} --role {asked.role}`)"))
    return out
