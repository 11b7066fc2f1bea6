"""Catalog files (TOML): a list of `[[models]]` definitions, checked like the admin API checks them."""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path

from llmgw.domain.model import DefinitionError, ModelDef, catalog_problems


class CatalogError(ValueError):
    pass


def default_catalog_text() -> str:
    return resources.files("llmgw").joinpath("data/catalog.toml").read_text(encoding="utf-8")


def parse(text: str, origin: str) -> list[ModelDef]:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise CatalogError(f"{origin}: not valid TOML: {e}") from None
    entries = doc.get("models", [])
    if not isinstance(entries, list):
        raise CatalogError(f"{origin}: 'models' must be an array of tables ([[models]])")
    models: list[ModelDef] = []
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        try:
            model = ModelDef.from_doc(entry)
        except DefinitionError as e:
            raise CatalogError(f"{origin}: models[{i}]: {e}") from None
        if model.name in seen:
            raise CatalogError(f"{origin}: models[{i}]: the name {model.name!r} is used twice")
        seen.add(model.name)
        models.append(model)
    return _fallbacks_first(models, origin)


def _fallbacks_first(models: list[ModelDef], origin: str) -> list[ModelDef]:
    """The catalog's models checked as a whole (fallbacks, aliases: `catalog_problems`), in an order in which
    each is defined after its fallbacks and a LoRA adapter after its base (as the store takes them, one at a
    time), else in the file's order."""
    every = {m.name: m for m in models}
    for i, model in enumerate(models):
        if problems := catalog_problems(model, every):
            raise CatalogError(f"{origin}: models[{i}]: " + "; ".join(f"{f}: {m}" for f, m in problems))
    ordered: list[ModelDef] = []
    placed: set[str] = set()
    rest = list(models)
    while rest:
        ready = [m for m in rest if placed.issuperset(m.fallbacks) and (not m.base or m.base in placed)]
        if not ready:
            names = ", ".join(m.name for m in rest)
            raise CatalogError(f"{origin}: the fallbacks of {names} name each other: a model must be defined "
                               f"before a model falls back on it (add the loop's last fallback later, by the admin API)")
        ordered += ready
        placed.update(m.name for m in ready)
        rest = [m for m in rest if m.name not in placed]
    return ordered


def load(path: Path | None) -> list[ModelDef]:
    """Models from `path`, or the built-in example catalog when None."""
    if path is None:
        return parse(default_catalog_text(), "built-in catalog")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise CatalogError(f"{path}: cannot read: {e.strerror}") from None
    return parse(text, str(path))
