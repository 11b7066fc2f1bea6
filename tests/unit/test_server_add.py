"""`llmgw server add`'s parts that decide: how ssh's failures are read, the clock judge (a property), every
problem judged at once, the probe (run here, by this Python, and parsed by an old one's grammar), the ssh
command line, the role's flags; and the operation with the remote machine at the world's edge (`LocalShell`:
this machine) and the admin API answered by `httpx.MockTransport`: a refused add runs nothing but the probe.
The operation against a real sshd: tests/integration/test_server_add_ssh.py."""

from __future__ import annotations

import ast
import json
import shlex
import socket
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from hypothesis import assume, given, strategies as st

from llmgw.domain.timeouts import TIMEOUTS
from llmgw.remote.admin import AdminApi
from llmgw.remote.preflight import PROBE, Asked, Facts, Known, Port, clock_skew, judge, probe_input, skew_problem
from llmgw.remote.server_add import AddFailed, AddRequest, Event, ServerAdd, dials, mirror_check, role_flags
from llmgw.remote.ssh import SshShell, SshTarget, check_target, classify
from llmgw.testing.remote import LocalShell

# What OpenSSH 9 prints, one line per way it fails.
SSH_SAYS = {
    "ssh: connect to host 10.0.0.7 port 22: Connection refused": "refused",
    "root@10.0.0.7: Permission denied (publickey).": "auth",
    "ssh: connect to host 10.0.0.7 port 22: No route to host": "unreachable",
    "ssh: connect to host 10.0.0.7 port 22: Connection timed out": "unreachable",
    "ssh: Could not resolve hostname nowhere: Name or service not known": "unreachable",
    "Host key verification failed.": "host_key",
    "@@@ WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! @@@": "host_key",
    "kex_exchange_identification: read: Connection reset by peer": "unreachable",
    "something else entirely": "ssh",
}


@pytest.mark.parametrize("said, kind", SSH_SAYS.items())
def test_what_ssh_says_is_read_as_a_kind_of_failure(said: str, kind: str) -> None:
    assert classify(said) == kind


def test_a_target_is_user_at_host() -> None:
    assert check_target("root@10.0.0.7") is None
    for wrong in ("10.0.0.7", "root@", "@host", "-oProxyCommand=x@h", "a b@c"):
        assert check_target(wrong) is not None, wrong


def test_ssh_is_never_interactive_bounded_and_checks_host_keys_as_told() -> None:
    shell = SshShell(SshTarget("root@10.0.0.7", port=2222, identity=Path("/k"), options=("Ciphers=aes128-ctr",),
                               known_hosts=Path("/kh")), connect_timeout_s=4.2)
    argv = shell.ssh_argv(["python3", "-c", "print('a b')", "x;y"])
    joined = " ".join(argv)
    for option in ("BatchMode=yes", "ConnectTimeout=5", "StrictHostKeyChecking=accept-new", "UserKnownHostsFile=/kh",
                   "Ciphers=aes128-ctr", "-i /k", "-p 2222"):
        assert option in joined, option
    assert argv[-3:-1] == ["--", "root@10.0.0.7"]
    assert shlex.split(argv[-1]) == ["python3", "-c", "print('a b')", "x;y"], "each argument reaches the remote whole"
    scp = shell.scp_argv(Path("/tmp/llmgw.pyz"), "/var/lib/llmgw/llmgw.pyz")
    assert "-P" in scp and scp[-1] == "root@10.0.0.7:/var/lib/llmgw/llmgw.pyz" and "BatchMode=yes" in scp


# --- the clock ------------------------------------------------------------------------------------


@given(offset=st.floats(-100, 100), before=st.floats(1e9, 2e9), rtt=st.floats(0, 5), at=st.floats(0, 1),
       limit=st.floats(0.5, 5))
def test_the_clock_judge_never_refuses_clocks_within_the_limit_and_always_those_far_apart(
        offset: float, before: float, rtt: float, at: float, limit: float) -> None:
    after = before + rtt
    remote = before + at * rtt + offset  # the remote read its clock some time within the round trip
    problem = skew_problem(remote, before, after, limit)
    if abs(offset) <= limit - 1e-6:  # (Unix times near 1e9 carry ~1e-7 s of rounding)
        assert problem is None
    if abs(offset) > limit + rtt + 1e-6:
        assert problem is not None and problem.code == "clock_skew"
    measured, within = clock_skew(remote, before, after)
    assert abs(measured - offset) <= within + 1e-6


# --- every problem at once -------------------------------------------------------------------------


def facts(**changes: Any) -> Facts:
    base: dict[str, Any] = dict(python=(3, 11, 2), executable="/usr/bin/python3", hostname="gpu-07", uid=0, ports=(), reached=(),
                                disk_path="/var", disk_free=10 * 2**30, credentials=False, installed=False,
                                systemd=False, unit=False, time=1000.0)
    return Facts(**{**base, **changes})


