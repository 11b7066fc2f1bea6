"""Paired A/B of the stream's first chunk: the gateways of two (or more) source trees on one upstream, one client
that sends each request to each gateway in turn, so whatever the machine does meanwhile (another process, a vCPU
halted, a cold cache) falls on every tree alike. For a change to the first chunk's path: separate runs of
`gateway.py` on this project's 2-vCPU VM move by ±15–30% between process starts (where the scheduler puts each
process), more than most changes; the ratio of two gateways measured side by side moves by 1–3%.

Run: `.venv/bin/python tests/bench/gateway_ab.py TREE_A TREE_B [...] [--sets 4] [--samples 400] [--gap-ms 1]`,
each TREE a checkout of this repository (`git worktree add /tmp/old <commit>`); it runs that tree's own gateway
(`TREE/tests/bench/gateway.py --child-gateway`, its `llmgw` on PYTHONPATH) against this tree's upstream
(`_upstream.py`: 4 SSE chunks `--gap-ms` apart). Each set starts fresh processes (the trees in turn, their order
reversed every other set), warms each gateway with 100 requests, then takes `--samples` time-to-first-chunk
samples per tree at c=1, the trees' order rotated after each request to every tree (each tree comes first,
second... equally often: where a request falls after another gateway's matters, ~5% here). Give the same tree
twice for an A/A check of the harness itself. Prints each set's p50 per tree and, per tree, the
median over sets of its p50 divided by the first tree's in the same set.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _probe  # noqa: E402
from gateway import KEY_ENV, PATH, STREAM, Procs  # noqa: E402

HERE = Path(__file__).resolve().parent
WARM = 100  # requests per gateway before the samples


def gateway_args(tree: Path, upstream: str, log_dir: Path) -> list[str]:
    """`tree`'s own gateway child (its bench script and its package), pointed at `upstream`."""
    return [sys.executable, str(tree / "tests" / "bench" / "gateway.py"), "--child-gateway", upstream, "--port", "0",
            "--log-dir", str(log_dir)]


def one_set(trees: list[Path], samples: int, gap_ms: float, reverse: bool, warm: int = WARM) -> list[float]:
    """Fresh processes, then each tree's p50 time to first chunk (ms) over `samples` requests each, in turn."""
    key = "sk-ab-" + os.urandom(8).hex()
    procs = Procs()
    clients: list[_probe.Client] = []
    try:
        _, upstream = procs.start([sys.executable, str(HERE / "_upstream.py"), "--port", "0", "--gap-ms", str(gap_ms)])
        urls: dict[Path, str] = {}
        with tempfile.TemporaryDirectory() as tmp:
            for i, tree in enumerate(trees[::-1] if reverse else trees):
                env = {**os.environ, KEY_ENV: key, "PYTHONPATH": str(tree)}
                _, urls[tree] = procs.start(gateway_args(tree, upstream, Path(tmp) / f"log-{i}"), env)
            clients = [_probe.Client(urls[tree], key) for tree in trees]
            paths = [urlsplit(urls[tree]).path + PATH for tree in trees]
            taken: list[list[float]] = [[] for _ in trees]
            count = len(trees)
            for n in range(warm + samples):
                for k in ((n + i) % count for i in range(count)):  # each tree in each place in turn
                    status, first, _end, answer = clients[k].post(paths[k], STREAM)
                    if status != 200 or not answer.rstrip().endswith(b"data: [DONE]"):
                        raise RuntimeError(f"{trees[k]}'s gateway answered {status}: {answer[:200]!r}")
                    if n >= warm:
                        taken[k].append(first)
            return [statistics.median(t) for t in taken]
    finally:
        for client in clients:
            client.close()
        procs.stop_all()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="+", type=Path, help="checkouts of this repository; the first is the baseline")
    parser.add_argument("--sets", type=int, default=4, help="sets of fresh processes")
    parser.add_argument("--samples", type=int, default=400, help="samples per tree per set")
    parser.add_argument("--gap-ms", type=float, default=1.0, help="the upstream's pause between two chunks")
    args = parser.parse_args()
    trees = [tree.resolve() for tree in args.trees]
    for tree in trees:
        if not (tree / "tests" / "bench" / "gateway.py").is_file() or not (tree / "llmgw").is_dir():
            parser.error(f"{tree} is not a checkout of this repository")
    names = [str(tree) for tree in trees]
    width = max(len(name) for name in names)
    rows: list[list[float]] = []
    print(f"stream time to first chunk, p50 (ms), c=1, {args.samples} samples per tree per set, upstream chunks "
          f"{args.gap_ms:g} ms apart; {os.cpu_count()} CPUs")
    print("| set | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for s in range(args.sets):
        p50s = one_set(trees, args.samples, args.gap_ms, reverse=s % 2 == 1)
        rows.append(p50s)
        print(f"| {s + 1} | " + " | ".join(f"{p:.3f}" for p in p50s) + " |", flush=True)
    print()
    for k, name in enumerate(names):
        ratios = [row[k] / row[0] for row in rows]
        print(f"{name:<{width}}  p50 over sets {statistics.median(row[k] for row in rows):.3f} ms, "
              f"x{statistics.median(ratios):.3f} of the first tree (sets: {min(ratios):.3f}-{max(ratios):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
