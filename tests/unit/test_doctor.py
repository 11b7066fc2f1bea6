"""`llmgw doctor`: GPUs by each path, MIG states that stop work as warnings, the JSON shape,
the state dir and ports, and the exit status; the edges (pynvml, nvidia-smi) are fakes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pynvml
import pytest
from gpu_fakes import FakeNvml, Machine, a100_fleet_box

from llmgw import statedir
from llmgw.cli.doctor import default_ports, examine

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gpus"
REPO = Path(__file__).resolve().parents[2]
KEYS = {"index", "uuid", "name", "class", "memory_total_mib", "mig", "parent_index", "healthy", "placeable",
        "reason", "utilization"}


def smi(fixture: str):  # type: ignore[no-untyped-def]
    def run(argv: list[str]) -> str:
        return (FIXTURES / (f"{fixture}.L.txt" if argv[1:] == ["-L"] else f"{fixture}.xml")).read_text()
    return run


def no_smi(argv: list[str]) -> str:
    raise FileNotFoundError(argv[0])


def check(tmp_path: Path, **kw):  # type: ignore[no-untyped-def]
    kw.setdefault("env", {})
    return examine(state_dir=tmp_path / "state", ports={}, engines={"sim": "0.1"}, now=1.8e9, **kw)


def test_mig_states_that_stop_work_are_warnings_and_the_json_has_the_agreed_shape(tmp_path: Path) -> None:
    doc = check(tmp_path, nvml_api=FakeNvml(a100_fleet_box()), smi_run=smi("v12-535-a100-80g-mig"))
    assert doc["probe"] == "nvml" and all(KEYS <= set(g) for g in doc["gpus"])
    parent = doc["gpus"][0]
    assert parent["placeable"] is False and parent["mig"] == {"current": True, "pending": True}
    instances = [g for g in doc["gpus"] if g["parent_index"] == 0]
    assert [g["index"] for g in instances] == [1000, 1001, 1002]
    assert instances[0]["class"] == "a100-80g-mig-3g.40gb" and instances[0]["memory_total_mib"] == 40192
    assert instances[0]["utilization"] is None and instances[0]["uuid"].startswith("MIG-")
    assert doc["gpus"][4]["mig"] == {"current": True, "pending": True} and not doc["gpus"][4]["placeable"]
    assert doc["gpus"][5]["mig"] == {"current": False, "pending": True}
    assert any("no instances are carved" in w for w in doc["warnings"])
    assert any("GPU reset is needed" in w for w in doc["warnings"])
    assert not any("disagree" in w for w in doc["warnings"]), "both paths read the same machine"
    assert doc["paths"]["nvml"]["ok"] and doc["paths"]["nvidia-smi"]["ok"]
    json.dumps(doc)


def test_nvml_failing_while_nvidia_smi_works_is_a_mismatch_warning(tmp_path: Path) -> None:
    broken = FakeNvml(Machine([]), init_error=pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH)
    doc = check(tmp_path, nvml_api=broken, smi_run=smi("v13-560-h100"))
    assert doc["probe"] == "nvidia-smi" and [g["class"] for g in doc["gpus"]] == ["h100-80g", "h100-80g"]
    assert any("mismatch" in w for w in doc["warnings"])


def test_paths_that_disagree_are_said(tmp_path: Path) -> None:
    doc = check(tmp_path, nvml_api=FakeNvml(a100_fleet_box()), smi_run=smi("v13-560-h100"))
    assert any("disagree" in w for w in doc["warnings"])


def test_nvidia_smi_missing_on_a_gpu_machine_is_a_warning(tmp_path: Path) -> None:
    doc = check(tmp_path, nvml_api=FakeNvml(Machine(a100_fleet_box().cards[3:])), smi_run=no_smi)
    assert doc["gpus"][0]["placeable"] and any("nvidia-smi does not work" in w for w in doc["warnings"])


def test_a_healthy_cpu_node_has_no_warning(tmp_path: Path) -> None:
    absent = FakeNvml(Machine([]), init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    doc = check(tmp_path, nvml_api=absent, smi_run=no_smi)
    assert (doc["gpus"], doc["warnings"], doc["probe"]) == ([], [], "none")
    assert any("CPU-only" in n for n in doc["notes"]) and doc["clock"]["checked_against_peer"] is False


def test_forcing_a_path_that_fails_is_a_warning(tmp_path: Path) -> None:
    absent = FakeNvml(Machine([]), init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    doc = check(tmp_path, nvml_api=absent, smi_run=no_smi, env={"LLMGW_GPU_PROBE": "nvml"})
    assert doc["probe"] == "none" and "LLMGW_GPU_PROBE" in doc["warnings"][0]


def test_state_dir_held_by_a_process_and_a_taken_port_are_notes(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with statedir.acquire(state, "llmgw up"), socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        doc = examine(env={}, nvml_api=FakeNvml(Machine([]), init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND),
                      smi_run=no_smi, state_dir=state, ports={"gateway": port}, engines={"sim": ""}, now=1.8e9)
    assert doc["state_dir"]["writable"] is True and f"{os.getpid()} llmgw up" == doc["state_dir"]["locked_by"]
    assert doc["ports"][0]["free"] is False and doc["warnings"] == []
    assert any(f"127.0.0.1:{port} is taken" in n for n in doc["notes"])
    assert statedir.acquire(state, "after doctor").release() is None, "doctor left no lock behind"


def test_an_unset_clock_is_a_warning(tmp_path: Path) -> None:
    absent = FakeNvml(Machine([]), init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    doc = examine(env={}, nvml_api=absent, smi_run=no_smi, state_dir=tmp_path, ports={}, engines={"sim": ""}, now=0.0)
    assert any("never set" in w for w in doc["warnings"])


def test_default_ports_are_up_s() -> None:
    assert default_ports() == {"gateway": 8080, "admin": 8081}


@pytest.mark.slow
def test_llmgw_doctor_json_reads_a_fake_nvidia_smi_on_path(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text(f'#!/bin/sh\nif [ "$1" = "-L" ]; then cat "{FIXTURES}/v12-535-a100-80g-mig.L.txt"; '
                    f'else cat "{FIXTURES}/v12-535-a100-80g-mig.xml"; fi\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "LLMGW_GPU_PROBE": "nvidia-smi"}
    done = subprocess.run([sys.executable, "-m", "llmgw", "doctor", "--json", "--state-dir", str(tmp_path / "s"),
                           "--host", "127.0.0.1"], capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
    doc = json.loads(done.stdout)
    assert done.returncode == 1, done.stderr  # MIG on with nothing carved: something cannot run
    assert doc["probe"] == "nvidia-smi" and len(doc["gpus"]) == 7
    assert [g["index"] for g in doc["gpus"] if g["parent_index"] == 0] == [1000, 1001, 1002]
    assert any("no instances are carved" in w for w in doc["warnings"])
    text = subprocess.run([sys.executable, "-m", "llmgw", "doctor", "--state-dir", str(tmp_path / "s")],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=60).stdout
    assert "0/mig0" in text and "a100-80g-mig-3g.40gb" in text and "MIG on (pending on)" not in text
    assert "MIG off (pending on)" in text