ASKED = Asked("agent", "gpu-07", "/var/lib/llmgw", "/var/lib/llmgw/agent", 2**30, 2.0)


def test_a_machine_that_fits_has_no_problem() -> None:
    assert judge(facts(), ASKED, Known(), before=999.9, after=1000.1) == []


def test_every_problem_is_said_at_once() -> None:
    bad = facts(python=(3, 9, 18), ports=(Port("gateway", "0.0.0.0", 8080, False, "Address already in use"),),
                disk_free=2**20, credentials=True, time=1010.0)
    problems = judge(bad, ASKED, Known(nodes=frozenset({"gpu-07"})), before=999.9, after=1000.1)
    assert [p.code for p in problems] == ["python_too_old", "port_taken", "clock_skew", "disk_space",
                                          "already_joined", "name_known"]
    words = " ".join(p.words for p in problems)
    for said in ("3.9.18", "0.0.0.0:8080", "Address already in use", "ahead", "1 MiB free", "gpu-07"):
        assert said in words, said


@given(minor=st.integers(6, 13), taken=st.lists(st.booleans(), max_size=3), unreached=st.lists(st.booleans(), max_size=3),
       ahead=st.floats(-60, 60), free_mib=st.integers(0, 4096), joined=st.booleans(), installed=st.booleans(),
       known=st.booleans())
def test_every_failing_check_is_one_problem_and_no_other(minor: int, taken: list[bool], unreached: list[bool],
                                                         ahead: float, free_mib: int, joined: bool, installed: bool,
                                                         known: bool) -> None:
    assume(abs(abs(ahead) - 2.1) > 1e-6)  # the clock's own boundary (limit + half the round trip) has its own test
    found = facts(python=(3, minor, 0), ports=tuple(Port("p", "h", 1000 + i, not t, "in use" if t else "")
                                                  for i, t in enumerate(taken)),
                  reached=tuple(Port("admin API", "c", 8081, not u, "refused" if u else "") for u in unreached),
                  time=1000.0 + ahead, disk_free=free_mib * 2**20, credentials=joined, installed=installed)
    asked = Asked("agent", "gpu-07", "/d", "/d/agent", 1024 * 2**20, 2.0)
    codes = [p.code for p in judge(found, asked, Known(nodes=frozenset({"gpu-07"} if known else ())),
                                   before=999.9, after=1000.1)]
    expected = (["python_too_old"] * (minor < 11) + ["port_taken"] * sum(taken) +
                ["control_unreachable"] * sum(unreached) + ["clock_skew"] * (abs(ahead) - 0.1 > 2.0) +
                ["disk_space"] * (free_mib < 1024) + ["already_joined"] * joined +
                ["already_installed"] * (installed and not joined) + ["name_known"] * known)
    assert codes == expected


def test_a_name_the_cluster_holds_a_certificate_for_or_a_member_is_known() -> None:
    known = Known.from_docs({"nodes": []}, {"members": [{"id": "10.0.0.2:7000"}], "gateways": [{"name": "gw"}]},
                            {"machines": [{"role": "agent", "name": "gpu-07", "revoked": False},
                                          {"role": "agent", "name": "gone", "revoked": True}]})
    assert [p.code for p in judge(facts(), ASKED, known, before=1000, after=1000)] == ["name_known"]
    gone = Asked("agent", "gone", "/d", "/d/agent", 1, 2.0)
    assert judge(facts(), gone, known, before=1000, after=1000) == []
    control = Asked("control", "10.0.0.2:7000", "/d", "/d/control", 1, 2.0)
    assert [p.code for p in judge(facts(), control, known, before=1000, after=1000)] == ["name_known"]
    installed = judge(facts(installed=True), gone, known, before=1000, after=1000)
    assert [p.code for p in installed] == ["already_installed"]


# --- the probe ---------------------------------------------------------------------------------------


def test_the_probe_parses_in_an_old_pythons_grammar() -> None:
    ast.parse(PROBE, feature_version=(3, 4))  # no f-strings, no walrus: an old Python still says its version


