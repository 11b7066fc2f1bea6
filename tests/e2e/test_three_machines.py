"""docs/quickstart.md's three-machine example, run as written, on loopback: each `sh` block of
"## Three machines" runs in bash as the machine its first line names (`# on 10.0.0.N`), with
that machine's addresses and paths turned into its own loopback ports and a state dir of its
own, and `scp` a local copy (no ssh between the "machines"). The doc and the test cannot
drift: change a command there and it runs changed here. Then every gateway answers a chat."""

from __future__ import annotations

import os
import re
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.processes import free_port, kill_engines_under

pytestmark = pytest.mark.slow

DOC = Path(__file__).parents[2] / "docs" / "quickstart.md"
SECTION = "## Three machines"
ADMIN_KEY, CLIENT_KEY = "sk-admin-three-machines", "sk-client-three-machines"
PATHS = ("var/lib/llmgw", "etc/llmgw")  # the doc's absolute paths, each machine's own


def blocks() -> list[tuple[str, str]]:
    """(the first line, the text) of each `sh` block of the section."""
    text = DOC.read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    section = text[start:end if end != -1 else len(text)]
    return [(m.group(1).splitlines()[0], m.group(1)) for m in re.finditer(r"^```sh\n(.*?)^```", section, re.M | re.S)]


class Machines:
    """Where each of the doc's machines lives here: ports for its HOST:PORTs, a dir for its paths."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ports: dict[tuple[str, str], int] = {}

    def port(self, machine: str, port: str) -> int:
        return self.ports.setdefault((machine, port), free_port())

    def url(self, machine: str, port: str) -> str:
        """The doc's admin API (8081) serves TLS; its gateways (8080) plain HTTP."""
        return f"{'https' if port == '8081' else 'http'}://127.0.0.1:{self.port(machine, port)}"

    def local(self, script: str, machine: str) -> str:
        # scp's source: a path on another machine, by its address.
        script = re.sub(r"\b10\.0\.0\.(\d+):(/\S+)", lambda m: f"{self.root}/m{m.group(1)}{m.group(2)}", script)
        # This machine's own paths (not those just made local: they follow a word character).
        script = re.sub(r"(?<![\w./-])/(" + "|".join(map(re.escape, PATHS)) + ")",
                        lambda m: f"{self.root}/m{machine}/{m.group(1)}", script)
        script = re.sub(r"\b10\.0\.0\.(\d+):(\d+)\b", lambda m: f"127.0.0.1:{self.port(m.group(1), m.group(2))}",
                        script)
        return re.sub(r"\b10\.0\.0\.\d+\b", "127.0.0.1", script)  # --engine-host


def run_block(machines: Machines, first: str, text: str, log: Path, *, background: bool) -> subprocess.Popen[bytes]:
    found = re.search(r"10\.0\.0\.(\d+)", first)
    machine = found.group(1) if found else "0"  # "from any machine": it names no path of its own
    script = "scp() { cp \"$@\"; }\nset -e\n" + machines.local(text, machine)
    assert "10.0.0." not in script and not re.search(r"(?<![\w./-])/(var|etc)/", script), script  # nothing real
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "ADMIN_KEY": ADMIN_KEY, "CLIENT_KEY": CLIENT_KEY}
    with log.open("ab") as out:
        # Its own session: what the block starts in the background stays in its process group.
        return subprocess.Popen(["bash", "-c", script], stdout=out if background else subprocess.PIPE,
                                stderr=out, env=env, start_new_session=True)


def wait_for(what: str, probe: Callable[[], Any], timeout: float, logs: list[Path], seen: Any = None) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            found = probe()
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            found = None
        if found:
            return found
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in logs if p.exists())
            raise AssertionError(f"{what} not within {timeout:g} s (last seen: {seen})\n{tails}")
        time.sleep(0.1)


