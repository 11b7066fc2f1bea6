"""The request log's two goals: with 1,000,000 records on a gateway, the newest 100 matching a filter
come back in < 100 ms; logging costs < 20 µs per request on the request path (the enqueue).

Run: `.venv/bin/python tests/bench/requestlog.py [--records 1000000] [--repeat 5] [--dir PATH]`.
The log: 50 keys, 8 models, 97% 200 / 2% 429 / 0.9% 503 / 0.1% 500, a week of traffic, and one rare
key seen 150 times spread over the whole week (every segment holds one or two: nothing is skipped,
the worst case). Each query time is the median of `--repeat` runs (page cache warm, as on a gateway
that serves its log). The enqueue is `RequestLog.finish`, what `app.py` calls per request: the record
built from the request's facts and appended to the queue. Exits 1 when a goal is missed.
"""

from __future__ import annotations

import argparse
import functools
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from llmgw.domain.state import ApiKey  # noqa: E402
from llmgw.gateway.requestlog import RequestLog, RequestRecord, SegmentWriter  # noqa: E402
from llmgw.gateway.requestlog_query import parse_cursor, query  # noqa: E402
from llmgw.wire.logquery import Filters  # noqa: E402

QUERY_BOUND_MS = 100.0
ENQUEUE_BOUND_US = 20.0
WEEK = 7 * 86400


def build(directory: Path, n: int, rng: random.Random) -> float:
    """Write `n` records; returns the time of the newest."""
    writer = SegmentWriter(directory)
    start = 1_700_000_000.0
    rare_every = n // 150
    batch: list[RequestRecord] = []
    for i in range(n):
        t = start + i * WEEK / n
        roll = rng.random()
        status, error = (200, "") if roll < 0.97 else (429, "rate_limited") if roll < 0.99 else \
            (503, "overloaded") if roll < 0.999 else (500, "internal_error")
        key = "key_rare" if i % rare_every == rare_every // 2 else f"key_{rng.randrange(50):02d}"
        model = f"model-{rng.randrange(8)}"
        batch.append(RequestRecord(f"req-gw1-{i:016x}", t, key, model, status, error, f"{model}-r1", "node-a",
                                   "/v1/chat/completions", rng.randrange(2000), rng.randrange(500),
                                   rng.uniform(5, 900), None, "", "gw1"))
        if len(batch) == 10_000:
            writer.write(batch)
            batch = []
    writer.write(batch)
    writer.close()
    return start + WEEK


def timed(fn: object, repeat: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        result = fn()  # type: ignore[operator]
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000, result


@dataclass
class _Facts:
    request_id: str = "req-gw1-0123456789abcdef"
    key: ApiKey | None = ApiKey("sha256:x", "k", "client", 0.0, key_id="key_0123456789")
    model: str = "model-1"
    replica: str = "model-1-r1"
    node: str = "node-a"
    error: str = ""
    tokens_in: int | None = 12
    tokens_out: int | None = 120
    ttft: float | None = None
    guard_rule: str = ""
    served: str = ""


def enqueue_us(calls: int) -> float:
    rlog = RequestLog(None, "gw1", queue_records=calls + 1)
    facts = _Facts()
    import trio

    async def run() -> float:
        started = time.perf_counter()
        for _ in range(calls):
            rlog.finish(facts, "/v1/chat/completions", 200, 1.7e9, 0.0)
        return (time.perf_counter() - started) / calls * 1e6

    return trio.run(run)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--dir", type=Path, help="write the log here (default: a temporary directory)")
    args = parser.parse_args()
    rng = random.Random(7)
    rows: list[tuple[str, float, int, float]] = []
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        directory = Path(tmp) / "requests"
        began = time.perf_counter()
        newest = build(directory, args.records, rng)
        size = sum(p.stat().st_size for p in directory.iterdir())
        print(f"log: {args.records:,} records, {len(list(directory.glob('*.log')))} segments, "
              f"{size / 2**20:.0f} MiB, written in {time.perf_counter() - began:.1f} s")
        cases = [
            ("newest 100, no filter", Filters()),
            ("model=model-3 (1/8)", Filters(model="model-3")),
            ("key=key_17 (1/50)", Filters(key="key_17")),
            ("key + model + status=200", Filters(key="key_17", model="model-3", status="200")),
            ("status=500 (0.1%)", Filters(status="500")),
            ("status=5xx (1%)", Filters(status="5xx")),
            ("key=key_17 + status=500", Filters(key="key_17", status="500")),
            ("key=key_rare (150 in all)", Filters(key="key_rare")),
            ("a day, 3 days ago", Filters(since=newest - 4 * 86400, until=newest - 3 * 86400)),
            ("key=nobody (no match)", Filters(key="nobody")),
        ]
        for name, filters in cases:
            ms, result = timed(functools.partial(query, directory, filters, 100), args.repeat)
            rows.append((name, ms, len(result[0]), QUERY_BOUND_MS))  # type: ignore[index]
        _, first = timed(lambda: query(directory, Filters(model="model-3"), 100), 1)
        cursor = parse_cursor(first[2])  # type: ignore[index]
        ms, page = timed(lambda: query(directory, Filters(model="model-3"), 100, cursor), args.repeat)
        rows.append(("model=model-3, page 2", ms, len(page[0]), QUERY_BOUND_MS))  # type: ignore[index]
    us = statistics.median(enqueue_us(200_000) for _ in range(args.repeat))
    print(f"{'query (newest 100 matching)':<32}{'ms':>9}{'found':>7}{'bound':>8}  result")
    ok = True
    for name, ms, found, bound in rows:
        passed = ms < bound
        ok &= passed
        print(f"{name:<32}{ms:>9.2f}{found:>7}{bound:>8.0f}  {'PASS' if passed else 'FAIL'}")
    passed = us < ENQUEUE_BOUND_US
    ok &= passed
    print(f"{'enqueue per request (µs)':<32}{us:>9.2f}{'':>7}{ENQUEUE_BOUND_US:>8.0f}  {'PASS' if passed else 'FAIL'}")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