def test_the_probe_run_here_says_what_it_finds(tmp_path: Path) -> None:
    (tmp_path / "agent" / "tls").mkdir(parents=True)
    (tmp_path / "agent" / "tls" / "cert.pem").write_text("x")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with socket.socket() as closed:
            closed.bind(("127.0.0.1", 0))
            nobody = closed.getsockname()[1]  # bound, not listening: a connect is refused
            given = probe_input(role="agent", dir=str(tmp_path / "not" / "yet"), state_dir=str(tmp_path / "agent"),
                                services_dir=str(tmp_path / "services"), ports=[("gateway", "127.0.0.1", port)],
                                reach=[("admin API", "127.0.0.1", port), ("Raft", "127.0.0.1", nobody)],
                                connect_s=TIMEOUTS.agent_connect_s)
            import subprocess

            done = subprocess.run([sys.executable, "-c", PROBE, given], capture_output=True, text=True, timeout=60)
    found = Facts.parse(done.stdout)
    assert found.python[:2] == sys.version_info[:2] and found.credentials and not found.installed
    assert found.disk_path == str(tmp_path) and found.disk_free > 0
    assert [(p.port, p.free) for p in found.ports] == [(port, False)] and found.ports[0].error
    assert [(r.what, r.free) for r in found.reached] == [("admin API", True), ("Raft", False)]
    assert [p.code for p in judge(found, ASKED, Known(), before=found.time, after=found.time)] == [
        "port_taken", "control_unreachable", "already_joined"]


# --- the role's flags --------------------------------------------------------------------------------


def test_each_role_gets_the_flags_its_command_takes(tmp_path: Path) -> None:
    pyz = tmp_path / "llmgw.pyz"
    agent = role_flags(AddRequest("agent", "10.0.0.7", pyz, storage=("/m:nfs",)), "gpu-07", ["https://c:8081"], [],
                       "sha256:ab")
    assert agent == ["--control", "https://c:8081", "--state-dir", "/var/lib/llmgw/agent", "--ca-hash", "sha256:ab",
                     "--node", "gpu-07", "--engine-host", "10.0.0.7", "--storage", "/m:nfs"]
    control = role_flags(AddRequest("control", "10.0.0.2", pyz, cluster_secret="s", floating_address="10.0.0.100/24",
                                    floating_interface="eth0"), "10.0.0.2:7000", ["https://c:8081"], ["10.0.0.1:7000"],
                         "sha256:ab")
    assert control[:6] == ["--state-dir", "/var/lib/llmgw/control", "--raft-addr", "10.0.0.2:7000", "--admin-addr",
                           "10.0.0.2:8081"]
    for pair in (["--join-via", "https://c:8081"], ["--peer", "10.0.0.1:7000"], ["--floating-interface", "eth0"]):
        assert any(control[i:i + 2] == pair for i in range(len(control))), pair
    assert "--join" in control and "--join-token" not in control, "the token goes in the environment, not a flag"


def test_a_wrong_request_is_said_before_anyone_is_asked(tmp_path: Path) -> None:
    wrong = AddRequest("control", "h", tmp_path / "none.pyz", dir="rel", listen="nope")
    said = " ".join(wrong.problems())
    for words in ("absolute path", "--listen", "group's secret", "no such file"):
        assert words in said, words
    assert "--floating-address is for a control plane" in " ".join(
        AddRequest("agent", "h", tmp_path, floating_address="1.2.3.4/24").problems())


# --- the operation, the remote machine being this one ------------------------------------------------------


def admin_answering(calls: list[tuple[str, str]]) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        calls.append((request.method, request.url.path))
        docs = {"/api/v1/cluster/members": {"leader": "10.0.0.1:7000", "members": [
                    {"id": "10.0.0.1:7000", "admin_url": "https://10.0.0.1:8081"}], "gateways": []},
                "/api/v1/nodes": {"nodes": [{"node": "gpu-07"}]},
                "/api/v1/trust/machines": {"machines": []}}
        if request.method == "GET" and request.url.path in docs:
            return httpx.Response(200, json=docs[request.url.path])
        return httpx.Response(500, json={"error": {"code": "unexpected", "message": request.url.path}})

    return httpx.MockTransport(handler)


def test_a_refused_add_asks_the_machine_only_its_probe_and_the_cluster_only_reads(tmp_path: Path) -> None:
    pyz = tmp_path / "llmgw.pyz"
    pyz.write_bytes(b"PK")
    calls: list[tuple[str, str]] = []
    shell = LocalShell()
    events: list[Event] = []
    req = AddRequest("agent", "127.0.0.1", pyz, name="gpu-07", dir=str(tmp_path / "remote"), python=sys.executable)

    async def main() -> None:
        api = AdminApi("https://10.0.0.1:8081", "k", verify=True, timeout_s=5, transport=admin_answering(calls))
        with pytest.raises(AddFailed) as refused:
            await ServerAdd(req, shell, api, events.append, TIMEOUTS).run()
        assert [p.code for p in refused.value.problems] == ["name_known"]

    trio.run(main)
    assert len(shell.ran) == 1 and shell.ran[0][:2] == [sys.executable, "-c"] and shell.copied == []
    assert {m for m, _ in calls} == {"GET"}
    assert [(e.step, e.status) for e in events] == [("cluster", "ok"), ("ssh", "ok"), ("mirror", "ok"),
                                                     ("check", "problem")]
    assert not (tmp_path / "remote").exists()


