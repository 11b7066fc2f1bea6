"""`Systemd`, the ServiceManager over `systemctl`: each state `systemctl show` reports (outputs as
systemd 252 prints them) mapped to a ServiceStatus, the failures, the exact command lines; and the
units in docs/systemd/: what each must say, and `systemd-analyze verify` where it is installed."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from llmgw.domain.timeouts import TIMEOUTS
from llmgw.interfaces import ServiceManager
from llmgw.service.manager import ServiceError
from llmgw.service.spec import SERVICE_ROLES
from llmgw.service.systemd import PROPERTIES, Systemd, parse_show, unit

REPO = Path(__file__).resolve().parents[2]
UNITS = REPO / "docs" / "systemd"

WALL, MONO = 1_700_000_000.0, 100_000.0  # the test's clocks: Unix time and CLOCK_MONOTONIC, in seconds

# `systemctl show llmgw-ROLE.service --property=...` as systemd prints it: its own order, not the asked one.
RUNNING = """\
Result=success
NRestarts=2
MainPID=41872
ExecMainStartTimestampMonotonic=91234567890
ExecMainExitTimestampMonotonic=0
ExecMainCode=0
ExecMainStatus=0
LoadState=loaded
ActiveState=active
SubState=running
"""
AUTO_RESTART = """\
Result=exit-code
NRestarts=3
MainPID=0
ExecMainStartTimestampMonotonic=99990000000
ExecMainExitTimestampMonotonic=99998000000
ExecMainCode=1
ExecMainStatus=1
LoadState=loaded
ActiveState=activating
SubState=auto-restart
"""
STOPPED = """\
Result=success
NRestarts=0
MainPID=0
ExecMainStartTimestampMonotonic=90000000000
ExecMainExitTimestampMonotonic=95000000000
ExecMainCode=1
ExecMainStatus=0
LoadState=loaded
ActiveState=inactive
SubState=dead
"""
NEVER_STARTED = """\
Result=success
NRestarts=0
MainPID=0
ExecMainStartTimestampMonotonic=0
ExecMainExitTimestampMonotonic=0
ExecMainCode=0
ExecMainStatus=0
LoadState=loaded
ActiveState=inactive
SubState=dead
"""
FAILED_KILLED = """\
Result=signal
NRestarts=0
MainPID=0
ExecMainStartTimestampMonotonic=90000000000
ExecMainExitTimestampMonotonic=95000000000
ExecMainCode=2
ExecMainStatus=9
LoadState=loaded
ActiveState=failed
SubState=failed
"""
FAILED_DUMPED = FAILED_KILLED.replace("Result=signal", "Result=core-dump").replace("ExecMainCode=2", "ExecMainCode=3") \
    .replace("ExecMainStatus=9", "ExecMainStatus=11")
START_LIMIT = """\
Result=start-limit-hit
NRestarts=9
MainPID=0
ExecMainStartTimestampMonotonic=99990000000
ExecMainExitTimestampMonotonic=99990400000
ExecMainCode=1
ExecMainStatus=1
LoadState=loaded
ActiveState=failed
SubState=failed
"""
NOT_FOUND = """\
Result=success
NRestarts=0
MainPID=0
ExecMainStartTimestampMonotonic=0
ExecMainExitTimestampMonotonic=0
ExecMainCode=0
ExecMainStatus=0
LoadState=not-found
ActiveState=inactive
SubState=dead
"""
STOPPING = RUNNING.replace("ActiveState=active", "ActiveState=deactivating").replace("SubState=running",
                                                                                     "SubState=stop-sigterm")
STARTING = NEVER_STARTED.replace("ActiveState=inactive", "ActiveState=activating").replace("SubState=dead",
                                                                                          "SubState=start")
ACTIVE_NO_PID = RUNNING.replace("MainPID=41872", "MainPID=0")
BAD_SETTING = NEVER_STARTED.replace("LoadState=loaded", "LoadState=bad-setting")
MASKED_STOPPED = STOPPED.replace("LoadState=loaded", "LoadState=masked")
# systemctl in a container whose PID 1 is not systemd (this repo's CI): status 1, these words.
NO_SYSTEMD = ("System has not been booted with systemd as init system (PID 1). Can't operate.\n"
              "Failed to connect to bus: Host is down\n")
NOT_LOADED_START = "Failed to start llmgw-agent.service: Unit llmgw-agent.service not found.\n"
JOB_FAILED = ('Job for llmgw-control.service failed because the control process exited with error code.\n'
              'See "systemctl status llmgw-control.service" and "journalctl -xeu llmgw-control.service" for details.\n')


class FakeSystemctl:
    """The world's edge: each command line recorded, answered from a script (argv[1] -> answer)."""

    def __init__(self, show: str = RUNNING,
                 answers: dict[str, subprocess.CompletedProcess[str] | BaseException] | None = None) -> None:
        self.show = show
        self.answers = dict(answers or {})
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        self.calls.append(argv)
        answer = self.answers.get(argv[1])
        if isinstance(answer, BaseException):
            raise answer
        if answer is not None:
            return answer
        if argv[1] == "show":
            return subprocess.CompletedProcess(argv, 0, self.show, "")
        return subprocess.CompletedProcess(argv, 0, "", "")


