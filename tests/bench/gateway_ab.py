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

`--floors` puts four more in the rotation: the upstream itself (`direct`), and `tests/bench/_relay.py` copying bytes
(`relay`), reading HTTP (`relay-http`) and as llmgw's own server under a minimal ASGI app (`relay-front`); each
row then also says what it adds to `direct`'s p50 in the same set (median over sets). What each tree adds above
`relay-front` is its gateway's own, above the server every llmgw listener runs.
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


# What `--floors` adds to the rotation: the upstream itself, and _relay.py in each of its modes.
FLOORS: dict[str, tuple[str, ...] | None] = {"direct": None, "relay": (), "relay-http": ("--http",),
                                             "relay-front": ("--front",)}


def one_set(trees: list[Path], samples: int, gap_ms: float, reverse: bool, warm: int = WARM,
            floors: tuple[str, ...] = ()) -> list[float]:
    """Fresh processes, then the p50 time to first chunk (ms) over `samples` requests each, in turn, of each tree's
    gateway and then of each of `floors` (names of `FLOORS`)."""
    key = "sk-ab-" + os.urandom(8).hex()
    procs = Procs()
    clients: list[_probe.Client] = []
    targets: list[Path | str] = [*trees, *floors]
    try:
        _, upstream = procs.start([sys.executable, str(HERE / "_upstream.py"), "--port", "0", "--gap-ms", str(gap_ms)])
        urls: dict[Path | str, str] = {}
        with tempfile.TemporaryDirectory() as tmp:
            for i, target in enumerate(targets[::-1] if reverse else targets):
                if isinstance(target, Path):
                    env = {**os.environ, KEY_ENV: key, "PYTHONPATH": str(target)}
                    _, urls[target] = procs.start(gateway_args(target, upstream, Path(tmp) / f"log-{i}"), env)
                elif (mode := FLOORS[target]) is None:
                    urls[target] = upstream
                else:
                    _, urls[target] = procs.start([sys.executable, str(HERE / "_relay.py"), *mode, upstream])
            clients = [_probe.Client(urls[target], key) for target in targets]
            paths = [urlsplit(urls[target]).path + PATH for target in targets]
            taken: list[list[float]] = [[] for _ in targets]
            count = len(targets)
            for n in range(warm + samples):
                for k in ((n + i) % count for i in range(count)):  # each one in each place in turn
                    status, first, _end, answer = clients[k].post(paths[k], STREAM)
                    if status != 200 or not answer.rstrip().endswith(b"data: [DONE]"):
                        raise RuntimeError(f"{targets[k]} answered {status}: {answer[:200]!r}")
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
    parser.add_argument("--floors", action="store_true",
                        help="the upstream itself and tests/bench/_relay.py's three modes in the rotation too")
    args = parser.parse_args()
    trees = [tree.resolve() for tree in args.trees]
    for tree in trees:
        if not (tree / "tests" / "bench" / "gateway.py").is_file() or not (tree / "llmgw").is_dir():
            parser.error(f"{tree} is not a checkout of this repository")
    floors = tuple(FLOORS) if args.floors else ()
    names = [str(tree) for tree in trees] + list(floors)
    width = max(len(name) for name in names)
    rows: list[list[float]] = []
    print(f"stream time to first chunk, p50 (ms), c=1, {args.samples} samples per tree per set, upstream chunks "
          f"{args.gap_ms:g} ms apart; {os.cpu_count()} CPUs")
    print("| set | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for s in range(args.sets):
        p50s = one_set(trees, args.samples, args.gap_ms, reverse=s % 2 == 1, floors=floors)
        rows.append(p50s)
        print(f"| {s + 1} | " + " | ".join(f"{p:.3f}" for p in p50s) + " |", flush=True)
    print()
    direct = names.index("direct") if floors else None
    for k, name in enumerate(names):
        ratios = [row[k] / row[0] for row in rows]
        added = "" if direct is None else \
            f", adds {statistics.median(row[k] - row[direct] for row in rows):.3f} ms to direct's"
        print(f"{name:<{width}}  p50 over sets {statistics.median(row[k] for row in rows):.3f} ms{added}, "
              f"x{statistics.median(ratios):.3f} of the first tree (sets: {min(ratios):.3f}-{max(ratios):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
