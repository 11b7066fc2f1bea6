"""The gateway and admin fuzz, longer: the strategies of tests/integration/test_gateway_fuzz.py with a big
budget, against a real gateway over sim engines and the admin API, each served from a thread.

Run: `.venv/bin/python tests/bench/fuzz_gateway.py [--examples 5000] [--admin-examples 2000] [--seed N]`.
Prints the answers by status and stops at the first that breaks the rule (a 5xx, an HTML page, a refusal
outside the API's error shape), with the request Hypothesis shrank it to. Exit status 1 then.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support.fuzz_http import (Probe, admin_probes, check_answer, live_admin, live_gateway,  # noqa: E402
                                     v1_probes)


def _run(name: str, examples: int, rng_seed: int, client: httpx.Client, probes: Any, shape: str) -> bool:
    statuses: collections.Counter[int] = collections.Counter()
    started = time.perf_counter()

    @seed(rng_seed)
    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(probe=probes)
    def fuzz(probe: Probe) -> None:
        response = probe.send(client)
        statuses[response.status_code] += 1
        check_answer(probe, response, shape)

    ok = True
    try:
        fuzz()
    except AssertionError as error:
        print(f"{name}: BROKEN: {error}", file=sys.stderr)
        ok = False
    elapsed = time.perf_counter() - started
    tally = ", ".join(f"{status}: {count}" for status, count in sorted(statuses.items()))
    print(f"{name}: {sum(statuses.values())} requests in {elapsed:.1f} s ({tally})")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=5000, help="requests to /v1 (default 5000)")
    parser.add_argument("--admin-examples", type=int, default=2000, help="requests to the admin API (default 2000)")
    parser.add_argument("--seed", type=int, default=int(time.time()), help="Hypothesis seed (default: the time)")
    args = parser.parse_args()
    print(f"seed {args.seed}")
    ok = True
    with live_gateway() as url, httpx.Client(base_url=url, timeout=30) as client:
        ok &= _run("/v1", args.examples, args.seed, client, v1_probes(), "openai")
    with live_admin() as (url, rules), httpx.Client(base_url=url, timeout=30) as client:
        ok &= _run("/api/v1", args.admin_examples, args.seed, client, st.just(rules).flatmap(admin_probes), "admin")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
