"""How long one reconcile pass (`decide`) takes at fleet scale: 1,000 nodes of 8 GPUs, 2,000 models,
every replica placed and ready; a quiet pass, and a busy one (replicas failed, models scaled up,
definitions changed); each against a naive baseline in the same run, with the ratio.

Run: `.venv/bin/python tests/bench/reconcile.py [--nodes 1000] [--models 2000] [--repeat 5]`.
The naive baseline is the same quiet pass written as a per-model loop: each model looks through
every placement and every replica report for its own (O(models x placements)), which is how a
first version reads and what this pass must not be. Each time is the median of --repeat passes.
Exits 1 when the quiet pass takes longer than the reconcile tick (it runs every tick).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from llmgw.domain.model import ModelDef  # noqa: E402
from llmgw.domain.observed import Gpu, NodeInfo, Observed, ReplicaObs  # noqa: E402
from llmgw.domain.state import ClusterState, Placement  # noqa: E402
from llmgw.domain.timeouts import TIMEOUTS  # noqa: E402
from llmgw.reconcile import decide  # noqa: E402

GPUS_PER_NODE = 8
NOW = 10_000.0


def fleet(nodes: int, models: int) -> tuple[ClusterState, Observed]:
    """A settled fleet: models of 1 or 2 GPUs, 1 to 2 replicas each, packed node by node."""
    infos = {}
    for n in range(nodes):
        name = f"n{n:04d}"
        gpus = tuple(Gpu(i, f"GPU-{n}-{i}", "NVIDIA H100", "h100-80g", 80 << 30, 0) for i in range(GPUS_PER_NODE))
        infos[name] = NodeInfo(name, cpus=64, memory_total=512 << 30, gpus=gpus, engines=("vllm",), fabric="ib-a")
    defs: dict[str, ModelDef] = {}
    placements: dict[str, Placement] = {}
    replicas: dict[str, ReplicaObs] = {}
    cursor = 0  # the next free GPU, counted over the whole fleet
    for m in range(models):
        gpus, count = 1 + m % 2, 1 + (m % 3 == 0)
        name = f"model-{m:04d}"
        model = ModelDef.from_doc({"name": name, "engine": "vllm", "source": f"hf://org/{name}",
                                   "replicas": {"min": count, "max": count}, "profile": {"gpus": gpus, "tp": gpus}})
        defs[name] = model
        for slot in range(count):
            if cursor % GPUS_PER_NODE + gpus > GPUS_PER_NODE:
                cursor += GPUS_PER_NODE - cursor % GPUS_PER_NODE
            node = f"n{cursor // GPUS_PER_NODE:04d}"
            rid = f"{name}-r{len(placements) + 1}"
            held = tuple(range(cursor % GPUS_PER_NODE, cursor % GPUS_PER_NODE + gpus))
            placements[rid] = Placement(rid, name, node, held, model.launch_hash(), 1.0, slot=slot)
            replicas[rid] = ReplicaObs(rid, name, node, "ready", f"http://{node}:{40000 + len(replicas)}")
            cursor += gpus
    if cursor > nodes * GPUS_PER_NODE:
        raise SystemExit(f"{models} models need {cursor} GPUs; the fleet has {nodes * GPUS_PER_NODE}")
    state = ClusterState(revision=1, models=MappingProxyType(defs), placements=MappingProxyType(placements),
                         next_replica=len(placements) + 1)
    return state, Observed(infos, replicas, {}, {}, 0.0)


def busy(state: ClusterState, observed: Observed) -> tuple[ClusterState, Observed]:
    """The same fleet on a bad tick: 20 replicas failed, 20 models scaled up by one, 10 changed."""
    models = dict(state.models)
    names = sorted(models)
    for name in names[1:40:2]:
        m = models[name]
        models[name] = replace(m, replicas_min=m.replicas_min + 1, replicas_max=m.replicas_max + 1)
    for name in names[100:110]:
        models[name] = replace(models[name], args=("--changed",))
    replicas = dict(observed.replicas)
    for rid in sorted(replicas)[500:520]:
        replicas[rid] = replace(replicas[rid], state="failed", url="", error="engine exited with status 1")
    return replace(state, models=MappingProxyType(models)), replace(observed, replicas=replicas)


def short(state: ClusterState, observed: Observed) -> tuple[ClusterState, Observed]:
    """The same fleet short of GPUs: every 4th model on-demand and idle (victims everywhere, none
    freeing a whole node), and one model of 8 GPUs per node: those beyond the free nodes fit nowhere
    and look for room every pass."""
    models, demand = dict(state.models), {}
    for name in sorted(models)[::4]:
        models[name] = replace(models[name], mode="on-demand", replicas_min=0, idle_timeout_s=100000.0)
        demand[name] = NOW - 50000
    for i in range(len(observed.nodes)):
        name = f"wide-{i:04d}"
        models[name] = ModelDef.from_doc({"name": name, "engine": "vllm", "source": f"hf://o/{name}",
                                          "profile": {"gpus": 8, "tp": 8}})
    return replace(state, models=MappingProxyType(models)), replace(observed, demand=demand)


def naive_pass(state: ClusterState, observed: Observed) -> int:
    """The quiet pass as a per-model loop over everything: what this pass must not be."""
    busy = 0
    for name, model in sorted(state.models.items()):
        launch = model.launch_hash()
        mine = [p for p in state.placements.values() if p.model == name]
        reports = [o for o in observed.replicas.values() if o.model == name]
        ready = [o for o in reports if o.state == "ready"]
        busy += sum(1 for p in mine if p.launch_hash != launch) + (len(ready) < model.replicas_min)
    return busy


def timed(fn: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--models", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    state, observed = fleet(args.nodes, args.models)
    quiet = decide(state, observed, NOW)
    assert quiet.commands == () and quiet.actions == (), "the fleet is not settled"
    hot_state, hot_observed = busy(state, observed)
    hot = decide(hot_state, hot_observed, NOW)
    quiet_s = timed(lambda: decide(state, observed, NOW), args.repeat)
    busy_s = timed(lambda: decide(hot_state, hot_observed, NOW), args.repeat)
    short_state, short_observed = short(state, observed)
    scarce = decide(short_state, short_observed, NOW)
    short_s = timed(lambda: decide(short_state, short_observed, NOW), args.repeat)
    naive_s = timed(lambda: naive_pass(state, observed), max(1, args.repeat // 2))
    rows = [("quiet pass (nothing to do)", quiet_s, f"{naive_s / quiet_s:.1f}x faster"),
            (f"busy pass ({len(hot.commands)} commands, {len(hot.actions)} messages)", busy_s,
             f"{naive_s / busy_s:.1f}x faster"),
            (f"short of GPUs ({len(scarce.unplaceable)} unplaceable, evictions searched)", short_s,
             f"{naive_s / short_s:.1f}x faster"),
            ("naive per-model scan (baseline, reads only)", naive_s, "1.0x")]
    print(f"reconcile pass: {args.nodes} nodes x {GPUS_PER_NODE} GPUs, {args.models} models, "
          f"{len(state.placements)} replicas (median of {args.repeat})")
    print(f"{'pass':<52} {'ms':>9}  vs naive")
    for what, seconds, ratio in rows:
        print(f"{what:<52} {seconds * 1000:>9.1f}  {ratio}")
    bound = TIMEOUTS.reconcile_tick_s
    failed = [what for what, seconds in (("a quiet pass", quiet_s), ("a busy pass", busy_s),
                                         ("a pass short of GPUs", short_s)) if seconds >= bound]
    for what in failed:
        print(f"FAIL: {what} takes longer than the {bound:g} s reconcile tick")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
