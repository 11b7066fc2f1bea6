"""Fast wake (docs/models.md, "Fast wake"): an idle on-demand model whose definition sets `sleep_level`
sleeps instead of stopping, and wakes before anything starts cold. Pure; `decide` asks it.

The rule. When an idle model (known idle: nothing in flight, not asked for within its `idle_timeout_s`)
scales down, each lone replica that would be stopped is marked asleep instead (`placement.sleep`), and its
agent tells the engine to sleep at the model's level (vLLM `POST /sleep?level=N`: 1 keeps the weights in
CPU RAM, 2 discards them). An asleep replica keeps its placement, so its GPUs stay held, but it serves
nothing and counts as no replica of its model; it is the first thing evicted when another model wants those
GPUs (`demand.evictions` takes asleep replicas first), which stops its engine. When its model is wanted
again, asleep replicas are woken (`placement.sleep` false, then `POST /wake_up`) before any new one is
placed. A multi-node replica never sleeps (it stops as before); nor does a model scaled down by load while
it is still asked for, nor one stopped by `llmgw stop`.
"""

from __future__ import annotations

from dataclasses import replace

from llmgw.domain.model import ModelDef
from llmgw.domain.observed import Observed
from llmgw.domain.settings import effective
from llmgw.domain.state import ClusterState, Placement
from llmgw.reconcile.demand import idle_for
from llmgw.reconcile.failures import Unit

ASLEEP_WORDS = "asleep (sleep level {level}): a request wakes it"


def may_sleep(state: ClusterState, model: ModelDef, observed: Observed, now: float, unit: Unit) -> bool:
    """Whether this replica of `model`, about to be scaled down, sleeps instead of stopping."""
    if not model.sleep_level or model.mode != "on-demand" or len(unit) != 1:
        return False
    if effective(state.settings, "serving.stopped"):
        return False
    idle = idle_for(model, observed, now)
    return idle is not None and idle >= model.idle_timeout_s


def may_keep(state: ClusterState, model: ModelDef) -> bool:
    """Whether the model's asleep replicas may stay asleep: not once serving is stopped (`llmgw stop`)."""
    return bool(model.sleep_level) and model.mode == "on-demand" and not effective(state.settings, "serving.stopped")


def asleep(p: Placement, value: bool) -> Placement:
    return replace(p, asleep=value)


def asleep_words(model: ModelDef) -> str:
    return ASLEEP_WORDS.format(level=model.sleep_level)
