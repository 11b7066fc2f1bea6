"""The model mirror's data paths on this machine, against `cp` of the same file: an upload (`llmgw ctl mirror add`,
in pieces through the admin API, validated and checksummed by the control plane), an agent's fetch (HTTP range
requests, written, verified), and the time to verify (sha256) a 1 GiB file.

Run: `.venv/bin/python tests/bench/mirror_fetch.py [--mib 256] [--verify-mib 1024] [--dir PATH]`.
A control plane (`llmgw up`'s plain loopback, its agent's in-process credential) runs in this process. The file is
a valid GGUF of `--mib` MiB (one F32 tensor of random bytes: the mirror refuses anything else). `ctl mirror add`
(run_ctl, its default 64 MiB pieces) uploads it: the time until the control plane has checked and named it. `fetch`
(agent/mirror_fetch.py) then copies the stored file into a fresh cache over `GET /mirror/blobs/SHA`, and checks
its sha256 before it names it (as an agent does before an engine starts): the fetch's time includes that check,
also timed alone. `cp` is `shutil.copyfile` of the same file (the page cache warm for all: the file was just
written). Verify: `sha256_of` over a file of `--verify-mib` MiB (1 GiB by default), written just before. The table:
seconds, MiB/s, and each against `cp`. The control plane, ctl and the fetch share this process (ctl in a thread):
on separate machines each has its own CPU.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import shutil
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from llmgw.agent.mirror_fetch import MirrorCache, fetch  # noqa: E402
from llmgw.diskfiles import sha256_of  # noqa: E402
from llmgw.cli.ctl import run_ctl  # noqa: E402
from llmgw.mirror.blobs import BlobStore  # noqa: E402
from llmgw.control.service import ControlConfig, Seed  # noqa: E402
from llmgw.control.service import serve as control_serve  # noqa: E402
from llmgw.wire.protocol_agent import MirrorSource  # noqa: E402


def write_random(path: Path, mib: int) -> str:
    h = hashlib.sha256()
    block = os.urandom(1 << 20)
    with open(path, "wb") as f:
        for i in range(mib):
            chunk = block[i % 256:] + block[:i % 256]  # not one repeated block: no dedup anywhere
            h.update(chunk)
            f.write(chunk)
    return h.hexdigest()


def write_gguf(path: Path, mib: int) -> str:
    """A valid GGUF v3 of `mib` MiB: one F32 tensor of random bytes after its header (the mirror validates what it
    accepts); returns its sha256."""
    def string(text: str) -> bytes:
        raw = text.encode()
        return struct.pack("<Q", len(raw)) + raw

    kv = [("general.architecture", "llama"), ("general.name", "bench")]
    head = bytearray(b"GGUF" + struct.pack("<IQQ", 3, 1, len(kv)))
    for key, value in kv:
        head += string(key) + struct.pack("<I", 8) + string(value)
    head += string("t0.weight")
    fixed = len(head) + struct.calcsize("<IQIQ")
    data = (mib << 20) - (fixed + (-fixed % 32))  # the file is `mib` MiB in all
    assert data > 0 and data % 4 == 0
    head += struct.pack("<IQIQ", 1, data // 4, 0, 0)
    head += b"\0" * (-len(head) % 32)
    h = hashlib.sha256(head)
    block = os.urandom(1 << 20)
    with open(path, "wb") as f:
        f.write(head)
        left, i = data, 0
        while left:
            chunk = (block[i % 256:] + block[:i % 256])[:left]  # not one repeated block: no dedup anywhere
            h.update(chunk)
            f.write(chunk)
            left -= len(chunk)
            i += 1
    return h.hexdigest()


async def fetch_once(root: Path, mib: int, verify_mib: int) -> dict[str, Any]:
    state = root / "control"
    blobs = BlobStore(state / "mirror")
    source_file = root / "bench.gguf"
    sha = write_gguf(source_file, mib)
    size = mib << 20
    started = time.perf_counter()
    shutil.copyfile(source_file, root / "copy.bin")
    cp_s = time.perf_counter() - started
    (root / "copy.bin").unlink()
    with socket_port() as raft:
        config = ControlConfig(state_dir=state, raft_addr=f"127.0.0.1:{raft}", admin_host="127.0.0.1", admin_port=0,
                               seed=Seed(admin_key="sk-bench-mirror"))
    async with trio.open_nursery() as nursery:
        control = await nursery.start(control_serve, config)
        assert control.context is not None
        env = {"LLMGW_URL": control.admin_url, "LLMGW_KEY": "sk-bench-mirror"}
        out, err = io.StringIO(), io.StringIO()
        started = time.perf_counter()
        rc = await trio.to_thread.run_sync(
            lambda: run_ctl(["mirror", "add", str(source_file), "--name", "bench.gguf"], env=env, stdout=out,
                            stderr=err))
        upload_s = time.perf_counter() - started
        assert rc == 0 and blobs.blob_path(sha).is_file(), err.getvalue()
        credential = control.context.local_credential("agent", "bench")
        source = MirrorSource("bench.gguf", sha, size, (f"{control.admin_url}/mirror/blobs/{sha}",))
        cache = MirrorCache(root / "cache", 2 * size)
        started = time.perf_counter()
        path = await fetch(source, cache, tls=None, local=credential)
        fetched_s = time.perf_counter() - started
        nursery.cancel_scope.cancel()
    started = time.perf_counter()
    assert sha256_of(path) == sha
    verify_s = time.perf_counter() - started
    for p in (path, source_file):
        p.unlink()
    big = root / "verify.bin"
    big_sha = write_random(big, verify_mib)
    started = time.perf_counter()
    assert sha256_of(big) == big_sha
    verify_big_s = time.perf_counter() - started
    return {"mib": mib, "upload_s": upload_s, "fetch_s": fetched_s, "verify_s": verify_s, "cp_s": cp_s,
            "verify_mib": verify_mib, "verify_big_s": verify_big_s}


class socket_port:
    """A free loopback port for the control plane's Raft address (closed before it binds it)."""

    def __enter__(self) -> int:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    def __exit__(self, *_: object) -> None:
        return None


def measure(mib: int, directory: Path | None = None, verify_mib: int | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        return trio.run(fetch_once, Path(tmp), mib, mib if verify_mib is None else verify_mib)


def table(r: dict[str, Any]) -> str:
    mib = r["mib"]
    rows = [("cp (shutil.copyfile)", mib, r["cp_s"]), ("upload (ctl mirror add, checked)", mib, r["upload_s"]),
            ("fetch (HTTP, written, checked)", mib, r["fetch_s"]), ("of which: verify (sha256)", mib, r["verify_s"]),
            (f"verify a {r['verify_mib']} MiB file (sha256)", r["verify_mib"], r["verify_big_s"])]
    out = [f"{'what':<36}{'MiB':>6}{'seconds':>10}{'MiB/s':>10}{'x cp':>8}"]
    for name, n, s in rows:
        out.append(f"{name:<36}{n:>6}{s:>10.3f}{n / s:>10.0f}{s / r['cp_s'] * mib / n:>8.1f}")
    out.append(f"verify, per GiB: {r['verify_big_s'] * 1024 / r['verify_mib']:.2f} s  (x cp: time against cp of "
               f"as many bytes)")
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256, help="the file's size in MiB")
    parser.add_argument("--verify-mib", type=int, default=1024, help="the size of the file whose sha256 is timed")
    parser.add_argument("--dir", type=Path, help="work here (default: a temporary directory)")
    args = parser.parse_args()
    print(f"a {args.mib} MiB file, one control plane on loopback")
    print(table(measure(args.mib, args.dir, args.verify_mib)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
