"""The admin API's schemathesis fuzz, longer: tests/integration/test_admin_schemathesis.py with a big budget,
against a real control plane (pysyncobj on loopback, the admin API over HTTP) served from a thread.

Run: `.venv/bin/python tests/bench/fuzz_admin.py [--examples 300] [--seed N] [--no-coverage]`.
Per operation of the document it serves: schemathesis's coverage cases (each value at its bounds and each way
to break one), then `--examples` random cases, half valid and half not. Prints the cases sent, the answers by
status, the 5xx among them, and every broken check with the request that broke it. Exit status 1 then.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import requests
from hypothesis import HealthCheck, given, seed, settings

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from llmgw.control.api.openapi import document  # noqa: E402
from tests.support.admin_fuzz import (Tally, coverage_cases, fuzz_cases, live_control, load_schema,  # noqa: E402
                                      operation, send_and_check)


def _broken(error: BaseException) -> str:
    return " ".join(str(error).split())[:600]


def run(op: Any, schema: Any, session: requests.Session, tally: Tally, examples: int, rng_seed: int,
        coverage: bool) -> list[str]:
    """Every broken check of `op`'s coverage cases, and the first of its random ones (Hypothesis shrinks it)."""
    failures = []
    if coverage:
        for case in coverage_cases(schema, op):
            try:
                send_and_check(case, session, tally)
            except (Exception, BaseExceptionGroup) as error:
                failures.append(f"coverage: {_broken(error)}")

    @seed(rng_seed)
    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(case=fuzz_cases(op))
    def fuzz(case: Any) -> None:
        send_and_check(case, session, tally)

    try:
        fuzz()
    except (Exception, BaseExceptionGroup) as error:
        failures.append(f"fuzzing: {_broken(error)}")
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=300, help="random cases per operation (default 300)")
    parser.add_argument("--seed", type=int, default=int(time.time()), help="Hypothesis seed (default: the time)")
    parser.add_argument("--no-coverage", action="store_true", help="skip the coverage cases")
    args = parser.parse_args()
    # schemathesis's own strategies call `random` (its business, not ours): Hypothesis warns of it per case.
    warnings.filterwarnings("ignore", "Do not use the `random` module inside strategies")
    print(f"seed {args.seed}")
    total = Tally()
    broken = 0
    started = time.perf_counter()
    with live_control() as url, requests.Session() as session:
        schema = load_schema(url)
        for path, ops in document()["paths"].items():
            for method in ops:
                tally = Tally()
                failures = run(operation(schema, method, path), schema, session, tally, args.examples, args.seed,
                               not args.no_coverage)
                total.statuses.update(tally.statuses)
                total.unsendable += tally.unsendable
                broken += len(failures)
                print(f"{method.upper():6} {path}: {tally.line()}")
                for failure in failures:
                    print(f"    BROKEN {failure}", file=sys.stderr)
    server_errors = sum(n for status, n in total.statuses.items() if status >= 500)
    print(f"all: {total.line()} in {time.perf_counter() - started:.1f} s; {server_errors} answers of 5xx; "
          f"{broken} broken checks")
    return 1 if broken or server_errors else 0


if __name__ == "__main__":
    sys.exit(main())
