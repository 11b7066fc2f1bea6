"""What TLS between control planes costs Raft; prints one table.

Three bare `RaftStore` members on loopback, in this one process (their Raft threads share its
interpreter: the absolute figures are lower than three processes give, the ratio is the point), run
twice: sealed only (the cluster secret's Fernet seal on every frame: `llmgw up`, and a new group
until every member holds a certificate), then TLS under the seal (`RaftPeers` with control
certificates of a CA made here: every other group). Each run:

- sequential commits: one `put_setting` at a time, submitted at the leader, awaited until committed
  and applied; p50/p99;
- group commit: `--commands` commands with `--in-flight` at once (one Raft entry per scheduler pass);
  commands/s.

Each wire runs `--rounds` times, alternating which goes first; the table has the medians, and each
row its ratio to the sealed-only row. Fsync is off (the disk would hide what the wire costs).

Run: `.venv/bin/python tests/bench/raft_tls.py [--rounds 3] [--writes 300] [--commands 2000]
[--in-flight 256]` (about a minute). Figures are from one run on this machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from llmgw.control.trust import RaftPeers  # noqa: E402
from llmgw.domain import commands  # noqa: E402
from llmgw.net import free_port  # noqa: E402
from llmgw.store import RaftStore  # noqa: E402
from llmgw.store import secret as cluster_secret  # noqa: E402
from llmgw.trust import ca  # noqa: E402
from llmgw.trust.files import MachineFiles  # noqa: E402
from tests.support.figures import pct, print_table  # noqa: E402


def certificates(root_dir: Path, addrs: list[str]) -> list[MachineFiles]:
    """A control certificate per member, from a root and an intermediate made here."""
    now = time.time()
    root = ca.make_root("bench", now)
    inter = ca.make_intermediate(root, now)
    bundle = root.cert_pem + inter.cert_pem
    out = []
    for addr in addrs:
        files = MachineFiles.of(root_dir / addr.replace(":", "_"))
        key = files.key_pem()
        chain = ca.sign_request(ca.make_request(key, "control", addr), inter, role="control", name=addr,
                                hosts=("127.0.0.1",), now=now, lifetime_s=3600)
        files.write(chain + inter.cert_pem, bundle)
        out.append(files)
    return out


async def run(tls: bool, args: argparse.Namespace) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="llmgw-bench-raft-tls-") as tmp:
        root = Path(tmp)
        addrs = [f"127.0.0.1:{free_port()}" for _ in range(3)]
        secret = cluster_secret.make()
        files = certificates(root / "tls", addrs) if tls else [None] * 3
        stores: list[RaftStore] = []
        for addr, machine in zip(addrs, files):
            holder: list[RaftStore] = []
            peer_tls = (RaftPeers(machine, state=lambda h=holder: h[0].snapshot(), clock=time.time)
                        if machine is not None else None)
            store = RaftStore(self_addr=addr, peers=addrs, state_dir=root / addr.replace(":", "_"),
                              cluster_secret=secret, fsync="off", peer_tls=peer_tls)
            holder.append(store)
            stores.append(store)
        for store in stores:
            await store.start()
        try:
            for store in stores:
                await store.wait_ready()
            while not (leader := next((s for s in stores if s.is_leader()), None)):
                await trio.sleep(0.05)
            want = "tls" if tls else "sealed"
            while not all(set(s.status()["links"].values()) == {want} for s in stores):
                await trio.sleep(0.05)
            took = []
            for i in range(args.writes):
                started = time.perf_counter()
                await leader.submit(commands.put_setting("placement.warn_interval_s", 1.0 + i % 7, time.time()))
                took.append(time.perf_counter() - started)
            started = time.perf_counter()

            async def one(i: int, limit: trio.CapacityLimiter) -> None:
                async with limit:
                    await leader.submit(commands.put_setting("placement.warn_interval_s", 2.0 + i % 7, time.time()))

            limit = trio.CapacityLimiter(args.in_flight)
            async with trio.open_nursery() as nursery:
                for i in range(args.commands):
                    nursery.start_soon(one, i, limit)
            rate = args.commands / (time.perf_counter() - started)
            return {"p50": pct(took, 0.5) * 1000, "p99": pct(took, 0.99) * 1000, "rate": rate}
        finally:
            for store in stores:
                store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=300)
    parser.add_argument("--commands", type=int, default=2000)
    parser.add_argument("--in-flight", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3, help="runs of each wire, alternating; medians shown")
    args = parser.parse_args()
    runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for i in range(args.rounds):
        for tls_on in ((False, True) if i % 2 == 0 else (True, False)):  # neither always runs first
            runs[tls_on].append(trio.run(run, tls_on, args))

    def median(of: list[dict[str, float]]) -> dict[str, float]:
        return {k: statistics.median(r[k] for r in of) for k in of[0]}

    sealed, tls = median(runs[False]), median(runs[True])
    rows = [["wire", "commit p50 (ms)", "p99 (ms)", "x p50", f"commands/s ({args.in_flight} in flight)", "x rate"]]
    for name, r in (("sealed only", sealed), ("TLS + seal", tls)):
        rows.append([name, f"{r['p50']:.2f}", f"{r['p99']:.2f}", f"{r['p50'] / sealed['p50']:.2f}",
                     f"{r['rate']:.0f}", f"{r['rate'] / sealed['rate']:.2f}"])
    print_table(rows)


if __name__ == "__main__":
    main()
