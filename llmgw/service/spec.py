"""What one of this machine's services runs: a role (`control`, `gateway`, `agent`), its flags and its
environment, kept as `DIR/ROLE.json` (0600: the environment may hold a join token) in the services' dir.
Both managers read it: systemd's unit runs `llmgw service exec ROLE`, which execs it; the built-in
supervisor starts it itself. `install` writes it, with every problem named before anything is written.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmgw.engines.base import self_command
from llmgw.trust.files import write_private

SERVICE_ROLES = ("control", "gateway", "agent")
# The order a whole machine starts in (its control plane before what dials it) and stops in (reversed).
START_ORDER = SERVICE_ROLES
DEFAULT_DIR = Path("/var/lib/llmgw/services")
DIR_ENV = "LLMGW_SERVICE_DIR"
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")


class SpecError(ValueError):
    """A service that cannot be installed or run as given; the message says what and what to do."""


def services_dir(given: Path | None = None) -> Path:
    """The services' dir: `given`, else $LLMGW_SERVICE_DIR, else /var/lib/llmgw/services."""
    if given is not None:
        return given
    env = os.environ.get(DIR_ENV)
    return Path(env) if env else DEFAULT_DIR


def check_role(role: str) -> str:
    if role not in SERVICE_ROLES:
        raise SpecError(f"no such role {role!r}: a service is one of {', '.join(SERVICE_ROLES)}")
    return role


@dataclass(frozen=True)
class ServiceSpec:
    role: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_role(self.role)
        problems = [f"argument {a!r} is not text" for a in self.args if not isinstance(a, str)]
        problems += [f"environment name {k!r} is not NAME (A-Z, 0-9, _)" for k in self.env if not _ENV_NAME.match(k)]
        problems += [f"environment {k} is not text" for k, v in self.env.items() if not isinstance(v, str)]
        if self.args and self.args[0] in SERVICE_ROLES:
            problems.append(f"the flags start with the role {self.args[0]!r}: give only its flags")
        if problems:
            raise SpecError(f"service {self.role}: " + "; ".join(problems))

    def command(self) -> list[str]:
        """The command line that runs the role: this very program (its zipapp, or the package)."""
        return [*self_command(), self.role, *self.args]

    def to_doc(self) -> dict[str, Any]:
        return {"role": self.role, "args": list(self.args), "env": dict(self.env)}

    @classmethod
    def from_doc(cls, doc: Any) -> ServiceSpec:
        if not isinstance(doc, dict) or not isinstance(doc.get("args", []), list) \
                or not isinstance(doc.get("env", {}), dict):
            raise SpecError("not a service file (an object with role, args, env)")
        return cls(str(doc.get("role")), tuple(doc.get("args", [])), dict(doc.get("env", {})))


def spec_path(dir: Path, role: str) -> Path:
    return dir / f"{check_role(role)}.json"


def install(dir: Path, spec: ServiceSpec) -> Path:
    """Write `spec` as DIR/ROLE.json (the dir 0700, the file 0600, replaced whole). Returns its path."""
    path = spec_path(dir, spec.role)
    write_private(path, json.dumps(spec.to_doc(), indent=2))
    os.chmod(dir, 0o700)
    return path


def load(dir: Path, role: str) -> ServiceSpec | None:
    """The installed spec of `role`; None when it is not installed. SpecError for a damaged file."""
    path = spec_path(dir, role)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        spec = ServiceSpec.from_doc(json.loads(text))
    except (json.JSONDecodeError, SpecError) as e:
        raise SpecError(f"{path}: {e}; install the service again (`llmgw service install {role} -- FLAGS`)") from None
    if spec.role != role:
        raise SpecError(f"{path} is the service of {spec.role}, not {role}; install it again")
    return spec


def installed(dir: Path) -> list[str]:
    """The roles installed in `dir`, in start order."""
    return [r for r in START_ORDER if spec_path(dir, r).exists()]


def roles_asked(dir: Path, role: str | None, verb: str) -> Sequence[str]:
    """The roles a command acts on: `role`, or every installed one (SpecError when there is none)."""
    if role is not None:
        return [check_role(role)]
    roles = installed(dir)
    if not roles:
        raise SpecError(f"no service is installed in {dir} to {verb}: `llmgw service install ROLE -- FLAGS` "
                        f"(or `llmgw init`) installs one; --dir or {DIR_ENV} names another dir")
    return roles
