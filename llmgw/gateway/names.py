"""Public model names on `/v1`: a model's own name, its aliases (one alias on several models is a group),
and the models a request may be served by, in the order they are tried (the model or group, then their
fallbacks). Pure, but for `Names`, which keeps the alias table of the last catalog it saw.

The rules (docs/api.md, "Fallbacks and aliases"):
- a model's name wins over an alias (the admin API refuses an alias that is a model's name, and a
  model named as an existing alias);
- a group alias's models are tried least loaded first (`order`, the router's), then the others;
- then each tried model's fallbacks in its definition's order, one level deep (a fallback's own
  fallbacks are not followed), each model at most once, a name no longer defined passed over;
- a scoped key may use a model its scope names; an alias when its scope names the alias (then every
  model of the alias) or one of the alias's models (then those of them it names). A fallback is used
  only when the scope names it: a key never reaches a model through a fallback it could not ask for.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from llmgw.domain.model import ModelDef

__all__ = ["Names", "alias_groups", "candidates", "visible_names"]

Order = Callable[[tuple[str, ...]], Sequence[str]]


def alias_groups(models: Mapping[str, ModelDef]) -> dict[str, tuple[str, ...]]:
    """Alias -> the models that carry it (sorted by name), for every alias that is not a model's name."""
    groups: dict[str, list[str]] = {}
    for name in sorted(models):
        for alias in models[name].aliases:
            if alias not in models:
                groups.setdefault(alias, []).append(name)
    return {alias: tuple(names) for alias, names in groups.items()}


def _keep(names: Sequence[str]) -> tuple[str, ...]:
    return tuple(names)


def candidates(models: Mapping[str, ModelDef], groups: Mapping[str, tuple[str, ...]], name: str,
               scope: frozenset[str] | None, order: Order = _keep) -> list[ModelDef]:
    """The models that may serve a request for `name` by a key of `scope` (None: every model), in the order
    they are tried; empty when `name` is neither a model nor an alias this key may use."""
    model = models.get(name)
    if model is not None:
        if scope is not None and name not in scope:
            return []
        if not model.fallbacks:
            return [model]  # the common case: one lookup
        first: Sequence[str] = (name,)
    else:
        group = groups.get(name, ())
        if scope is not None and name not in scope:
            group = tuple(m for m in group if m in scope)
        first = order(group) if len(group) > 1 else group
    if not first:
        return []
    tried = list(first)
    seen = set(tried)
    for primary in first:
        for fallback in models[primary].fallbacks:
            if fallback not in seen and fallback in models and (scope is None or fallback in scope):
                seen.add(fallback)
                tried.append(fallback)
    return [models[m] for m in tried]


def visible_names(models: Mapping[str, ModelDef], groups: Mapping[str, tuple[str, ...]],
                  scope: frozenset[str] | None) -> list[str]:
    """The names `GET /v1/models` lists to a key of `scope`: its models and the aliases it may use, sorted."""
    if scope is None:
        return sorted([*models, *groups])
    names = [m for m in models if m in scope]
    names += [alias for alias, group in groups.items() if alias in scope or any(m in scope for m in group)]
    return sorted(names)


class Names:
    """The alias table of the catalog last seen: built again only when the table's models change (a new
    mapping), so a request pays one identity check."""

    __slots__ = ("_models", "_groups")

    def __init__(self) -> None:
        self._models: Mapping[str, ModelDef] | None = None
        self._groups: dict[str, tuple[str, ...]] = {}

    def groups(self, models: Mapping[str, ModelDef]) -> dict[str, tuple[str, ...]]:
        if models is not self._models:
            self._models, self._groups = models, alias_groups(models)
        return self._groups
