"""Guardrails' pure core: Llama Guard 3's hazard categories, `GuardPolicy` (what a judge checks, for which
models, what refuses, what a judge failure does, the time budget) and which policies apply to a model.

Policies arrive as JSON or TOML documents; `GuardPolicy.from_doc` is the one gate (the admin API,
`ctl guard set --file` and Raft replay agree on what is valid), reporting every problem at once.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llmgw.domain.model import DefinitionError

if TYPE_CHECKING:
    from llmgw.domain.state import ClusterState

# Llama Guard 3's hazard taxonomy (MLCommons), as its model card names each code.
CATEGORIES: dict[str, str] = {
    "S1": "Violent Crimes",
    "S2": "Non-Violent Crimes",
    "S3": "Sex-Related Crimes",
    "S4": "Child Sexual Exploitation",
    "S5": "Defamation",
    "S6": "Specialized Advice",
    "S7": "Privacy",
    "S8": "Intellectual Property",
    "S9": "Indiscriminate Weapons",
    "S10": "Hate",
    "S11": "Suicide & Self-Harm",
    "S12": "Sexual Content",
    "S13": "Elections",
    "S14": "Code Interpreter Abuse",
}
CHECKS = ("prompt", "response", "both")
ON_ERROR = ("open", "closed")
EVERY_MODEL = "*"
DEFAULT_CHECK = "prompt"  # the question is what a team must stop; "both" doubles the judge calls
DEFAULT_ON_ERROR = "closed"  # a judge that cannot answer lets nothing through unless the policy says so
DEFAULT_BUDGET = 2.0
LONGEST_BUDGET = 120.0  # a bound on input: past it a typo (ms for s) is likelier than intent
MAX_MODELS = 1000
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")  # a model's names too (domain/model.py)
_KEYS = ("name", "judge", "check", "models", "categories", "on_error", "budget_s")


class PolicyError(DefinitionError):
    """A policy that cannot be kept. `errors` holds every (field, message) found in one pass;
    `field` and `message` are the first of them (the same shape as a model definition's errors)."""


@dataclass(frozen=True)
class GuardPolicy:
    """One policy. `models` ("*",) = every model that is not itself a judge; `categories` () = all 14
    refuse. Both are kept sorted and without repeats, so a policy has one document."""

    name: str
    judge: str  # a model name; that model has role "guard"
    check: str = DEFAULT_CHECK  # one of CHECKS
    models: tuple[str, ...] = (EVERY_MODEL,)
    categories: tuple[str, ...] = ()
    on_error: str = DEFAULT_ON_ERROR  # one of ON_ERROR
    budget_s: float = DEFAULT_BUDGET

    @property
    def checks_prompt(self) -> bool:
        return self.check in ("prompt", "both")

    @property
    def checks_response(self) -> bool:
        return self.check in ("response", "both")

    def refuses(self, code: str) -> bool:
        """Whether a hazard the judge named refuses under this policy."""
        return not self.categories or code in self.categories

    def to_doc(self) -> dict[str, Any]:
        return {"name": self.name, "judge": self.judge, "check": self.check, "models": list(self.models),
                "categories": list(self.categories), "on_error": self.on_error, "budget_s": self.budget_s}

    @classmethod
    def from_doc(cls, doc: Any, *, name: str | None = None) -> GuardPolicy:
        """The policy in `doc`, or one PolicyError naming every problem. `name`: the name the
        document is stored under (an API path); the document may then leave `name` out."""
        if not isinstance(doc, Mapping):
            raise PolicyError("policy", "must be an object")
        found: list[tuple[str, str]] = [(str(k), f"unknown key; known: {', '.join(_KEYS)}")
                                        for k in doc if k not in _KEYS]
        values: dict[str, Any] = {}
        for key, read in _READERS.items():
            try:
                values[key] = read(doc)
            except PolicyError as e:
                found.extend(e.errors)
        if name is not None and "name" not in doc:
            found = [f for f in found if f[0] != "name"]
            try:
                values["name"] = _model_name({"name": name}, "name")
            except PolicyError as e:
                found.extend(e.errors)
        elif name is not None and values.get("name") not in (None, name):
            found.append(("name", f"is {values['name']!r} but the policy is stored as {name!r}"))
        judge, models = values.get("judge"), values.get("models")
        if judge is not None and models is not None and judge in models:
            found.append(("models", f"must not name the judge {judge!r}: a judge's own requests are never checked"))
        if found:
            raise PolicyError(*found[0], *found[1:])
        return cls(**values)


def enabled(state: ClusterState) -> bool:
    """`guard.enabled`: unset means on; while false every check is a no-op."""
    value = state.settings.get("guard.enabled", True)
    return value is not False


def judges_asked(state: ClusterState) -> dict[str, tuple[str, ...]]:
    """Each judge model the policies name -> the policies naming it (sorted)."""
    asked: dict[str, list[str]] = {}
    for name, policy in sorted(state.guard_policies.items()):
        asked.setdefault(policy.judge, []).append(name)
    return {judge: tuple(names) for judge, names in sorted(asked.items())}


def is_judge(state: ClusterState, model: str) -> bool:
    """A judge: defined with role guard, or named as a judge by a policy. Its requests are never checked
    (a judge checked by itself would call itself forever)."""
    m = state.models.get(model)
    if m is not None and m.role == "guard":
        return True
    return any(p.judge == model for p in state.guard_policies.values())


def policies_for(state: ClusterState, model: str) -> tuple[GuardPolicy, ...]:
    """The policies that apply to requests for `model`, by name; () for a judge. Does not read
    `guard.enabled` (see `enabled`): the gateway caches this per (state, model)."""
    if not state.guard_policies or is_judge(state, model):
        return ()
    return tuple(p for _, p in sorted(state.guard_policies.items())
                 if EVERY_MODEL in p.models or model in p.models)


def verdict_text(codes: tuple[str, ...]) -> str:
    """`judge: S6,Specialized Advice` (several: `judge: S1,Violent Crimes; S6,Specialized Advice`)."""
    return "judge: " + "; ".join(f"{c},{CATEGORIES.get(c, 'Unknown category')}" for c in codes)


def category_order(code: str) -> int:
    return int(code[1:])


# --- one field each: raise PolicyError naming it ---------------------------------------------


def _model_name(doc: Mapping[str, Any], key: str) -> str:
    if key not in doc:
        raise PolicyError(key, "is required")
    value = doc[key]
    if not isinstance(value, str) or not _NAME_RE.fullmatch(value):
        raise PolicyError(key, "use 1-128 letters, digits, '.', '_', ':' or '-', starting with a letter or digit")
    return value


def _check(doc: Mapping[str, Any]) -> str:
    value = doc.get("check", DEFAULT_CHECK)
    if isinstance(value, list):  # TOML's `check = ["prompt", "response"]` reads as "both"
        if value and all(v in ("prompt", "response") for v in value):
            return "both" if set(value) == {"prompt", "response"} else str(value[0])
    elif isinstance(value, str) and value in CHECKS:
        return value
    raise PolicyError("check", "must be prompt, response or both")


def _models(doc: Mapping[str, Any]) -> tuple[str, ...]:
    value = doc.get("models", [EVERY_MODEL])
    if not isinstance(value, list) or not value:
        raise PolicyError("models", 'must be a non-empty list of model names, or ["*"] for every model')
    if len(value) > MAX_MODELS:
        raise PolicyError("models", f"names at most {MAX_MODELS} models")
    if EVERY_MODEL in value:
        if len(value) > 1:
            raise PolicyError("models", '"*" (every model) stands alone')
        return (EVERY_MODEL,)
    for item in value:
        if not isinstance(item, str) or not _NAME_RE.fullmatch(item):
            raise PolicyError("models", f"{item!r:.60} is not a model name")
    return tuple(sorted(set(value)))


def _categories(doc: Mapping[str, Any]) -> tuple[str, ...]:
    value = doc.get("categories", [])
    if not isinstance(value, list):
        raise PolicyError("categories", "must be a list of hazard codes S1..S14 (empty: every one refuses)")
    unknown = [c for c in value if not isinstance(c, str) or c not in CATEGORIES]
    if unknown:
        raise PolicyError("categories", f"{unknown[0]!r:.20} is not a hazard code: use S1..S14 "
                                        "(docs/guardrails.md lists them)")
    return tuple(sorted(set(value), key=category_order))


def _on_error(doc: Mapping[str, Any]) -> str:
    value = doc.get("on_error", DEFAULT_ON_ERROR)
    if value not in ON_ERROR:
        raise PolicyError("on_error", "must be open (a judge failure lets the request through, recorded) "
                                      "or closed (it refuses the request)")
    return str(value)


def _budget(doc: Mapping[str, Any]) -> float:
    value = doc.get("budget_s", DEFAULT_BUDGET)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PolicyError("budget_s", "must be a number of seconds")
    try:
        seconds = float(value)
    except OverflowError:
        raise PolicyError("budget_s", "is too large") from None
    if not math.isfinite(seconds) or not 0 < seconds <= LONGEST_BUDGET:
        raise PolicyError("budget_s", f"must be above 0 and at most {LONGEST_BUDGET:g} seconds")
    return seconds


_READERS = {
    "name": lambda doc: _model_name(doc, "name"),
    "judge": lambda doc: _model_name(doc, "judge"),
    "check": _check,
    "models": _models,
    "categories": _categories,
    "on_error": _on_error,
    "budget_s": _budget,
}
