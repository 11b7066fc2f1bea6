"""The model commands: `model.put` (a definition, new or changed), `model.remove` and `model.retry`
(by name); their builders, stateless checks and changes.

A definition whose launch (source or profile) changed un-parks its model; a removal leaves the
model's placements to the reconciler, which stops their replicas and removes them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from llmgw.domain import levels
from llmgw.domain.codec import later_level
from llmgw.domain.commands.core import CommandError, make, parsed, readonly, required
from llmgw.domain.model import DefinitionError, ModelDef, catalog_problems
from llmgw.domain.state import ClusterState


def put_model(model: ModelDef, at: float) -> dict[str, Any]:
    """A definition that sets a field an earlier release cannot read needs the store level that brought it."""
    command = make("model.put", at, model=model.to_doc())
    return levels.stamp(command, later_level(model))


def remove_model(name: str, at: float) -> dict[str, Any]:
    return make("model.remove", at, name=name)


def retry_model(name: str, at: float) -> dict[str, Any]:
    return make("model.retry", at, name=name)


def check_put(c: dict[str, Any]) -> ModelDef:
    """The command's definition, read: one that does not read is refused (`invalid_model`)."""
    return parsed(c, "model", ModelDef.from_doc, DefinitionError, "invalid_model")


def check_name(c: dict[str, Any]) -> None:
    """`model.remove` and `model.retry` name the model."""
    required(c, "name")


def apply_put(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    model = check_put(c)
    # Fallbacks and aliases are judged against the catalog as it is when the definition applies.
    if problems := catalog_problems(model, s.models):
        raise CommandError("invalid_model", "; ".join(f"{f}: {m}" for f, m in problems))
    health = s.health.copy()
    old = s.models.get(model.name)
    if old is not None and old.launch_hash() != model.launch_hash():
        health.pop(model.name, None)  # a new source or profile un-parks
    models = s.models | {model.name: model}
    return replace(s, models=readonly(models), health=readonly(health)), {"created": old is None}


def apply_remove(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    model = c["name"]
    if model not in s.models:
        raise CommandError("model_not_found", f"no model named {model!r}")
    models = {k: v for k, v in s.models.items() if k != model}
    health = {k: v for k, v in s.health.items() if k != model}
    # Placements stay until the reconciler stops their replicas and removes them.
    return replace(s, models=readonly(models), health=readonly(health)), {"removed": model}


def apply_retry(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    model = c["name"]
    if model not in s.models:
        raise CommandError("model_not_found", f"no model named {model!r}")
    health = {k: v for k, v in s.health.items() if k != model}
    return replace(s, health=readonly(health)), {"retried": model}
