"""The node's inventory: CPU facts from /proc text (pure parsers), GPUs through the chosen path,
and what the probe says when the path is misnamed."""

from __future__ import annotations

from pathlib import Path

import pynvml
from gpu_fakes import FakeNvml, Machine, a100_fleet_box

from llmgw.agent.inventory import HostProbe, NvmlProbe, parse_cpuinfo, parse_meminfo

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
physical id\t: 0
core id\t\t: 0
cpu cores\t: 2
flags\t\t: fpu vme sse sse2 avx f16c fma avx2 avx512f avx512bw avx512vl avx512_vnni avx512_bf16 amx_tile

processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8480+
physical id\t: 0
core id\t\t: 1
flags\t\t: fpu vme sse sse2 avx f16c fma avx2 avx512f avx512bw avx512vl avx512_vnni avx512_bf16 amx_tile

processor\t: 2
model name\t: Intel(R) Xeon(R) Platinum 8480+
physical id\t: 0
core id\t\t: 0
flags\t\t: fpu vme sse sse2 avx f16c fma avx2 avx512f avx512bw avx512vl avx512_vnni avx512_bf16 amx_tile
"""
ARM = "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd evtstrm aes crc32 atomics sve\n\nprocessor\t: 1\n"
OLD_AMD = "processor : 0\nmodel name : AMD Opteron(tm) Processor 6276\nflags : fpu sse sse2 avx fma4\n"


def test_cpuinfo_gives_processors_cores_and_the_flags_engines_need() -> None:
    x86 = parse_cpuinfo(CPUINFO)
    assert (x86.logical, x86.cores, x86.model) == (3, 2, "Intel(R) Xeon(R) Platinum 8480+")
    assert x86.flags == ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                         "avx512_bf16", "amx_tile")
    assert parse_cpuinfo(ARM).flags == ("asimd", "sve") and parse_cpuinfo(ARM).logical == 2
    assert parse_cpuinfo(OLD_AMD).flags == ("avx",), "no avx2 where the CPU has none"
    assert parse_cpuinfo("").logical == 0


def test_meminfo_total_in_bytes() -> None:
    assert parse_meminfo("MemTotal:       263842388 kB\nMemFree: 1 kB\n") == 263842388 * 1024
    assert parse_meminfo("garbage") == 0


def fake_proc(tmp_path: Path) -> Path:
    (tmp_path / "cpuinfo").write_text(CPUINFO)
    (tmp_path / "meminfo").write_text("MemTotal:       16384 kB\n")
    return tmp_path


def test_the_inventory_carries_cpu_facts_gpus_and_the_path_that_found_them(tmp_path: Path) -> None:
    probe = HostProbe("nvml", nvml_api=FakeNvml(a100_fleet_box()), proc=fake_proc(tmp_path))
    info = probe.inventory("n1")
    assert info.node == "n1" and info.probe == "nvml" and info.memory_total == 16384 * 1024
    assert "avx512f" in info.cpu_flags and info.cpus > 0
    assert [g.label for g in info.gpus][:4] == ["0", "0/mig0", "0/mig1", "0/mig2"]
    assert any("no instances are carved" in w for w in info.warnings)
    assert "sim" in info.engines and set(info.engine_versions) == set(info.engines)


def test_a_cpu_node_reports_no_gpus_and_no_warning(tmp_path: Path) -> None:
    def no_smi(argv: list[str]) -> str:
        raise FileNotFoundError(argv[0])

    absent = FakeNvml(Machine([]), init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    info = HostProbe("auto", nvml_api=absent, smi_run=no_smi, proc=fake_proc(tmp_path)).inventory("cpu1")
    assert (info.gpus, info.probe, info.warnings) == ((), "none", ())


def test_a_misnamed_probe_path_is_said_and_auto_is_used(monkeypatch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("LLMGW_GPU_PROBE", "cuda")  # the environment is the world's edge
    probe = NvmlProbe(nvml_api=FakeNvml(Machine([])), proc=fake_proc(tmp_path))
    assert probe.choice == "auto"
    assert "LLMGW_GPU_PROBE='cuda'" in probe.inventory("n").warnings[0]


def test_llmgw_gpu_probe_forces_the_path_the_agent_reads(monkeypatch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """NVML works on this (fake) machine; LLMGW_GPU_PROBE=nvidia-smi still makes the agent's own
    probe read nvidia-smi, and auto reads NVML first."""
    from gpu_fakes import render_smi

    machine = a100_fleet_box()
    listing, xml = render_smi(machine)
    ran: list[list[str]] = []

    def smi(argv: list[str]) -> str:
        ran.append(argv)
        return listing if "-L" in argv else xml

    monkeypatch.setenv("LLMGW_GPU_PROBE", "nvidia-smi")  # the environment is the world's edge
    forced = HostProbe(nvml_api=FakeNvml(machine), smi_run=smi, proc=fake_proc(tmp_path)).inventory("n1")
    assert forced.probe == "nvidia-smi" and ran, "nvidia-smi was run"
    monkeypatch.setenv("LLMGW_GPU_PROBE", "auto")
    ran.clear()
    auto = HostProbe(nvml_api=FakeNvml(machine), smi_run=smi, proc=fake_proc(tmp_path)).inventory("n1")
    assert auto.probe == "nvml" and not ran
    assert [g.to_doc() for g in forced.gpus] == [g.to_doc() for g in auto.gpus], "both paths: one inventory"