def manager(fake: FakeSystemctl) -> Systemd:
    return Systemd(fake, wall=lambda: WALL, monotonic=lambda: MONO)


def failing(code: int, stderr: str) -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess(["systemctl"], code, "", stderr)


SHOW = ["systemctl", "show", "llmgw-control.service",
        "--property=LoadState,ActiveState,SubState,Result,MainPID,NRestarts,ExecMainCode,ExecMainStatus,"
        "ExecMainStartTimestampMonotonic,ExecMainExitTimestampMonotonic"]


def test_status_asks_systemctl_show_for_the_roles_unit() -> None:
    fake = FakeSystemctl(RUNNING)
    m: ServiceManager = manager(fake)  # mypy holds it to the seam
    m.status("control")
    assert fake.calls == [SHOW]
    assert unit("agent") == "llmgw-agent.service"
    assert set(PROPERTIES) >= {"ActiveState", "SubState", "MainPID", "NRestarts", "ExecMainStartTimestampMonotonic",
                               "ExecMainStatus", "ExecMainCode", "LoadState", "Result"}


def test_running_has_its_pid_restarts_and_wall_time_start() -> None:
    st = manager(FakeSystemctl(RUNNING)).status("control")
    assert (st.state, st.manager, st.pid, st.restarts, st.last_exit, st.words) == \
        ("running", "systemd", 41872, 2, "", "")
    assert st.since == pytest.approx(WALL - (MONO - 91234.567890))


def test_reloading_is_running() -> None:
    st = manager(FakeSystemctl(RUNNING.replace("ActiveState=active", "ActiveState=reloading")
                               .replace("SubState=running", "SubState=reload"))).status("gateway")
    assert (st.state, st.pid) == ("running", 41872)


def test_auto_restart_is_restarting_with_how_the_last_process_ended() -> None:
    st = manager(FakeSystemctl(AUTO_RESTART)).status("agent")
    assert (st.state, st.pid, st.restarts, st.last_exit) == ("restarting", None, 3, "exit 1")
    assert st.since == pytest.approx(WALL - (MONO - 99998.0))  # when it exited
    assert "journalctl -u llmgw-agent.service" in st.words


def test_auto_restart_queued_of_newer_systemd_is_restarting() -> None:
    st = manager(FakeSystemctl(AUTO_RESTART.replace("SubState=auto-restart", "SubState=auto-restart-queued"))) \
        .status("agent")
    assert st.state == "restarting"


def test_stopped_says_when_and_how_it_ended() -> None:
    st = manager(FakeSystemctl(STOPPED)).status("control")
    assert (st.state, st.pid, st.restarts, st.last_exit, st.words) == ("stopped", None, 0, "exit 0", "")
    assert st.since == pytest.approx(WALL - (MONO - 95000.0))


def test_never_started_is_stopped_with_nothing_made_up() -> None:
    st = manager(FakeSystemctl(NEVER_STARTED)).status("control")
    assert (st.state, st.since, st.last_exit, st.words) == ("stopped", None, "", "")


@pytest.mark.parametrize(("show", "last_exit", "result"), [
    (FAILED_KILLED, "signal SIGKILL", "signal"),
    (FAILED_DUMPED, "signal SIGSEGV (core dumped)", "core-dump"),
    (START_LIMIT, "exit 1", "start-limit-hit"),
])
def test_failed_is_stopped_with_the_result_and_where_the_log_is(show: str, last_exit: str, result: str) -> None:
    st = manager(FakeSystemctl(show)).status("gateway")
    assert (st.state, st.last_exit) == ("stopped", last_exit)
    assert f"failed: {result}" in st.words
    assert "journalctl -u llmgw-gateway.service" in st.words
    if result == "start-limit-hit":
        assert "systemctl reset-failed" in st.words