def test_ssh_refused_is_one_problem_and_the_cluster_is_only_read(tmp_path: Path) -> None:
    pyz = tmp_path / "llmgw.pyz"
    pyz.write_bytes(b"PK")
    calls: list[tuple[str, str]] = []
    events: list[Event] = []
    req = AddRequest("agent", "127.0.0.1", pyz, name="n", dir=str(tmp_path / "remote"))

    async def main() -> None:
        api = AdminApi("https://10.0.0.1:8081", "k", verify=True, timeout_s=5, transport=admin_answering(calls))
        with pytest.raises(AddFailed) as refused:
            await ServerAdd(req, LocalShell(refuse="refused"), api, events.append, TIMEOUTS).run()
        assert [p.code for p in refused.value.problems] == ["ssh_refused"]

    trio.run(main)
    assert {m for m, _ in calls} == {"GET"} and [e.to_doc().get("code") for e in events] == [None, "ssh_refused"]
    assert json.dumps(events[0].to_doc())


def test_service_install_takes_the_environment_from_stdin_off_the_command_line(tmp_path: Path,
                                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from llmgw.cli.service import install

    monkeypatch.setattr(sys, "stdin", io.StringIO("LLMGW_JOIN_TOKEN=llmgw-join-secret\n\n"))
    assert install("agent", ["--state-dir", "/d"], dir=tmp_path, env=["A=1"], env_stdin=True) == 0
    doc = json.loads((tmp_path / "agent.json").read_text())
    assert doc["env"] == {"A": "1", "LLMGW_JOIN_TOKEN": "llmgw-join-secret"} and doc["args"] == ["--state-dir", "/d"]
    monkeypatch.setattr(sys, "stdin", io.StringIO("not a pair\n"))
    assert install("agent", [], dir=tmp_path, env_stdin=True) == 2


def test_the_machine_must_reach_every_control_url_and_a_control_plane_every_members_raft() -> None:
    assert dials(["https://10.0.0.1:8081", "https://cp.example", "http://[fd00::1]:9"], ["10.0.0.1:7000", "bad"]) == [
        ("admin API", "10.0.0.1", 8081), ("admin API", "cp.example", 443), ("admin API", "fd00::1", 9),
        ("Raft", "10.0.0.1", 7000)]


def test_auto_runs_the_role_under_systemd_only_where_its_unit_reads_the_services(tmp_path: Path) -> None:
    events: list[Event] = []

    def manager(dir: str, **found: Any) -> str:
        req = AddRequest("agent", "h", tmp_path, dir=dir)
        api = AdminApi("https://x", "k", verify=True, timeout_s=1)
        return ServerAdd(req, LocalShell(), api, events.append, TIMEOUTS).manager(facts(**found))

    assert manager("/var/lib/llmgw", systemd=True, unit=True) == "systemd"
    assert manager("/var/lib/llmgw", systemd=False, unit=False) == "builtin" and events == []
    assert manager("/var/lib/llmgw", systemd=True, unit=False) == "builtin"
    assert "llmgw-agent.service is not installed" in events[-1].words
    assert manager("/opt/llmgw", systemd=True, unit=True) == "builtin"
    assert "reads /var/lib/llmgw/services, not /opt/llmgw/services" in events[-1].words


# --- what the model mirror will make of the machine (docs/mirror.md, "Who may fetch") -----------------------


def test_server_add_says_beforehand_when_the_mirror_would_refuse_the_machine() -> None:
    controls = ["https://10.0.0.1:8081", "https://10.0.0.2:8081"]
    reached = (Port("admin API", "10.0.0.1", 8081), Port("admin API", "10.0.0.2", 8081))
    status, words = mirror_check("agent", controls, facts(reached=reached))
    assert status == "ok" and "will serve it" in words and "certificate" in words
    cut = (Port("admin API", "10.0.0.1", 8081, free=False, error="refused"),
           Port("admin API", "10.0.0.2", 8081, free=False, error="timed out"))
    status, words = mirror_check("agent", controls, facts(reached=cut))
    assert status == "note" and "would refuse it" in words and "10.0.0.2:8081" in words
    status, words = mirror_check("agent", controls, facts(reached=(reached[0], cut[1])))
    assert status == "note" and "not from 10.0.0.2:8081" in words
    status, words = mirror_check("agent", ["http://127.0.0.1:8081"], facts(reached=reached[:1]))
    assert status == "note" and "plain HTTP" in words
    assert "will not serve" in mirror_check("gateway", controls, facts(reached=reached))[1]
