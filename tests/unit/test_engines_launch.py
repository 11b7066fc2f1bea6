"""Engine command lines on GPUs and in groups: llama-server, rpc-server and vLLM argv checked against
their documented flags, devices as UUIDs, storage roots, and every refusal before a process starts.

The engine binaries are tiny shell scripts in tmp_path (the world's edge): nothing here runs an engine.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from llmgw.engines import EngineError, Group, LaunchSpec, launch_spec
from llmgw.engines.vllm import Serve, ray_argvs
from tests.support.tiny_gguf import minimal_gguf, truncate

HOST = "10.0.0.1"


def binary(folder: Path, name: str, script: str = "exit 0") -> str:
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def gguf(tmp_path: Path) -> str:
    path = tmp_path / "models" / "tiny.gguf"
    path.parent.mkdir()
    path.write_bytes(minimal_gguf())
    return str(path)


def spec(engine: str, source: str, *, bin_dir: Path | None = None, args: tuple[str, ...] = (),
         devices: tuple[str, ...] = (), group: Group | None = None, role: str = "chat",
         roots: tuple[str, ...] = (), env: dict[str, str] | None = None, port: int = 9001) -> LaunchSpec:
    environ = {"PATH": str(bin_dir) if bin_dir else "/nonexistent", **(env or {})}
    return launch_spec(engine, model="demo", role=role, source=source, host=HOST, port=port, args=list(args),
                       devices=devices, group=group, roots=roots, environ=environ)


def flags(argv: list[str]) -> dict[str, str | None]:
    """`--flag value` / `--switch` pairs of an argv (after its positional words)."""
    out: dict[str, str | None] = {}
    for i, word in enumerate(argv):
        if word.startswith("--"):
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            out[word] = None if nxt is None or nxt.startswith("--") else nxt
    return out


# -- llama.cpp's llama-server ----------------------------------------------------------------------


def test_llama_server_on_gpus(tmp_path: Path, gguf: str) -> None:
    server = binary(tmp_path / "bin", "llama-server")
    launch = spec("llama.cpp", gguf, bin_dir=tmp_path / "bin", args=("--ctx-size=4096", "--parallel", "2"),
                  devices=("GPU-5a1c0e2b-0000-1111-2222-333344445555", "GPU-77"))
    assert launch.argv == [
        server, "--model", gguf, "--host", HOST, "--port", "9001", "--alias", "demo", "--n-gpu-layers", "999",
        "--ctx-size", "4096", "--parallel", "2", "--no-webui",
    ]  # fmt: skip
    assert launch.env["CUDA_VISIBLE_DEVICES"] == "GPU-5a1c0e2b-0000-1111-2222-333344445555,GPU-77"
    assert (launch.probe, launch.health_path) == ("http", "/health")


def test_mig_instances_get_cuda_uuids_and_no_vulkan_variable(tmp_path: Path, gguf: str) -> None:
    binary(tmp_path / "bin", "llama-server")
    mig = "MIG-4b2f8f5e-5c3a-5d2e-9a8b-1c2d3e4f5a6b"
    launch = spec("llama.cpp", gguf, bin_dir=tmp_path / "bin", devices=(mig,))
    assert launch.env["CUDA_VISIBLE_DEVICES"] == mig
    assert not [name for name in launch.env if "VK" in name or "VULKAN" in name]
    old_style = "MIG-GPU-5a1c0e2b-0000-1111-2222-333344445555/1/0"  # drivers before R470
    assert spec("sim", "sim://demo", devices=(old_style,)).env["CUDA_VISIBLE_DEVICES"] == old_style


def test_no_devices_means_no_gpu_at_all() -> None:
    assert spec("sim", "sim://demo").env["CUDA_VISIBLE_DEVICES"] == ""


@pytest.mark.parametrize("devices", [("0",), ("GPU-a,GPU-b",), ("GPU-a", "GPU-a"), ("gpu-a",), ("MIG-",)])
def test_devices_must_be_uuids(devices: tuple[str, ...]) -> None:
    with pytest.raises(EngineError) as caught:
        spec("sim", "sim://demo", devices=devices)
    assert caught.value.code == "bad_devices"


def test_embedding_role_and_pooling_reach_llama_server(tmp_path: Path, gguf: str) -> None:
    binary(tmp_path / "bin", "llama-server")
    launch = spec("llama.cpp", gguf, bin_dir=tmp_path / "bin", role="embedding", args=("--pooling", "mean"),
                  devices=("GPU-1",))
    assert flags(launch.argv)["--embedding"] is None and flags(launch.argv)["--pooling"] == "mean"
    assert launch.argv.count("--embedding") == 1


def test_rerank_role_reaches_llama_server_as_reranking(tmp_path: Path, gguf: str) -> None:
    binary(tmp_path / "bin", "llama-server")
    launch = spec("llama.cpp", gguf, bin_dir=tmp_path / "bin", role="rerank", devices=("GPU-1",))
    assert launch.argv.count("--reranking") == 1 and "--embedding" not in launch.argv


def test_llama_server_missing_or_unusable(tmp_path: Path, gguf: str) -> None:
    with pytest.raises(EngineError) as caught:
        spec("llama.cpp", gguf, devices=("GPU-1",))
    assert caught.value.code == "engine_unavailable"
    assert "LLMGW_LLAMA_SERVER" in caught.value.message and "on GPUs" in caught.value.message
    with pytest.raises(EngineError) as caught:
        spec("llama.cpp", gguf, devices=("GPU-1",), env={"LLMGW_LLAMA_SERVER": str(tmp_path / "nope")})
    assert caught.value.message.endswith("no such file")
    plain = tmp_path / "llama-server"
    plain.write_text("#!/bin/sh\n")
    plain.chmod(0o644)
    with pytest.raises(EngineError) as caught:
        spec("llama.cpp", gguf, devices=("GPU-1",), env={"LLMGW_LLAMA_SERVER": str(plain)})
    assert "not executable" in caught.value.message


def test_configured_llama_server_wins_over_path(tmp_path: Path, gguf: str) -> None:
    binary(tmp_path / "bin", "llama-server")
    mine = binary(tmp_path / "opt", "llama-server")
    launch = spec("llama.cpp", gguf, bin_dir=tmp_path / "bin", devices=("GPU-1",), env={"LLMGW_LLAMA_SERVER": mine})
    assert launch.argv[0] == mine


# -- llama.cpp over RPC (tools/rpc/README.md: `rpc-server --host H --port P`, `llama-server --rpc h:p,...`) --


def test_llama_cpp_group_rank_zero_dials_every_member(tmp_path: Path, gguf: str) -> None:
    server = binary(tmp_path / "bin", "llama-server")
    binary(tmp_path / "bin", "rpc-server")
    group = Group(rank=0, size=3, leader=f"{HOST}:7000", members=("10.0.0.2:50052", "10.0.0.3:50052"))
    launch = spec("llama.cpp", gguf, bin_dir=tmp_path / "bin", devices=("GPU-1",), group=group)
    assert launch.argv[0] == server
    assert flags(launch.argv)["--rpc"] == "10.0.0.2:50052,10.0.0.3:50052"
    assert flags(launch.argv)["--n-gpu-layers"] == "999"
    assert launch.probe == "http"


def test_llama_cpp_group_member_runs_rpc_server(tmp_path: Path, gguf: str) -> None:
    binary(tmp_path / "bin", "llama-server")
    rpc = binary(tmp_path / "bin", "rpc-server")
    group = Group(rank=1, size=2, leader=f"{HOST}:7000")
    launch = spec("llama.cpp", gguf, bin_dir=tmp_path / "bin", devices=("GPU-1",), group=group, port=50052)
    assert launch.argv == [rpc, "--host", HOST, "--port", "50052"]
    assert (launch.probe, launch.health_path) == ("tcp", None)
    assert launch.env["CUDA_VISIBLE_DEVICES"] == "GPU-1"


def test_llama_cpp_group_member_listens_where_rank_zero_dials(tmp_path: Path, gguf: str) -> None:
    """Rank 0's `--rpc` list holds the addresses control gave the members: a member listens on its
    own given port, not on the free port the agent offered."""
    binary(tmp_path / "bin", "llama-server")
    rpc = binary(tmp_path / "bin", "rpc-server")
    group = Group(rank=1, size=2, leader=f"{HOST}:7000", address=f"{HOST}:29777")
    launch = spec("llama.cpp", gguf, bin_dir=tmp_path / "bin", devices=("GPU-1",), group=group, port=50052)
    assert launch.argv == [rpc, "--host", HOST, "--port", "29777"]
    assert launch.port == 29777


def test_llama_cpp_group_refusals(tmp_path: Path, gguf: str) -> None:
    binary(tmp_path / "bin", "llama-server")
    with pytest.raises(EngineError) as caught:  # rank 0 without the members' addresses
        spec("llama.cpp", gguf, bin_dir=tmp_path / "bin", group=Group(0, 2, f"{HOST}:7000"))
    assert caught.value.code == "bad_group"
    with pytest.raises(EngineError) as caught:  # no rpc-server in the build
        spec("llama.cpp", gguf, bin_dir=tmp_path / "bin", group=Group(1, 2, f"{HOST}:7000"))
    assert caught.value.code == "engine_unavailable" and "GGML_RPC" in caught.value.message


@pytest.mark.parametrize("group", [Group(2, 2, "h:1"), Group(0, 1, "h:1"), Group(-1, 2, "h:1"),
                                   Group(1, 2, "h"), Group(1, 2, "h:0"), Group(1, 2, "-h:1"),
                                   Group(1, 2, "h:1", members=("x",))])
def test_impossible_groups_are_refused(group: Group) -> None:
    with pytest.raises(EngineError) as caught:
        spec("sim", "sim://demo", group=group)
    assert caught.value.code == "bad_group"


def test_sim_group_flags() -> None:
    launch = spec("sim", "sim://demo", group=Group(1, 3, "[::1]:7000"))
    tail = launch.argv[launch.argv.index("--role") + 2:]
    assert tail == ["--group-rank", "1", "--group-size", "3", "--group-leader", "[::1]:7000"]


# -- vLLM ------------------------------------------------------------------------------------------


def vllm_bin(tmp_path: Path, version: str = "0.11.1") -> Path:
    binary(tmp_path / "bin", "vllm", f'[ "$1" = --version ] && echo {version}')
    return tmp_path / "bin"


def test_vllm_one_node(tmp_path: Path) -> None:
    folder = vllm_bin(tmp_path)
    model = tmp_path / "qwen"
    model.mkdir()
    launch = spec("vllm", str(model), bin_dir=folder, devices=("GPU-1", "GPU-2"),
                  args=("--max-model-len", "8192", "--gpu-memory-utilization=0.85", "--enforce-eager"))
    assert launch.argv == [
        str(folder / "vllm"), "serve", str(model), "--host", HOST, "--port", "9001", "--served-model-name", "demo",
        "--tensor-parallel-size", "2", "--max-model-len", "8192", "--gpu-memory-utilization", "0.85",
        "--enforce-eager",
    ]  # fmt: skip
    assert launch.health_path == "/health"


def test_vllm_rerank_runs_the_pooling_runner(tmp_path: Path) -> None:
    folder = vllm_bin(tmp_path)
    launch = spec("vllm", str(tmp_path), bin_dir=folder, devices=("GPU-1",), role="rerank")
    assert flags(launch.argv)["--runner"] == "pooling"
    assert "--runner" not in spec("vllm", str(tmp_path), bin_dir=folder, devices=("GPU-1",)).argv
    ray = ray_argvs(["vllm"], "ray", Serve("/m", "demo", HOST, 8000, [], 8, "rerank"), Group(0, 2, "10.0.0.1:6379"))
    assert flags(ray[1])["--runner"] == "pooling"


def test_vllm_tool_calling_flags(tmp_path: Path) -> None:
    """tool_choice "auto" on vLLM needs these (docs/api.md, "Fields by engine"); a parser it has not is refused."""
    folder = vllm_bin(tmp_path)
    model = tmp_path / "qwen"
    model.mkdir()
    launch = spec("vllm", str(model), bin_dir=folder, devices=("GPU-1",),
                  args=("--enable-auto-tool-choice", "--tool-call-parser", "hermes"))
    assert launch.argv[-3:] == ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    with pytest.raises(EngineError) as caught:
        spec("vllm", str(model), bin_dir=folder, devices=("GPU-1",), args=("--tool-call-parser", "my.module"))
    assert caught.value.code == "bad_args" and "--tool-call-parser" in caught.value.message


# vLLM's docs (serving/parallelism_scaling, PR #23691): on each of 2 nodes of 8 GPUs
#   vllm serve /path/to/model --tensor-parallel-size 8 --pipeline-parallel-size 2 --nnodes 2 \
#     --node-rank R --master-addr HEAD_IP --master-port 29500 [--headless on ranks >= 1]
DOCUMENTED = {"--tensor-parallel-size": "8", "--pipeline-parallel-size": "2", "--nnodes": "2",
              "--master-addr": "10.0.0.1", "--master-port": "29500", "--distributed-executor-backend": "mp"}


@pytest.mark.parametrize("rank", [0, 1])
def test_vllm_group_matches_the_documented_launcher(tmp_path: Path, rank: int) -> None:
    folder = vllm_bin(tmp_path)
    model = tmp_path / "llama-405b"
    model.mkdir()
    devices = tuple(f"GPU-{i}" for i in range(8))
    launch = spec("vllm", str(model), bin_dir=folder, devices=devices, group=Group(rank, 2, "10.0.0.1:29500"))
    got = flags(launch.argv)
    assert launch.argv[1:3] == ["serve", str(model)]
    assert {k: got[k] for k in DOCUMENTED} == DOCUMENTED
    assert got["--node-rank"] == str(rank)
    assert ("--headless" in got) == (rank > 0)
    assert ("--port" in got) == (rank == 0)  # a headless rank serves no API
    assert launch.env["VLLM_HOST_IP"] == HOST
    assert (launch.probe, launch.health_path) == (("http", "/health") if rank == 0 else ("process", None))


def test_vllm_too_old_for_its_launcher_is_refused(tmp_path: Path) -> None:
    folder = vllm_bin(tmp_path, "0.10.2")
    with pytest.raises(EngineError) as caught:
        spec("vllm", str(tmp_path), bin_dir=folder, devices=("GPU-1",), group=Group(1, 2, "10.0.0.1:29500"))
    assert caught.value.code == "engine_too_old" and "0.11.1" in caught.value.message
    assert spec("vllm", str(tmp_path), bin_dir=folder, devices=("GPU-1",)).argv[1] == "serve"  # one node is fine


def test_vllm_ray_alternative() -> None:
    # docs.vllm.ai "multi-node serving": `ray start --head --port P` first, `ray start --address H:P` on
    # the others, then `vllm serve ... --distributed-executor-backend ray` on the head only.
    head = ray_argvs(["vllm"], "ray", Serve("/m", "demo", "10.0.0.1", 8000, [], 8), Group(0, 2, "10.0.0.1:6379"))
    assert head[0][:5] == ["ray", "start", "--block", "--head", "--port"] and head[0][5] == "6379"
    assert flags(head[1])["--distributed-executor-backend"] == "ray"
    assert flags(head[1])["--pipeline-parallel-size"] == "2"
    worker = ray_argvs(["vllm"], "ray", Serve("/m", "demo", "10.0.0.2", 8000, [], 8), Group(1, 2, "10.0.0.1:6379"))
    assert worker == [["ray", "start", "--block", "--address", "10.0.0.1:6379", "--node-ip-address", "10.0.0.2"]]


def test_vllm_missing(tmp_path: Path) -> None:
    with pytest.raises(EngineError) as caught:
        spec("vllm", str(tmp_path), env={"LLMGW_VLLM": ""})
    if caught.value.code == "engine_unavailable":  # unless this interpreter has the vllm module
        assert "LLMGW_VLLM" in caught.value.message


# -- sources ---------------------------------------------------------------------------------------


def test_a_source_outside_the_storage_dirs_is_refused(tmp_path: Path, gguf: str) -> None:
    binary(tmp_path / "bin", "llama-server")
    store = str(Path(gguf).parent)
    assert spec("llama.cpp", gguf, bin_dir=tmp_path / "bin", devices=("GPU-1",), roots=(store,)).argv[2] == gguf
    elsewhere = tmp_path / "elsewhere.gguf"
    elsewhere.write_bytes(minimal_gguf())
    with pytest.raises(EngineError) as caught:
        spec("llama.cpp", str(elsewhere), bin_dir=tmp_path / "bin", devices=("GPU-1",), roots=(store,))
    assert caught.value.code == "source_outside_storage" and store in caught.value.message
    link = Path(store) / "link.gguf"
    link.symlink_to(elsewhere)  # inside by name, outside in fact
    with pytest.raises(EngineError) as caught:
        spec("llama.cpp", str(link), bin_dir=tmp_path / "bin", devices=("GPU-1",), roots=(store,))
    assert caught.value.code == "source_outside_storage" and str(elsewhere) in caught.value.message


@pytest.mark.parametrize("name", ["../x", "a/../b", "..", "-rf", "a b", "", "x" * 129, "a/b"])
def test_model_names_that_are_not_names_are_refused(name: str) -> None:
    with pytest.raises(EngineError) as caught:
        launch_spec("sim", model=name, role="chat", source="sim://x", host=HOST, port=1, args=[])
    assert caught.value.code == "bad_model"


def test_sim_source_with_dotdot_is_refused() -> None:
    with pytest.raises(EngineError) as caught:
        spec("llama.cpp", "sim://../../etc")
    assert caught.value.code == "bad_source"


def test_truncated_and_lying_ggufs_are_refused_before_any_process(tmp_path: Path, gguf: str) -> None:
    binary(tmp_path / "bin", "llama-server", f"touch {tmp_path}/ran")
    truncate(gguf, os.path.getsize(gguf) - 8)
    with pytest.raises(EngineError) as caught:
        spec("llama.cpp", gguf, bin_dir=tmp_path / "bin", devices=("GPU-1",))
    assert caught.value.code == "bad_weights" and "truncated" in caught.value.message
    renamed = tmp_path / "weights.bin"  # a GGUF by its magic, whatever its name
    renamed.write_bytes(minimal_gguf()[:-8])
    with pytest.raises(EngineError) as caught:
        spec("llama.cpp", str(renamed), bin_dir=tmp_path / "bin", devices=("GPU-1",))
    assert caught.value.code == "bad_weights"
    assert not (tmp_path / "ran").exists()


def test_llama_cpp_needs_a_file(tmp_path: Path) -> None:
    binary(tmp_path / "bin", "llama-server")
    with pytest.raises(EngineError) as caught:
        spec("llama.cpp", str(tmp_path), bin_dir=tmp_path / "bin", devices=("GPU-1",))
    assert caught.value.code == "bad_source"
