"""An agent's fetch of a mirror file from a control plane on loopback, against `cp` of the same file on this
machine, and the time to verify (sha256) the fetched file.

Run: `.venv/bin/python tests/bench/mirror_fetch.py [--mib 256] [--dir PATH]`.
A control plane (`llmgw up`'s plain loopback, its agent's in-process credential) holds a random file of `--mib`
MiB in its blob dir; `fetch` (agent/mirror_fetch.py) copies it into a fresh cache over `GET /mirror/blobs/SHA`,
and checks its sha256 before it names it (as an agent does before an engine starts): the fetch's time includes
that check, also timed alone. `cp` is `shutil.copyfile` of the same file (the page cache warm for both: the file
was just written). The table: seconds, MiB/s, and each against `cp`. The control plane and the fetch share this
process (one trio thread): on two machines each has its own CPU.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from llmgw.agent.mirror_fetch import MirrorCache, fetch, sha256_of  # noqa: E402
from llmgw.domain import commands  # noqa: E402
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


async def fetch_once(root: Path, mib: int) -> dict[str, Any]:
    state = root / "control"
    blobs = BlobStore(state / "mirror")
    blobs.blobs.mkdir(parents=True)
    tmp = state / "incoming"
    sha = write_random(tmp, mib)
    size = mib << 20
    with socket_port() as raft:
        config = ControlConfig(state_dir=state, raft_addr=f"127.0.0.1:{raft}", admin_host="127.0.0.1", admin_port=0,
                               seed=Seed(admin_key="sk-bench-mirror"))
    async with trio.open_nursery() as nursery:
        control = await nursery.start(control_serve, config)
        assert control.context is not None
        # Named in the catalog before it is in the blob dir: a blob no name refers to is collected.
        await control.store.submit(commands.put_file("bench.bin", sha, size, "gguf", {}, 0.0))
        os.replace(tmp, blobs.blob_path(sha))
        credential = control.context.local_credential("agent", "bench")
        source = MirrorSource("bench.bin", sha, size, (f"{control.admin_url}/mirror/blobs/{sha}",))
        cache = MirrorCache(root / "cache", 2 * size)
        started = time.perf_counter()
        path = await fetch(source, cache, tls=None, local=credential)
        fetched_s = time.perf_counter() - started
        nursery.cancel_scope.cancel()
    started = time.perf_counter()
    assert sha256_of(path) == sha
    verify_s = time.perf_counter() - started
    started = time.perf_counter()
    shutil.copyfile(blobs.blob_path(sha), root / "copy.bin")
    cp_s = time.perf_counter() - started
    return {"mib": mib, "fetch_s": fetched_s, "verify_s": verify_s, "cp_s": cp_s}


class socket_port:
    """A free loopback port for the control plane's Raft address (closed before it binds it)."""

    def __enter__(self) -> int:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    def __exit__(self, *_: object) -> None:
        return None


def measure(mib: int, directory: Path | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        return trio.run(fetch_once, Path(tmp), mib)


def table(r: dict[str, Any]) -> str:
    mib = r["mib"]
    rows = [("cp (shutil.copyfile)", r["cp_s"]), ("fetch (HTTP, written, checked)", r["fetch_s"]),
            ("of which: verify (sha256)", r["verify_s"])]
    out = [f"{'what':<32}{'seconds':>10}{'MiB/s':>10}{'x cp':>8}"]
    for name, s in rows:
        out.append(f"{name:<32}{s:>10.3f}{mib / s:>10.0f}{s / r['cp_s']:>8.1f}")
    out.append(f"verify, per GiB: {r['verify_s'] * 1024 / mib:.2f} s")
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256, help="the file's size in MiB")
    parser.add_argument("--dir", type=Path, help="work here (default: a temporary directory)")
    args = parser.parse_args()
    print(f"a {args.mib} MiB file, one control plane on loopback")
    print(table(measure(args.mib, args.dir)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