def test_an_unknown_unit_is_not_installed() -> None:
    st = manager(FakeSystemctl(NOT_FOUND)).status("agent")
    assert st.state == "not installed"
    assert "docs/systemd/llmgw-agent.service" in st.words


def test_masked_says_so() -> None:
    st = manager(FakeSystemctl(MASKED_STOPPED)).status("agent")
    assert st.state == "stopped"
    assert "systemctl unmask llmgw-agent.service" in st.words


@pytest.mark.parametrize(("show", "said"), [
    (STOPPING, "deactivating (stop-sigterm)"),
    (STARTING, "activating (start)"),
    (ACTIVE_NO_PID, "no main process"),
    (BAD_SETTING, "LoadState=bad-setting"),
    ("", "LoadState=?"),  # nothing at all: never read as stopped
])
def test_what_the_properties_do_not_settle_is_unknown(show: str, said: str) -> None:
    st = manager(FakeSystemctl(show)).status("control")
    assert st.state == "unknown"
    assert said in st.words


@pytest.mark.parametrize(("answer", "said"), [
    (failing(1, NO_SYSTEMD), "status 1: System has not been booted with systemd as init system (PID 1). "
                             "Can't operate. Failed to connect to bus: Host is down"),
    (subprocess.TimeoutExpired(["systemctl"], 20.0), "status 124: no answer within 20 s"),
    (FileNotFoundError(2, "No such file or directory"), "cannot run systemctl: No such file or directory"),
])
def test_a_failing_systemctl_is_unknown_in_its_own_words(answer: subprocess.CompletedProcess[str] | BaseException,
                                                          said: str) -> None:
    st = manager(FakeSystemctl(answers={"show": answer})).status("control")
    assert (st.state, st.pid, st.since) == ("unknown", None, None)
    assert said in st.words


@pytest.mark.parametrize("verb", ["start", "stop", "restart"])
def test_each_verb_runs_systemctl_then_reads_the_status(verb: str) -> None:
    fake = FakeSystemctl(RUNNING if verb != "stop" else STOPPED)
    st = getattr(manager(fake), verb)("control")
    assert fake.calls == [["systemctl", verb, "llmgw-control.service"], SHOW]
    assert st.state == ("stopped" if verb == "stop" else "running")


def test_a_start_of_a_missing_unit_says_how_to_install_it() -> None:
    fake = FakeSystemctl(answers={"start": failing(5, NOT_LOADED_START)})
    with pytest.raises(ServiceError) as e:
        manager(fake).start("agent")
    assert "`systemctl start llmgw-agent.service` failed (status 5: Failed to start llmgw-agent.service: " \
           "Unit llmgw-agent.service not found.)" in str(e.value)
    assert "copy docs/systemd/llmgw-agent.service to /etc/systemd/system/" in str(e.value)
    assert fake.calls == [["systemctl", "start", "llmgw-agent.service"]]  # no status read after a failure


def test_a_failed_job_points_at_the_journal() -> None:
    fake = FakeSystemctl(answers={"restart": failing(1, JOB_FAILED)})
    with pytest.raises(ServiceError, match=r"status 1: Job for llmgw-control.service failed .*journalctl -u "
                                           r"llmgw-control.service` says why"):
        manager(fake).restart("control")


def test_a_stop_that_systemctl_does_not_finish_is_an_error() -> None:
    fake = FakeSystemctl(answers={"stop": subprocess.TimeoutExpired(["systemctl"], TIMEOUTS.service_stop_s)})
    with pytest.raises(ServiceError, match="no answer within 20 s"):
        manager(fake).stop("gateway")


def test_the_real_run_captures_text_within_service_stop_s(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[list[str], dict[str, object]]] = []

    def run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        seen.append((argv, kw))
        return subprocess.CompletedProcess(argv, 0, NOT_FOUND, "")

    monkeypatch.setattr(subprocess, "run", run)  # what llmgw.service.systemd calls
    assert Systemd().status("agent").state == "not installed"
    assert seen == [(SHOW[:2] + ["llmgw-agent.service"] + SHOW[3:],
                     {"capture_output": True, "text": True, "timeout": TIMEOUTS.service_stop_s, "check": False})]


