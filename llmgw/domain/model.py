"""Model definitions (S1): what an operator asks to be served, and its validation.

Definitions arrive as TOML or JSON documents; `ModelDef.from_doc` is the one
gate, so the admin API, the catalog loader and Raft replay agree on what is valid.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

ENGINES = ("sim", "llama.cpp", "vllm")
ROLES = ("chat", "embedding", "guard")
MODES = ("always", "on-demand")
MAX_REPLICAS = 256

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")  # used with fullmatch
_SOURCE_SCHEMES = ("sim://", "mirror://", "hf://", "pkg://")


class DefinitionError(ValueError):
    """A model definition that cannot be served; `field` names the offending key."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class Profile:
    gpus: int = 1
    tp: int = 1
    pp: int = 1
    nodes: int = 1
    classes: tuple[str, ...] = ()
    memory_gib: float = 0.0
    cpu: bool = False

    def to_doc(self) -> dict[str, Any]:
        return {
            "gpus": self.gpus,
            "tp": self.tp,
            "pp": self.pp,
            "nodes": self.nodes,
            "classes": list(self.classes),
            "memory_gib": self.memory_gib,
            "cpu": self.cpu,
        }


@dataclass(frozen=True)
class ModelDef:
    name: str
    engine: str
    role: str
    source: str
    mode: str = "always"
    replicas_min: int = 1
    replicas_max: int = 1
    idle_timeout_s: float = 900.0
    activation_window_s: float = 120.0
    args: tuple[str, ...] = ()
    profile: Profile = field(default_factory=Profile)

    def to_doc(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "engine": self.engine,
            "role": self.role,
            "source": self.source,
            "mode": self.mode,
            "replicas": {"min": self.replicas_min, "max": self.replicas_max},
            "idle_timeout_s": self.idle_timeout_s,
            "activation_window_s": self.activation_window_s,
            "args": list(self.args),
            "profile": self.profile.to_doc(),
        }

    def launch_hash(self) -> str:
        """What a running replica was started from: a change here replaces replicas
        and un-parks the model (a new source or profile deserves a fresh try)."""
        doc = self.to_doc()
        launch = {k: doc[k] for k in ("engine", "role", "source", "args", "profile")}
        blob = json.dumps(launch, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    @classmethod
    def from_doc(cls, doc: Any) -> ModelDef:
        if not isinstance(doc, Mapping):
            raise DefinitionError("model", "must be an object")
        known = {
            "name", "engine", "role", "source", "mode", "replicas",
            "idle_timeout_s", "activation_window_s", "args", "profile",
        }
        for key in doc:
            if key not in known:
                raise DefinitionError(str(key), "unknown key")
        name = _str(doc, "name", required=True)
        if not _NAME_RE.fullmatch(name):
            raise DefinitionError(
                "name", "use 1-128 letters, digits, '.', '_', ':' or '-', starting with a letter or digit"
            )
        engine = _choice(doc, "engine", ENGINES, required=True)
        role = _choice(doc, "role", ROLES, default="chat")
        source = _str(doc, "source", required=True)
        check_source(source, engine)
        mode = _choice(doc, "mode", MODES, default="always")
        replicas = doc.get("replicas", {})
        if not isinstance(replicas, Mapping):
            raise DefinitionError("replicas", "must be an object like {min = 1, max = 1}")
        for key in replicas:
            if key not in ("min", "max"):
                raise DefinitionError(f"replicas.{key}", "unknown key")
        default_min = 1 if mode == "always" else 0
        rmin = _int(replicas, "min", default_min, prefix="replicas.")
        rmax = _int(replicas, "max", max(rmin, 1), prefix="replicas.")
        if not 0 <= rmin <= MAX_REPLICAS:
            raise DefinitionError("replicas.min", f"must be between 0 and {MAX_REPLICAS}")
        if not 1 <= rmax <= MAX_REPLICAS:
            raise DefinitionError("replicas.max", f"must be between 1 and {MAX_REPLICAS}")
        if rmin > rmax:
            raise DefinitionError("replicas.min", "must not exceed replicas.max")
        idle = _num(doc, "idle_timeout_s", 900.0)
        window = _num(doc, "activation_window_s", 120.0)
        if idle <= 0:
            raise DefinitionError("idle_timeout_s", "must be positive")
        if window <= 0:
            raise DefinitionError("activation_window_s", "must be positive")
        args = doc.get("args", [])
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise DefinitionError("args", "must be a list of strings (never a shell string)")
        if any("\x00" in a for a in args):
            raise DefinitionError("args", "must not contain NUL bytes")
        profile = _profile(doc.get("profile", {}))
        if engine == "sim" and not profile.cpu:
            # The simulator needs no GPU; saying so keeps placement honest.
            profile = replace(profile, cpu=True)
        return cls(
            name=name,
            engine=engine,
            role=role,
            source=source,
            mode=mode,
            replicas_min=rmin,
            replicas_max=rmax,
            idle_timeout_s=idle,
            activation_window_s=window,
            args=tuple(args),
            profile=profile,
        )


def is_mig_class(gpu_class: str) -> bool:
    """'a100-80g-mig-3g.40gb' names a MIG instance profile, not a whole card."""
    return "-mig-" in gpu_class


def check_source(source: str, engine: str) -> None:
    """Refuse sources that could escape storage roots or that the engine cannot read."""
    if any(ord(c) < 32 or ord(c) == 127 for c in source):
        raise DefinitionError("source", "must not contain control characters")
    if len(source) > 1024:
        raise DefinitionError("source", "is longer than 1024 characters")
    if engine == "sim":
        if not source.startswith("sim://") or len(source) == len("sim://"):
            raise DefinitionError("source", "the sim engine takes sources like sim://NAME")
        return
    if source.startswith("sim://"):
        raise DefinitionError("source", f"sim:// sources need engine 'sim', not {engine!r}")
    if source.startswith(_SOURCE_SCHEMES):
        rest = source.split("://", 1)[1]
    elif source.startswith("/"):
        rest = source
    else:
        raise DefinitionError(
            "source", "must be an absolute path, mirror://NAME, hf://ORG/REPO or pkg://PACKAGE/FILE"
        )
    if ".." in rest.replace("%2e", ".").replace("%2E", ".").split("/"):
        raise DefinitionError("source", "must not contain '..' segments")
    if not rest.strip("/"):
        raise DefinitionError("source", "names nothing")


def _profile(doc: Any) -> Profile:
    if not isinstance(doc, Mapping):
        raise DefinitionError("profile", "must be an object")
    known = {"gpus", "tp", "pp", "nodes", "classes", "memory_gib", "cpu"}
    for key in doc:
        if key not in known:
            raise DefinitionError(f"profile.{key}", "unknown key")
    p = "profile."
    gpus = _int(doc, "gpus", 1, prefix=p)
    tp = _int(doc, "tp", 1, prefix=p)
    pp = _int(doc, "pp", 1, prefix=p)
    nodes = _int(doc, "nodes", 1, prefix=p)
    for key, value in (("gpus", gpus), ("tp", tp), ("pp", pp), ("nodes", nodes)):
        if not 1 <= value <= 64:
            raise DefinitionError(p + key, "must be between 1 and 64")
    if tp * pp != gpus * nodes:
        raise DefinitionError(p + "tp", f"tp * pp ({tp * pp}) must equal gpus * nodes ({gpus * nodes})")
    classes = doc.get("classes", [])
    if not isinstance(classes, list) or not all(isinstance(c, str) and c for c in classes):
        raise DefinitionError(p + "classes", "must be a list of GPU class names")
    if any(is_mig_class(c) for c in classes):
        # A process opens one MIG device, and instances share no NVLink (S6).
        for key, value in (("gpus", gpus), ("tp", tp), ("pp", pp), ("nodes", nodes)):
            if value > 1:
                raise DefinitionError(p + key, "must be 1 on a MIG class: a replica runs on exactly one MIG instance")
    mem = _num(doc, "memory_gib", 0.0, prefix=p)
    if mem < 0:
        raise DefinitionError(p + "memory_gib", "must not be negative")
    cpu = doc.get("cpu", False)
    if not isinstance(cpu, bool):
        raise DefinitionError(p + "cpu", "must be true or false")
    return Profile(gpus=gpus, tp=tp, pp=pp, nodes=nodes, classes=tuple(classes), memory_gib=mem, cpu=cpu)


def _str(doc: Mapping[str, Any], key: str, *, required: bool = False, default: str = "") -> str:
    if key not in doc:
        if required:
            raise DefinitionError(key, "is required")
        return default
    value = doc[key]
    if not isinstance(value, str) or not value:
        raise DefinitionError(key, "must be a non-empty string")
    return value


def _choice(
    doc: Mapping[str, Any], key: str, choices: tuple[str, ...], *, required: bool = False, default: str = ""
) -> str:
    value = _str(doc, key, required=required, default=default)
    if value not in choices:
        raise DefinitionError(key, f"must be one of {', '.join(choices)}")
    return value


def _int(doc: Mapping[str, Any], key: str, default: int, *, prefix: str = "") -> int:
    value = doc.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise DefinitionError(prefix + key, "must be an integer")
    return value


def _num(doc: Mapping[str, Any], key: str, default: float, *, prefix: str = "") -> float:
    value = doc.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DefinitionError(prefix + key, "must be a number")
    try:
        number = float(value)
    except OverflowError:
        raise DefinitionError(prefix + key, "is too large") from None
    if not math.isfinite(number):
        raise DefinitionError(prefix + key, "must be a finite number")
    return number
