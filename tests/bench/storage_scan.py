"""How long a storage scan takes on a 2,000-file tree, first and again with nothing changed
(the rescan re-reads no file: it only lists directories and stats entries).

Run: `.venv/bin/python tests/bench/storage_scan.py [--files 2000] [--repeat 3] [--dir PATH]`.
The tree (`tests.support.weights_tree.build_tree`): 20-file folders of 8 GGUFs, one 3-shard
safetensors model, 3 partial downloads and 4 junk files. Each time is the median of `--repeat`
scans (the first scan: each on a fresh scanner, so each reads every header). Exits 1 when the
unchanged rescan takes 1 s or more.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from llmgw.agent.storage import StorageDir, StorageScanner  # noqa: E402
from tests.support.weights_tree import build_tree  # noqa: E402

RESCAN_BOUND_S = 1.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", type=Path, help="build the tree here (default: a temporary directory)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp) / "models"
        counts = build_tree(root, args.files)
        dirs = [StorageDir(root, "ib-a")]
        first: list[float] = []
        for _ in range(args.repeat):
            scanner = StorageScanner(dirs)
            started = time.perf_counter()
            (report,) = scanner.scan_reports()
            first.append(time.perf_counter() - started)
        reads = scanner.reads
        again: list[float] = []
        for _ in range(args.repeat):
            started = time.perf_counter()
            scanner.scan_reports()
            again.append(time.perf_counter() - started)
    t1, t2 = statistics.median(first), statistics.median(again)
    print(f"tree: {counts['files']} files: {counts['gguf']} GGUF, {counts['safetensors']} safetensors models, "
          f"{counts['partial']} partial downloads, {counts['junk']} junk")
    print(f"found: {len(report.models)} models, {len(report.not_weights) + report.omitted} not weights, "
          f"error {report.error!r}")
    print(f"{'scan':<22}{'seconds':>10}{'files read':>12}")
    print(f"{'first':<22}{t1:>10.3f}{reads:>12}")
    print(f"{'rescan, unchanged':<22}{t2:>10.3f}{scanner.reads - reads:>12}")
    print(f"{'ratio first/rescan':<22}{t1 / t2:>10.1f}")
    ok = t2 < RESCAN_BOUND_S and scanner.reads == reads
    print(f"{'PASS' if ok else 'FAIL'}: rescan {t2:.3f} s (bound {RESCAN_BOUND_S:.0f} s), "
          f"{scanner.reads - reads} files re-read (bound 0)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
