"""The guard commands: `guard.set` (put a policy, idempotent) and `guard.remove` (by name); their
builders, stateless checks and changes, pure like `commands` (which raises what the checks return).

A removal of a name no longer held is no change (`removed` false), so a retry is harmless; the admin
API answers it 404.
"""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType
from typing import Any

from llmgw.domain.guard import GuardPolicy, PolicyError
from llmgw.domain.state import ClusterState

Problem = tuple[str, str] | None


def set_policy(policy: GuardPolicy, at: float) -> dict[str, Any]:
    # "v": 1 is `commands.VERSION` (not imported: `commands` imports this module).
    return {"v": 1, "op": "guard.set", "at": at, "policy": policy.to_doc()}


def remove_policy(name: str, at: float) -> dict[str, Any]:
    return {"v": 1, "op": "guard.remove", "at": at, "name": name}


def parse(c: dict[str, Any]) -> GuardPolicy:
    return GuardPolicy.from_doc(c.get("policy"))


def check_set(c: dict[str, Any]) -> Problem:
    try:
        parse(c)
    except PolicyError as e:
        return "invalid_policy", str(e)
    return None


def check_remove(c: dict[str, Any]) -> Problem:
    name = c.get("name")
    if not isinstance(name, str) or not name:
        return "invalid_policy", "name must be a non-empty string"
    return None


def put(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    """Stores the policy under its name; the same policy again changes nothing but the revision."""
    policy = parse(c)
    old = s.guard_policies.get(policy.name)
    policies = MappingProxyType(s.guard_policies | {policy.name: policy})
    return replace(s, guard_policies=policies), {"created": old is None, "changed": old != policy}


def remove(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    name = c["name"]
    if name not in s.guard_policies:
        return s, {"removed": False, "name": name}
    policies = MappingProxyType({k: v for k, v in s.guard_policies.items() if k != name})
    return replace(s, guard_policies=policies), {"removed": True, "name": name}
