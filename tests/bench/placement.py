"""Placement at fleet scale: a full plan, and one placement into a full fleet, each beside a naive
baseline measured in the same run, with the ratio and the goal.

Run: `.venv/bin/python tests/bench/placement.py [--repeat 3] [--quick]`. Cases, each on a uniform
fleet (`fleet`: nodes of 8 GPUs, a handful of shapes) and on a mixed one (`mixed_fleet`: GPU counts,
generations, memory, MIG layouts and reserves differing per node, about one shape per node):
- plan 500 models on 1,024 GPUs (128 nodes) — goal 50 ms uniform, 25 ms mixed;
- plan 2,000 models on 8,000 GPUs (1,000 nodes) — goal 250 ms;
- one incremental placement (place + add) into the 1,000-node fleet after its plan — goal 1 ms.
The last lines say how much longer the mixed fleet's plan takes than the uniform one's (machines
differ; the ratio says what the mixed goals ask wherever it runs).
A plan: one `FleetView`, then for each model (by name) `place` and `take` per replica. The
baseline: `place(model, nodes, placements)` per replica, rebuilding everything each call (what a
caller without the view does). The fleet: 4 fabrics; one node in 16 has a sick GPU, one in 32
is a node of MIG instances; local and shared storage hold some models. Models: 1, 2, 4 or 8 GPUs,
some with classes or memory, 1 to 3 replicas; deterministic (seeded). Each time is the best of
`--repeat`. The garbage collector is set as in the control plane (`cli/_collector.py`). Exits 1 when a
goal is missed.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from llmgw.cli import _collector  # noqa: E402
from llmgw.domain.model import ModelDef  # noqa: E402
from llmgw.domain.observed import NodeInfo  # noqa: E402
from llmgw.domain.state import Placement  # noqa: E402
from llmgw.placement import FleetView, place  # noqa: E402
from llmgw.testing.builders import model, node  # noqa: E402

FABRICS = ("ib-a", "ib-b", "ib-c", "ib-d")


def fleet(count: int, gpus: int = 8, seed: int = 1) -> dict[str, NodeInfo]:
    rng = random.Random(seed)
    out = {}
    for i in range(count):
        name = f"n{i:04d}"
        fabric = FABRICS[i % len(FABRICS)]
        b = node(name).engines("vllm", "llama.cpp", "sim").fabric(fabric)
        if i % 32 == 31:
            for card in range(gpus // 2):
                b = b.mig(card, "a100-80g", ("3g.40gb", 40), ("3g.40gb", 40))
        else:
            b = b.gpus(gpus, "h100-80g" if i % 3 else "a100-80g", unhealthy=[rng.randrange(gpus)] if i % 16 == 7 else ())
        info = b.build()
        storage = []
        if i % 10 == 0:  # a local disk holding a few models
            storage.append({"path": "/local", "fabric": fabric, "shared": False, "error": "", "not_weights": [],
                            "models": [{"name": f"m{k:04d}", "path": f"/local/m{k:04d}", "kind": "safetensors",
                                        "size": 1} for k in rng.sample(range(2000), 5)]})
        if i % 50 == 1:  # a shared filer on this fabric
            storage.append({"path": "/filer", "fabric": fabric, "shared": True, "error": "", "not_weights": [],
                            "models": [{"name": f"m{k:04d}", "path": f"/filer/m{k:04d}", "kind": "safetensors",
                                        "size": 1} for k in rng.sample(range(2000), 20)]})
        out[name] = replace(info, storage=tuple(storage))
    return out


GENERATIONS = (("h100-80g", 80), ("a100-80g", 80), ("a100-40g", 40), ("l40s-48g", 48), ("h200-141g", 141))
MIG_LAYOUTS = ((("3g.40gb", 40), ("3g.40gb", 40)), (("2g.20gb", 20),) * 3, (("1g.10gb", 10),) * 7,
               (("4g.40gb", 40), ("2g.20gb", 20), ("1g.10gb", 10)))


def mixed_fleet(count: int, seed: int = 1) -> dict[str, NodeInfo]:
    """`fleet`'s nodes with each one's shape its own: 4 to 12 GPUs (8 on average) of one of five
    generations, each GPU's memory as a probe reports it (a little under the card's size, per node),
    the machine's memory, some cards in MIG mode (four layouts), a reserve on one node in 8 (a GPU,
    some memory of each GPU, or memory), a sick GPU on one in 16: `count` nodes of about `count` shapes."""
    rng = random.Random(seed)
    out = {}
    for i in range(count):
        name = f"n{i:04d}"
        fabric = FABRICS[i % len(FABRICS)]
        gpus = rng.choice((4, 6, 8, 8, 10, 12))
        gpu_class, size = rng.choice(GENERATIONS)
        b = node(name).engines("vllm", "llama.cpp", "sim").fabric(fabric).memory_gib(rng.randrange(256, 2048, 16))
        sick = [rng.randrange(gpus)] if rng.random() < 1 / 16 else []
        b = b.gpus(gpus, gpu_class, memory_gib=size - rng.randrange(1, 40) / 20, unhealthy=sick)
        if rng.random() < 1 / 8:
            layout = rng.choice(MIG_LAYOUTS)
            for card in range(rng.randrange(1, 4)):
                b = b.mig(gpus + card, "a100-80g", *layout)
        info = b.build()
        roll = rng.random()
        if roll < 1 / 24:
            info = replace(info, reserved_gpus=(0,))
        elif roll < 2 / 24:
            info = replace(info, reserved_vram=rng.choice((4, 8, 16)) << 30)
        elif roll < 3 / 24:
            info = replace(info, reserved_memory=rng.choice((32, 64)) << 30)
        storage = []
        if i % 10 == 0:  # a local disk holding a few models, a shared filer on one node in 50 (as `fleet`)
            storage.append({"path": "/local", "fabric": fabric, "shared": False, "error": "", "not_weights": [],
                            "models": [{"name": f"m{k:04d}", "path": f"/local/m{k:04d}", "kind": "safetensors",
                                        "size": 1} for k in rng.sample(range(2000), 5)]})
        if i % 50 == 1:
            storage.append({"path": "/filer", "fabric": fabric, "shared": True, "error": "", "not_weights": [],
                            "models": [{"name": f"m{k:04d}", "path": f"/filer/m{k:04d}", "kind": "safetensors",
                                        "size": 1} for k in rng.sample(range(2000), 20)]})
        out[name] = replace(info, storage=tuple(storage))
    return out


def models(count: int, seed: int = 2) -> list[tuple[ModelDef, int]]:
    """(model, replicas), by name."""
    rng = random.Random(seed)
    out = []
    for k in range(count):
        name = f"m{k:04d}"
        gpus = rng.choices([1, 2, 4, 8], weights=[60, 25, 12, 3])[0]
        b = model(name).vllm(f"/filer/{name}" if k % 2 else f"/local/{name}").gpus(gpus)
        roll = rng.random()
        if roll < 0.1:
            b = b.classes("a100-80g")
        elif roll < 0.15 and gpus == 1:
            b = b.classes("a100-80g-mig-3g.40gb")
        if rng.random() < 0.3:
            b = b.memory(rng.choice([20, 40, 70]) * gpus)
        out.append((b.build(), rng.choices([1, 2, 3], weights=[70, 20, 10])[0]))
    return out


def plan_with_view(nodes: dict[str, NodeInfo], wanted: list[tuple[ModelDef, int]]) -> FleetView:
    view = FleetView(nodes, (), {m.name: m for m, _ in wanted})
    for m, count in wanted:
        for r in range(count):
            result = view.place(m)
            if result.choice is None:
                break
            view.take(m, result.choice, f"{m.name}-r{r}")
    return view


def plan_naive(nodes: dict[str, NodeInfo], wanted: list[tuple[ModelDef, int]]) -> list[Placement]:
    placements: list[Placement] = []
    for m, count in wanted:
        for r in range(count):
            choice = place(m, nodes, placements).choice
            if choice is None:
                break
            placements.append(Placement(f"{m.name}-r{r}", m.name, choice.node, choice.gpus, "h", 0.0))
    return placements


def best_of(repeat: int, fn: Callable[[], object]) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


@dataclass
class Row:
    case: str
    ours_s: float
    naive_s: float
    goal_s: float

    def line(self) -> str:
        ratio = self.naive_s / self.ours_s if self.ours_s else float("inf")
        verdict = "PASS" if self.ours_s <= self.goal_s else "FAIL"
        return (f"{self.case:<72} {self.ours_s * 1000:>9.2f} {self.naive_s * 1000:>11.2f} {ratio:>7.1f}x "
                f"{self.goal_s * 1000:>7.1f} {verdict}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="the naive baseline once, on a tenth of the models "
                                                              "(its time scaled up); for CI")
    args = parser.parse_args()
    _collector.settle()  # the garbage collector as in the control plane, where plans run
    rows: list[Row] = []
    plans: dict[tuple[str, int], float] = {}
    for kind, make in (("uniform", fleet), ("mixed", mixed_fleet)):
        small_goal = 0.050 if kind == "uniform" else 0.025
        for label, n_nodes, n_models, goal in (("500 models on 1,024 GPUs", 128, 500, small_goal),
                                               ("2,000 models on 8,000 GPUs", 1000, 2000, 0.250)):
            nodes, wanted = make(n_nodes), models(n_models)
            ours = best_of(args.repeat, lambda: plan_with_view(nodes, wanted))
            plans[kind, n_nodes] = ours
            view = plan_with_view(nodes, wanted)
            if args.quick:
                part = wanted[: max(1, len(wanted) // 10)]
                naive = best_of(1, lambda: plan_naive(nodes, part)) * len(wanted) / len(part)
            else:
                naive = best_of(1, lambda: plan_naive(nodes, wanted))
                check = plan_naive(nodes, wanted)
                same = sorted((p.replica_id, p.node, p.gpus) for p in check)
                if same != sorted((p.replica_id, p.node, p.gpus) for p in view.placements.values()):
                    print(f"{kind} {label}: the view and the naive baseline disagree", file=sys.stderr)
                    return 1
            shapes = len({id(n.shape) for n in view.nodes.values()})
            rows.append(Row(f"plan, {kind}: {label} ({len(view.placements)} placed, {shapes} shapes)", ours, naive,
                            goal))
        # One more placement into the full 1,000-node fleet: place + take, then remove (so each try
        # sees the same fleet); the baseline rebuilds from the placements.
        nodes, wanted = make(1000), models(2000)
        view = plan_with_view(nodes, wanted)
        extra = [replace(m, name="x" + m.name) for m, _ in models(200, seed=3)]

        def one_each() -> None:
            for m in extra:
                result = view.place(m)
                if result.choice is not None:
                    for p in view.take(m, result.choice, m.name + "-r0"):
                        view.remove(p.replica_id)

        per = best_of(args.repeat, one_each) / len(extra)
        current = list(view.placements.values())
        sample = extra[:10] if args.quick else extra[:50]
        naive = best_of(1, lambda: [place(m, nodes, current) for m in sample]) / len(sample)
        rows.append(Row(f"one placement into 1,000 {kind} nodes (full plan)", per, naive, 0.001))
    print(f"{'case':<72} {'ours ms':>9} {'naive ms':>11} {'ratio':>8} {'goal ms':>7} result")
    for row in rows:
        print(row.line())
    # Issue 26 set the mixed goals where the uniform plans took 8.7 and 37 ms: at most 2.9x and 6.8x those.
    for n_nodes, label, most in ((128, "500 on 1,024 GPUs", 25 / 8.7), (1000, "2,000 on 8,000 GPUs", 250 / 37)):
        print(f"mixed / uniform, {label}: {plans['mixed', n_nodes] / plans['uniform', n_nodes]:.2f}x "
              f"(at most {most:.1f}x)")
    return 0 if all(r.ours_s <= r.goal_s for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
