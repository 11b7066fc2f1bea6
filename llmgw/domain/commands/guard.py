"""The guard commands: `guard.set` (put a policy, idempotent) and `guard.remove` (by name); their
builders, stateless checks and changes. A policy's shape and validation are `domain.guard`'s.

A removal of a name no longer held is no change (`removed` false), so a retry is harmless; the admin
API answers it 404.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from llmgw.domain.commands.core import make, parsed, readonly, required
from llmgw.domain.guard import GuardPolicy, PolicyError
from llmgw.domain.state import ClusterState


def set_policy(policy: GuardPolicy, at: float) -> dict[str, Any]:
    return make("guard.set", at, policy=policy.to_doc())


def remove_policy(name: str, at: float) -> dict[str, Any]:
    return make("guard.remove", at, name=name)


def check_set(c: dict[str, Any]) -> GuardPolicy:
    """The command's policy, read: a policy that does not read is refused (`invalid_policy`)."""
    return parsed(c, "policy", GuardPolicy.from_doc, PolicyError, "invalid_policy")


def check_remove(c: dict[str, Any]) -> None:
    required(c, "name", "invalid_policy")


def apply_set(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    """Stores the policy under its name; the same policy again changes nothing but the revision."""
    policy = check_set(c)
    old = s.guard_policies.get(policy.name)
    policies = readonly(s.guard_policies | {policy.name: policy})
    return replace(s, guard_policies=policies), {"created": old is None, "changed": old != policy}


def apply_remove(s: ClusterState, c: dict[str, Any], at: float) -> tuple[ClusterState, Any]:
    name = c["name"]
    if name not in s.guard_policies:
        return s, {"removed": False, "name": name}
    policies = readonly({k: v for k, v in s.guard_policies.items() if k != name})
    return replace(s, guard_policies=policies), {"removed": True, "name": name}