def test_parse_show_keeps_values_with_equals_signs() -> None:
    assert parse_show("A=1\nEnvironment=X=1 Y=2\n\nnoise\n") == {"A": "1", "Environment": "X=1 Y=2"}


# --- the units --------------------------------------------------------------------------------------


def read_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """A unit file's sections: each key with every value it is given (systemd's lists accumulate)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        key, sep, value = line.partition("=")
        assert sep and current is not None and not line.endswith("\\"), f"{path.name}:{n}: not KEY=VALUE: {line!r}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def seconds(value: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(s|sec|min)?", value)
    assert m, f"not a simple time span: {value!r}"
    return float(m.group(1)) * (60 if m.group(2) == "min" else 1)


def one(section: dict[str, list[str]], key: str) -> str:
    values = section.get(key, [])
    assert len(values) == 1, f"{key}: {values}"
    return values[0]


def test_there_is_a_unit_per_role_and_nothing_else() -> None:
    assert sorted(p.name for p in UNITS.iterdir()) == sorted(unit(r) for r in SERVICE_ROLES)


@pytest.mark.parametrize("role", SERVICE_ROLES)
def test_each_unit_says_what_it_must(role: str) -> None:
    u = read_unit(UNITS / unit(role))
    assert set(u) == {"Unit", "Service", "Install"}
    s = u["Service"]
    assert one(s, "ExecStart") == f"/usr/local/bin/llmgw service exec {role} --dir /var/lib/llmgw/services"
    assert one(s, "Restart") in ("always", "on-failure")
    assert seconds(one(s, "RestartSec")) > 0
    assert int(one(u["Unit"], "StartLimitBurst")) > 1 and seconds(one(u["Unit"], "StartLimitIntervalSec")) > 0
    # Past the process's own stop deadline, and under `llmgw service stop`'s wait for systemctl.
    assert TIMEOUTS.stop_deadline_s < seconds(one(s, "TimeoutStopSec")) < TIMEOUTS.service_stop_s
    assert one(s, "KillMode") == ("process" if role == "agent" else "mixed")  # the agent's engines outlive it
    assert one(s, "LimitNOFILE") == "65536"
    assert one(s, "NoNewPrivileges") == "yes"
    assert one(s, "ProtectSystem") == "strict"
    assert "/var/lib/llmgw" in " ".join(s["ReadWritePaths"]).split()
    for key in ("ProtectKernelTunables", "ProtectControlGroups", "RestrictSUIDSGID", "LockPersonality"):
        assert one(s, key) == "yes", key
    assert "network-online.target" in " ".join(u["Unit"]["After"]).split()
    assert "network-online.target" in " ".join(u["Unit"]["Wants"]).split()
    assert one(u["Install"], "WantedBy") == "multi-user.target"
    if role == "agent":  # the GPUs are device files; its engines use /tmp after it is gone
        assert "PrivateDevices" not in s and "DevicePolicy" not in s and "DeviceAllow" not in s
        assert "PrivateTmp" not in s
    else:
        assert one(s, "PrivateTmp") == "yes" and one(s, "ProtectHome") == "yes"
        assert one(s, "User") == "llmgw"
    if role == "control":  # the floating address
        assert "CAP_NET_ADMIN" in one(s, "AmbientCapabilities").split()
        assert "CAP_NET_ADMIN" in one(s, "CapabilityBoundingSet").split()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here")
def test_systemd_analyze_verify_finds_nothing_to_say(tmp_path: Path) -> None:
    """ExecStart points at an executable that exists here (verify refuses a missing binary; nothing else
    is changed), and any word verify says fails the test: it warns of an unknown key with status 0."""
    true = shutil.which("true")
    assert true is not None
    copies = []
    for path in sorted(UNITS.glob("*.service")):
        text = path.read_text(encoding="utf-8")
        assert text.count("ExecStart=/usr/local/bin/llmgw ") == 1
        copy = tmp_path / path.name
        copy.write_text(text.replace("ExecStart=/usr/local/bin/llmgw ", f"ExecStart={true} "), encoding="utf-8")
        copies.append(str(copy))
    done = subprocess.run(["systemd-analyze", "verify", "--man=no", *copies], capture_output=True, text=True,
                          timeout=60, check=False)
    assert (done.returncode, done.stdout + done.stderr) == (0, "")