def living(pgid: int) -> list[int]:
    """The processes of a group that still run (orphans that exited wait as zombies for init)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            found.append(int(stat.parent.name))
    return found


def stop_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 15
    while living(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if living(pgid):
        os.killpg(pgid, signal.SIGKILL)


@pytest.fixture
def groups(tmp_path: Path) -> Iterator[list[int]]:
    started: list[int] = []
    yield started
    for pgid in started:
        stop_group(pgid)
    # The quickstart's agents keep their engines when they stop (the next agent adopts them):
    # once the machines are gone, so are their engines.
    kill_engines_under(tmp_path)


def test_the_quickstart_three_machines_run_as_written(tmp_path: Path, groups: list[int]) -> None:
    found = blocks()
    assert [first for first, _ in found] == ["# on 10.0.0.1", "# on 10.0.0.2", "# on 10.0.0.3",
                                             "# on 10.0.0.1", "# on 10.0.0.2", "# on 10.0.0.3",
                                             "# from any machine"], "the section's blocks changed: update the test"
    machines = Machines(tmp_path)
    logs = [tmp_path / f"m{i}.log" for i in (1, 2, 3)]
    controls, joins, (first_line, client) = found[:3], found[3:6], found[6]
    for (first, text), log in zip(controls, logs, strict=True):
        if first.endswith("10.0.0.2"):  # the others copy the secret machine 1 made: once it exists
            wait_for("machine 1's cluster secret", (tmp_path / "m1/var/lib/llmgw/control/cluster.secret").exists,
                     20, logs)
        block = run_block(machines, first, text, log, background=True)
        groups.append(block.pid)
        assert block.wait(10) == 0, log.read_text()  # the block itself only starts the roles

    admin = machines.url("1", "8081")
    # The doc's cluster has a CA of its own (not the tests' root): the test trusts what machine 1 keeps.
    bundle = tmp_path / "m1/var/lib/llmgw/control/tls/ca.pem"
    seen: list[Any] = []

    def get(url: str) -> Any:
        return httpx.get(url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=5,
                         verify=ssl.create_default_context(cafile=str(bundle))).json()

    def members_healthy() -> bool:
        doc = get(admin + "/api/v1/cluster/members")
        seen[:] = [doc]
        return len(doc["members"]) == 3 and all(m["state"] == "healthy" for m in doc["members"])

    # As the doc says: the machines join once the group has a leader (and so its CA).
    wait_for("three healthy members", lambda: bundle.exists() and members_healthy(), 30, logs, seen=seen)
    for (first, text), log in zip(joins, logs, strict=True):
        block = run_block(machines, first, text, log, background=True)
        groups.append(block.pid)
        assert block.wait(30) == 0, log.read_text()  # the block makes two tokens, then starts the roles

    def settled() -> bool:
        doc = get(admin + "/api/v1/cluster/members")
        seen[:] = [doc]
        return (len(doc["members"]) == 3 and all(m["state"] == "healthy" for m in doc["members"])
                and sorted(a["node"] for a in doc["agents"] if a["connected"]) == ["node-1", "node-2", "node-3"]
                and len([g for g in doc["gateways"] if g["connected"]]) == 3)
    wait_for("three healthy members, three agents and three gateways with the leader", settled, 30, logs,
             seen=seen)

    done = run_block(machines, first_line, client, tmp_path / "client.log", background=False)
    groups.append(done.pid)
    out, _ = done.communicate(timeout=60)
    assert done.returncode == 0, (out.decode(), (tmp_path / "client.log").read_text())
    text = out.decode()
    assert '"content": "sim says: hello"' in text or '"content":"sim says: hello"' in text, text
    assert "GATEWAYS" in text and "AGENTS" in text and "floating address: not configured" in text, text

    # Every machine's gateway answers, from whichever engine it routes to.
    for m in ("1", "2", "3"):
        r = httpx.post(machines.url(m, "8080") + "/v1/chat/completions", timeout=30,
                       headers={"Authorization": f"Bearer {CLIENT_KEY}"},
                       json={"model": "echo", "messages": [{"role": "user", "content": f"via machine {m}"}]})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == f"sim says: via machine {m}"
    # One replica on each machine, as the doc says.
    model = get(admin + "/api/v1/models/echo")["model"]
    assert sorted(r["node"] for r in model["status"]["replicas"]) == ["node-1", "node-2", "node-3"], model
