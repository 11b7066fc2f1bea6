"""What resolving a request's model name costs the request path (gateway/names.py, docs/api.md "Fallbacks and
aliases"), beside the scope check it replaced (`KeyCheck.model`, one dict lookup): a plain model name, a model
with two fallbacks (resolved, not tried), an alias, a group alias of 4 models (ordered by the router's load),
in a catalog of `--models` models (a quarter with aliases); and the alias table's rebuild when the catalog changes
(paid once per new table, not per request). Prints a table; each figure is the median over rounds.

Run: `.venv/bin/python tests/bench/names.py [--models 2000] [--calls 200000] [--rounds 5]`.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import trio

from llmgw.domain.model import ModelDef
from llmgw.domain.observed import Endpoint, ModelRoute
from llmgw.domain.state import ApiKey, ClusterState
from llmgw.gateway.auth import KeyCheck
from llmgw.gateway.names import Names, alias_groups
from llmgw.gateway.router import Router


def catalog(models: int) -> dict[str, ModelDef]:
    out = {}
    for i in range(models):
        extra: dict[str, Any] = {}
        if i % 4 == 0:
            extra["aliases"] = [f"alias-{i}"]
        if i % 5 == 0 and i >= 2:
            extra["fallbacks"] = [f"m{i - 1:05d}", f"m{i - 2:05d}"]
        if i < 4:
            extra["aliases"] = ["group"]
        out[f"m{i:05d}"] = ModelDef.from_doc({"name": f"m{i:05d}", "engine": "sim", "source": f"sim://m{i}", **extra})
    return out


def _per_call_ns(fn: Any, calls: int) -> float:
    started = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - started) / calls


def measure(models: int = 2000, calls: int = 200_000, rounds: int = 5) -> dict[str, float]:
    """ns per call of each case, and ms for one rebuild of the alias table."""
    results: dict[str, float] = {}

    async def run() -> None:
        defs = catalog(models)
        snap = ClusterState(models=defs)  # type: ignore[arg-type]  # a plain dict is read the same
        key = ApiKey("sha256:x", "k", "client", 0.0, key_id="key_0123456789")
        router = Router()
        router.update_routes({name: ModelRoute(name, "chat", "ready", (Endpoint(f"{name}-r1", "http://127.0.0.1:1"),))
                              for name in list(defs)[:8]})
        names = Names()
        check = KeyCheck()
        plain, fallen = "m00001", "m00005"
        cases = {
            "baseline: KeyCheck.model (the lookup it replaced)": lambda: check.model(key, snap, plain),
            "a model's own name": lambda: check.models(key, snap, plain, names.groups(snap.models),
                                                       router.least_loaded),
            "a model with 2 fallbacks": lambda: check.models(key, snap, fallen, names.groups(snap.models),
                                                             router.least_loaded),
            "an alias": lambda: check.models(key, snap, "alias-8", names.groups(snap.models), router.least_loaded),
            "a group alias of 4 models": lambda: check.models(key, snap, "group", names.groups(snap.models),
                                                              router.least_loaded),
        }
        samples: dict[str, list[float]] = {name: [] for name in cases}
        rebuilds = []
        for _ in range(rounds):
            for name, fn in cases.items():
                samples[name].append(_per_call_ns(fn, calls))
            started = time.perf_counter()
            alias_groups(defs)
            rebuilds.append((time.perf_counter() - started) * 1000)
        results.update({name: statistics.median(v) for name, v in samples.items()})
        results["rebuild_ms"] = statistics.median(rebuilds)

    trio.run(run)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--models", type=int, default=2000)
    ap.add_argument("--calls", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    r = measure(args.models, args.calls, args.rounds)
    rebuild = r.pop("rebuild_ms")
    base = next(iter(r.values()))
    width = max(len(name) for name in r)
    print(f"{'case (' + str(args.models) + ' models)':<{width}}  {'ns/call':>8}  {'vs baseline':>11}")
    for name, ns in r.items():
        print(f"{name:<{width}}  {ns:8.0f}  {ns / base:10.2f}x")
    print(f"alias table rebuilt for a new catalog: {rebuild:.2f} ms (once per table change, not per request)")


if __name__ == "__main__":
    main()
