"""Model definitions (S1): what an operator asks to be served, and its validation.

Definitions arrive as TOML or JSON documents; `ModelDef.from_doc` is the one
gate, so the admin API, the catalog loader and Raft replay agree on what is valid.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ParamSpec, TypeVar

from llmgw.domain.frozen import Doc
from llmgw.domain.schedule import LONGEST_RULE, CronError, Cron, Rule

ENGINES = ("sim", "llama.cpp", "vllm")
ROLES = ("chat", "embedding", "guard", "rerank")
MODES = ("always", "on-demand")
MAX_REPLICAS = 256
MAX_FALLBACKS = 8  # models tried after this one, in order (each costs the client a refusal's time at most)
MAX_ALIASES = 16  # public names beyond its own
MAX_SCHEDULES = 16  # schedule rules of one model
# Engines that serve LoRA adapters (every one): vLLM and the sim load them at run time (agent/adapters.py);
# llama.cpp at launch (`lora`), its replicas replaced by ones started with a new adapter (reconcile/adapters.py).
ADAPTER_ENGINES = ENGINES
# Engines whose replicas can sleep (`sleep_level`): vLLM's sleep mode (`POST /sleep?level=N`, `POST /wake_up`) and
# the simulator, which models it (docs/models.md, "Fast wake").
SLEEP_ENGINES = ("vllm", "sim")
SLEEP_LEVELS = (0, 1, 2)

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")  # used with fullmatch
_SOURCE_SCHEMES = ("sim://", "mirror://", "hf://", "pkg://")


class DefinitionError(ValueError):
    """A model definition that cannot be served. `errors` holds every (field, message)
    found in one pass, in the order checked; `field` and `message` are the first of them."""

    def __init__(self, field: str, message: str, *more: tuple[str, str]) -> None:
        self.errors: tuple[tuple[str, str], ...] = ((field, message), *more)
        super().__init__("; ".join(f"{f}: {m}" for f, m in self.errors))
        self.field = field
        self.message = message


@dataclass(frozen=True)
class Profile(Doc):
    gpus: int = 1
    tp: int = 1
    pp: int = 1
    nodes: int = 1
    classes: tuple[str, ...] = ()
    memory_gib: float = 0.0
    cpu: bool = False


@dataclass(frozen=True)
class Limits(Doc):
    """What one request may ask of the model, checked by the gateway; None = no limit. And how many requests
    each gateway sends one replica at once (None: `gateway.upstream_connections_per_replica`): set to the
    engine's parallel slots, the gateway queues the rest by priority class and key (gateway/fairqueue.py)."""

    max_tokens: int | None = None  # caps max_tokens and max_completion_tokens
    max_n: int | None = None  # caps n (choices per request)
    concurrency_per_replica: int | None = None  # a later field: left out of its document while None

    def to_doc(self) -> dict[str, Any]:
        doc = super().to_doc()
        if self.concurrency_per_replica is None:  # an older llmgw refuses a key it does not know
            del doc["concurrency_per_replica"]
        return doc

LONGEST_WAIT = 86400.0  # seconds, the most a definition may set (a bound on input, not a wait): a day is longer
# than any generation; past it a typo (ms for s) is likelier than intent


@dataclass(frozen=True)
class ModelTimeouts(Doc):
    """How long the gateway waits on this model's engines; None = the gateway's own timeout
    (`upstream_connect_s`, `upstream_first_byte_s`, `upstream_chunk_s` in llmgw/domain/timeouts.py)."""

    connect_s: float | None = None  # opening a connection to a replica (502 upstream_unavailable past it)
    first_byte_s: float | None = None  # the answer's head after the request went out (504 upstream_timeout)
    chunk_s: float | None = None  # silence between two pieces of an answer (504, or an error event mid-stream)

NO_OVERRIDES = ModelTimeouts()  # every wait the gateway's default

AFFINITIES = ("prefix", "off")
PREFIX_CHARS = 4096  # the default bound of a request's leading text the affinity key hashes
MAX_PREFIX_CHARS = 1 << 20


@dataclass(frozen=True)
class Routing(Doc):
    """How the gateway picks among the model's replicas (llmgw/gateway/affinity.py). `affinity` "prefix":
    requests whose leading text (the system prompt and the first turn, at most `prefix_chars` characters)
    is the same go to the same replica, from every gateway, so its engine reuses the prompt's cache; "off":
    the least loaded replica; None: "prefix" for chat and guard models, "off" for embedding models."""

    affinity: str | None = None
    prefix_chars: int = PREFIX_CHARS

DEFAULT_ROUTING = Routing()


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
    limits: Limits = field(default_factory=Limits)
    timeouts: ModelTimeouts = NO_OVERRIDES
    # Models that serve this one's requests, in order, when it refuses them at once (parked, unplaceable,
    # overloaded); one level: a fallback's own fallbacks are not followed (docs/api.md, fallbacks and aliases).
    fallbacks: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()  # more public names of this model; one on several models is a group
    routing: Routing = DEFAULT_ROUTING  # how gateways pick its replica: prefix affinity (gateway/affinity.py)
    # A LoRA adapter of the model named here (docs/api.md, "LoRA adapters"): `source` is the adapter's file,
    # engine and role are the base's; it has no replicas of its own and is served by the base's replicas whose
    # engine lists it loaded. "": a model of its own.
    base: str = ""
    # The LoRA adapter files a llama.cpp replica of this model loads at launch, in order (llama.cpp's adapter id
    # is the index): set by the reconciler from the adapters defined on the model (reconcile/adapters.py), in the
    # definition sent to agents only, never in a stored one (the admin API refuses the key).
    lora: tuple[str, ...] = ()
    # Schedule rules (domain/schedule.py): from a cron time, for a while, replicas.min/max are the rule's. Read
    # by the reconciler's `demand.desired`; in the cluster's time zone (setting `cluster.time_zone`).
    schedules: tuple[Rule, ...] = ()
    # Fast wake (docs/models.md): 1 or 2, an idle on-demand replica is put to sleep at that vLLM sleep level
    # (1: weights kept in CPU RAM, 2: discarded) instead of being stopped, and woken by the next request;
    # 0: stopped as before.
    sleep_level: int = 0

    @property
    def is_adapter(self) -> bool:
        return bool(self.base)

    def affinity_chars(self) -> int:
        """How many leading characters of a request the gateway's affinity key hashes; 0: affinity off."""
        routing = self.routing
        affinity = routing.affinity or ("off" if self.role in ("embedding", "rerank") else "prefix")
        return routing.prefix_chars if affinity == "prefix" else 0

    def to_doc(self) -> dict[str, Any]:
        # `routing` only when set: a gateway or member of a release before it reads the rest unchanged.
        extra = {} if self.routing == DEFAULT_ROUTING else {"routing": self.routing.to_doc()}
        doc = {
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
            "limits": self.limits.to_doc(),
            "timeouts": self.timeouts.to_doc(),
        }
        # Written only when set: a definition without them reads on a member that predates them.
        doc.update(extra)
        if self.fallbacks:
            doc["fallbacks"] = list(self.fallbacks)
        if self.aliases:
            doc["aliases"] = list(self.aliases)
        if self.base:
            doc["base"] = self.base
        if self.lora:
            doc["lora"] = list(self.lora)
        if self.schedules:
            doc["schedules"] = [r.to_doc() for r in self.schedules]
        if self.sleep_level:
            doc["sleep_level"] = self.sleep_level
        return doc

    def __getstate__(self) -> dict[str, Any]:
        # A copy or a pickle holds the fields only: `launch_hash`'s memo is not part of the value.
        return {k: v for k, v in self.__dict__.items() if k != "_launch_hash"}

    def launch_hash(self) -> str:
        """What a running replica was started from: a change here replaces replicas
        and un-parks the model (a new source or profile deserves a fresh try). Kept on the
        definition once worked out: every plan hashes every model it places, and a definition lives
        until it changes."""
        found: str | None = self.__dict__.get("_launch_hash")
        if found is not None:
            return found
        # The fields of `to_doc` it reads, written as `to_doc` writes them (a plan hashes every model it places).
        launch: dict[str, Any] = {"engine": self.engine, "role": self.role, "source": self.source,
                                  "args": list(self.args), "profile": self.profile.to_doc()}
        if self.lora:
            launch["lora"] = list(self.lora)
        if self.sleep_level:  # vLLM starts with sleep mode on (`--enable-sleep-mode`) or not: a new launch
            launch["sleep_mode"] = True
        blob = json.dumps(launch, sort_keys=True).encode()
        found = self.__dict__["_launch_hash"] = hashlib.sha256(blob).hexdigest()[:16]
        return found

    @classmethod
    def from_doc(cls, doc: Any) -> ModelDef:
        """The definition in `doc`, or one DefinitionError naming every problem in it.

        Each field is checked on its own; a check that depends on another field
        (source on engine, replicas.min's default on mode) runs only when that
        field is valid, so one mistake is reported once.
        """
        if not isinstance(doc, Mapping):
            raise DefinitionError("model", "must be an object")
        p = _Problems()
        for key in doc:
            if key not in _KEYS:
                p.add(str(key), "unknown key")
        name = p.check(_name, doc)
        engine = p.check(_choice, doc, "engine", ENGINES, required=True)
        role = p.check(_choice, doc, "role", ROLES, default="chat")
        base = p.check(_base, doc, name)
        source = p.check(_adapter_source, doc) if base else p.check(_source, doc, engine)
        mode = p.check(_choice, doc, "mode", MODES, default="always")
        replicas = _replicas(doc.get("replicas", {}), mode, p)
        idle = p.check(_positive_num, doc, "idle_timeout_s", 900.0)
        window = p.check(_positive_num, doc, "activation_window_s", 120.0)
        args = p.check(_args, doc.get("args", []))
        profile = _profile(doc.get("profile", {}), p)
        limits = _limits(doc.get("limits", {}), p)
        timeouts = _timeouts(doc.get("timeouts", {}), p)
        fallbacks = p.check(_names, doc, "fallbacks", MAX_FALLBACKS, name)
        aliases = p.check(_names, doc, "aliases", MAX_ALIASES, name)
        routing = _routing(doc.get("routing", {}), p)
        lora = p.check(_lora, doc)
        schedules = _schedules(doc.get("schedules", []), p)
        sleep_level = p.check(_sleep_level, doc, engine, mode)
        p.raise_if_any()
        # No problem was found, so every check returned its value.
        assert name and engine and role and source and mode and replicas and idle and window and profile and limits
        assert timeouts is not None and routing is not None
        assert args is not None and fallbacks is not None and aliases is not None and base is not None
        assert lora is not None and schedules is not None and sleep_level is not None
        if engine == "sim" and not profile.cpu and not _asks_for_gpus(doc.get("profile", {})):
            # A sim model whose profile says nothing of GPUs runs on CPU (it needs none); one that
            # names gpus/tp/pp/nodes/classes or says `cpu = false` takes GPUs like a real engine.
            profile = replace(profile, cpu=True)
        return cls(
            name=name,
            engine=engine,
            role=role,
            source=source,
            mode=mode,
            replicas_min=replicas[0],
            replicas_max=replicas[1],
            idle_timeout_s=idle,
            activation_window_s=window,
            args=args,
            profile=profile,
            limits=limits,
            timeouts=timeouts,
            fallbacks=fallbacks,
            aliases=aliases,
            routing=routing,
            base=base,
            lora=lora,
            schedules=schedules,
            sleep_level=sleep_level,
        )


_GPU_KEYS = ("gpus", "tp", "pp", "nodes", "classes", "cpu")


def _asks_for_gpus(profile: Mapping[str, Any]) -> bool:
    """A sim profile that is a GPU profile: it names a GPU key (or `cpu`, which is false here)."""
    return any(key in profile for key in _GPU_KEYS)


def is_mig_class(gpu_class: str) -> bool:
    """'a100-80g-mig-3g.40gb' names a MIG instance profile, not a whole card."""
    return "-mig-" in gpu_class


def check_source(source: str, engine: str) -> None:
    """Refuse sources that could escape storage roots or that the engine cannot read."""
    _check_source_text(source)
    if engine == "sim":
        # mirror://NAME too: the file is fetched to the node and checked there as for any engine (docs/mirror.md).
        if not source.startswith(("sim://", "mirror://")) or source.endswith("://"):
            raise DefinitionError("source", "the sim engine takes sources like sim://NAME (or mirror://NAME)")
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


def check_adapter_source(source: str) -> None:
    """A LoRA adapter's file: an absolute path on the base's nodes. Where `mirror://` adapters will be accepted
    once the mirror fetches them (an adapter is one small file, fetched like a checkpoint)."""
    _check_source_text(source)
    if source.startswith("mirror://"):
        raise DefinitionError("source", "an adapter from the mirror is not supported yet: give the adapter file's "
                                        "absolute path")
    if not source.startswith("/"):
        raise DefinitionError("source", "an adapter's source is the absolute path of its file (e.g. "
                                        "/models/lora/my-adapter.gguf)")
    if ".." in source.replace("%2e", ".").replace("%2E", ".").split("/"):
        raise DefinitionError("source", "must not contain '..' segments")
    if not source.strip("/"):
        raise DefinitionError("source", "names nothing")


def _check_source_text(source: str) -> None:
    """What is wrong with a source whatever the engine."""
    if any(ord(c) < 32 or ord(c) == 127 for c in source):
        raise DefinitionError("source", "must not contain control characters")
    if len(source) > 1024:
        raise DefinitionError("source", "is longer than 1024 characters")


# --- collecting every problem of one definition ----------------------------------------

_KEYS = frozenset({
    "name", "engine", "role", "source", "mode", "replicas",
    "idle_timeout_s", "activation_window_s", "args", "profile", "limits", "timeouts", "fallbacks", "aliases",
    "routing", "base", "lora", "schedules", "sleep_level",
})
_P = ParamSpec("_P")
_T = TypeVar("_T")


class _Problems:
    """The problems found so far in one definition. Each field's check raises
    DefinitionError for that field; `check` records it and carries on with None."""

    def __init__(self) -> None:
        self.found: list[tuple[str, str]] = []

    def add(self, field: str, message: str) -> None:
        self.found.append((field, message))

    def check(self, read: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T | None:
        try:
            return read(*args, **kwargs)
        except DefinitionError as e:
            self.found.extend(e.errors)
            return None

    def table(self, doc: Any, name: str, known: Sequence[str], like: str = "") -> bool:
        """Whether `doc`, the definition's `name`, is an object (else that problem, with an example
        `like` it); each key it has beyond `known` is a problem too, naming the known ones."""
        if not isinstance(doc, Mapping):
            self.add(name, f"must be an object like {like}" if like else "must be an object")
            return False
        for key in doc:
            if key not in known:
                self.add(f"{name}.{key}", f"unknown key; known: {', '.join(known)}")
        return True

    def raise_if_any(self) -> None:
        if self.found:
            (field, message), *more = self.found
            raise DefinitionError(field, message, *more)


def _name(doc: Mapping[str, Any]) -> str:
    name = _str(doc, "name", required=True)
    if not _NAME_RE.fullmatch(name):
        raise DefinitionError(
            "name", "use 1-128 letters, digits, '.', '_', ':' or '-', starting with a letter or digit"
        )
    return name


def _names(doc: Mapping[str, Any], key: str, most: int, own: str | None) -> tuple[str, ...]:
    """`fallbacks` or `aliases`: a list of distinct model names, not the definition's own `name`."""
    value = doc.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise DefinitionError(key, "must be a list of model names")
    if len(value) > most:
        raise DefinitionError(key, f"names at most {most} models")
    for item in value:
        if not _NAME_RE.fullmatch(item):
            raise DefinitionError(key, f"{item!r:.60} is not a model name")
        if item == own:
            raise DefinitionError(key, f"must not name the model itself ({own!r})")
    if len(set(value)) < len(value):
        raise DefinitionError(key, "names a model twice")
    return tuple(value)


def catalog_problems(model: ModelDef, models: Mapping[str, ModelDef]) -> list[tuple[str, str]]:
    """What is wrong with `model` beside the other definitions `models` (by name; the model's own older
    definition, if there, is passed over): each fallback must be a defined model of the same role; an
    alias must not be a model's name, and an alias shared with other models (a group) must join models
    of the same role; the model's name must not be another model's alias. Empty: nothing."""
    found: list[tuple[str, str]] = adapter_problems(model, models)
    for name in model.fallbacks:
        other = models.get(name)
        if other is None or name == model.name:
            found.append(("fallbacks", f"{name!r} is not a defined model"))
        elif other.role != model.role:
            found.append(("fallbacks", f"{name!r} has role {other.role}; a fallback must have this model's role"
                                       f" ({model.role})"))
    mine = set(model.aliases)
    for name, other in models.items():
        if name == model.name:
            continue
        if name in mine:
            found.append(("aliases", f"{name!r} is the name of a model"))
        if model.name in other.aliases:
            found.append(("name", f"{model.name!r} is an alias of model {name!r}"))
        shared = mine.intersection(other.aliases)
        if shared and other.role != model.role:
            found.append(("aliases", f"{sorted(shared)[0]!r} is also an alias of model {name!r} (role {other.role}); "
                                     f"the models sharing an alias must have the same role"))
    return found


def _base(doc: Mapping[str, Any], own: str | None) -> str:
    """`base`: the model a LoRA adapter applies to ("" when absent: a model of its own)."""
    base = _str(doc, "base")
    if base and not _NAME_RE.fullmatch(base):
        raise DefinitionError("base", f"{base!r:.60} is not a model name")
    if base and base == own:
        raise DefinitionError("base", "must not name the model itself")
    return base


def _lora(doc: Mapping[str, Any]) -> tuple[str, ...]:
    """`lora`: the adapter files a llama.cpp replica loads at launch (absolute paths)."""
    value = doc.get("lora", [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value) or len(value) > 256:
        raise DefinitionError("lora", "must be a list of at most 256 adapter files")
    for item in value:
        try:
            check_adapter_source(item)
        except DefinitionError as e:
            raise DefinitionError("lora", f"{item[:80]!r}: {e.message}") from None
    return tuple(value)


def _sleep_level(doc: Mapping[str, Any], engine: str | None, mode: str | None) -> int:
    """`sleep_level`: 0 (off), 1 or 2; only for an engine that can sleep and an on-demand model (the one that idles)."""
    value = doc.get("sleep_level", 0)
    if type(value) is not int or value not in SLEEP_LEVELS:
        raise DefinitionError("sleep_level", "must be 0 (off), 1 (weights kept in CPU RAM) or 2 (weights discarded)")
    if value and engine is not None and engine not in SLEEP_ENGINES:
        raise DefinitionError("sleep_level", f"engine {engine} cannot sleep: only {' and '.join(SLEEP_ENGINES)} "
                                             f"replicas sleep (leave sleep_level at 0)")
    if value and mode is not None and mode != "on-demand":
        raise DefinitionError("sleep_level", "applies to on-demand models (an idle one sleeps instead of stopping); "
                                             f"this one is {mode}")
    return value


def _adapter_source(doc: Mapping[str, Any]) -> str:
    source = _str(doc, "source", required=True)
    check_adapter_source(source)
    return source


def adapter_problems(model: ModelDef, models: Mapping[str, ModelDef]) -> list[tuple[str, str]]:
    """What is wrong with `model` as a LoRA adapter, or as the base of the adapters defined on it: an adapter's
    base is a defined model that is no adapter itself, of the adapter's engine and role (an adapter takes
    them from its base); an adapter is the base of nothing; a base keeps the engine and role of its adapters."""
    found: list[tuple[str, str]] = []
    adapters = sorted(n for n, m in models.items() if m.base == model.name and n != model.name)
    if model.base:
        base = models.get(model.base)
        if base is None:
            found.append(("base", f"{model.base!r} is not a defined model"))
        elif base.base:
            found.append(("base", f"{model.base!r} is itself an adapter (of {base.base!r}); an adapter's base is "
                                  f"a model"))
        elif base.engine not in ADAPTER_ENGINES:
            found.append(("base", f"{model.base!r} runs on {base.engine}, whose adapters llmgw does not load yet "
                                  f"(it loads them into {' and '.join(ADAPTER_ENGINES)} engines)"))
        else:
            if base.engine != model.engine:
                found.append(("engine", f"must be its base's engine ({base.engine}), not {model.engine}"))
            if base.role != model.role:
                found.append(("role", f"must be its base's role ({base.role}), not {model.role}"))
        if adapters:
            found.append(("base", f"model {model.name!r} is the base of adapter {adapters[0]!r}: an adapter cannot "
                                  f"be a base"))
    else:
        for name in adapters:
            other = models[name]
            if other.engine != model.engine or other.role != model.role:
                found.append(("engine", f"adapter {name!r} of this model is for engine {other.engine} and role "
                                        f"{other.role}: remove it first, or keep them"))
                break
    return found


def _source(doc: Mapping[str, Any], engine: str | None) -> str:
    source = _str(doc, "source", required=True)
    if engine is None:  # the engine is wrong: judge only what does not depend on it
        _check_source_text(source)
    else:
        check_source(source, engine)
    return source


def _replicas(doc: Any, mode: str | None, p: _Problems) -> tuple[int, int] | None:
    """(min, max), or None with the problems added to `p`."""
    if not p.table(doc, "replicas", ("min", "max"), "{min = 1, max = 1}"):
        return None
    pre = "replicas."
    # min's default follows the mode and max's follows min: unknown while those are wrong.
    rmin = rmax = None
    if "min" in doc or mode is not None:
        rmin = p.check(_int, doc, "min", 1 if mode == "always" else 0, low=0, high=MAX_REPLICAS, prefix=pre)
    if "max" in doc or rmin is not None:
        rmax = p.check(_int, doc, "max", max(rmin or 0, 1), low=1, high=MAX_REPLICAS, prefix=pre)
    if rmin is None or rmax is None:
        return None
    if rmin > rmax:
        p.add("replicas.min", "must not exceed replicas.max")
        return None
    return rmin, rmax


_RULE_KEYS = ("start", "end", "duration_s", "min", "max")


def _schedules(doc: Any, p: _Problems) -> tuple[Rule, ...] | None:
    """The schedule rules, or None with the problems added to `p`: each `{start = CRON, end = CRON or
    duration_s = SECONDS, min = N, max = N}`, 0 <= min <= max."""
    if not isinstance(doc, list) or len(doc) > MAX_SCHEDULES:
        p.add("schedules", f"must be a list of at most {MAX_SCHEDULES} rules like "
                           '{start = "0 8 * * mon-fri", end = "0 18 * * mon-fri", min = 2, max = 4}')
        return None
    before = len(p.found)
    rules = []
    for i, item in enumerate(doc):
        pre = f"schedules[{i}]"
        if not p.table(item, pre, _RULE_KEYS, '{start = "0 8 * * mon-fri", duration_s = 36000, min = 2, max = 4}'):
            continue
        crons = {key: p.check(_cron, item, key, pre) for key in ("start", "end") if key in item or key == "start"}
        low = p.check(_int, item, "min", 0, low=0, high=MAX_REPLICAS, prefix=pre + ".")
        high = p.check(_int, item, "max", 0, low=0, high=MAX_REPLICAS, prefix=pre + ".")
        for key in ("min", "max"):
            if key not in item:
                p.add(f"{pre}.{key}", "is required (the replicas while the rule rules; max 0: none)")
        if low is not None and high is not None and low > high:
            p.add(f"{pre}.min", f"must not exceed {pre}.max")
        duration = 0.0
        if ("end" in item) == ("duration_s" in item):
            p.add(pre, "needs one of end (a cron expression) or duration_s (seconds), not both")
        elif "duration_s" in item:
            duration = p.check(_num, item, "duration_s", 0.0, prefix=pre + ".") or 0.0
            if not 60 <= duration <= LONGEST_RULE:
                p.add(f"{pre}.duration_s", f"must be from 60 to {LONGEST_RULE:.0f} seconds (366 days)")
        if len(p.found) == before:
            rules.append(Rule(str(crons["start"]), int(low or 0), int(high or 0), str(crons.get("end") or ""),
                              duration))
    return None if len(p.found) > before else tuple(rules)


def _cron(doc: Mapping[str, Any], key: str, prefix: str) -> str:
    value = doc[key] if key in doc else None
    if not isinstance(value, str):
        raise DefinitionError(f"{prefix}.{key}", 'must be a cron expression such as "0 8 * * mon-fri"'
                              if key in doc else "is required (a cron expression such as \"0 8 * * mon-fri\")")
    try:
        return Cron.parse(value).text
    except CronError as e:
        raise DefinitionError(f"{prefix}.{key}", str(e)) from None


def _positive_num(doc: Mapping[str, Any], key: str, default: float) -> float:
    value = _num(doc, key, default)
    if value <= 0:
        raise DefinitionError(key, "must be positive")
    return value


def _args(args: Any) -> tuple[str, ...]:
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise DefinitionError("args", "must be a list of strings (never a shell string)")
    if any("\x00" in a for a in args):
        raise DefinitionError("args", "must not contain NUL bytes")
    return tuple(args)


def _profile(doc: Any, p: _Problems) -> Profile | None:
    """The profile, or None with the problems added to `p`."""
    if not p.table(doc, "profile", ("gpus", "tp", "pp", "nodes", "classes", "memory_gib", "cpu")):
        return None
    pre = "profile."
    before = len(p.found)
    gpus = p.check(_int, doc, "gpus", 1, low=1, high=64, prefix=pre)
    tp = p.check(_int, doc, "tp", 1, low=1, high=64, prefix=pre)
    pp = p.check(_int, doc, "pp", 1, low=1, high=64, prefix=pre)
    nodes = p.check(_int, doc, "nodes", 1, low=1, high=64, prefix=pre)
    sizes = {"gpus": gpus, "tp": tp, "pp": pp, "nodes": nodes}
    if gpus is not None and tp is not None and pp is not None and nodes is not None and tp * pp != gpus * nodes:
        p.add(pre + "tp", f"tp * pp ({tp * pp}) must equal gpus * nodes ({gpus * nodes})")
    classes = doc.get("classes", [])
    if not isinstance(classes, list) or not all(isinstance(c, str) and c for c in classes):
        p.add(pre + "classes", "must be a list of GPU class names")
    elif any(is_mig_class(c) for c in classes):
        # A process opens one MIG device, and instances share no NVLink (S6).
        for key, value in sizes.items():
            if value is not None and value > 1:
                p.add(pre + key, "must be 1 on a MIG class: a replica runs on exactly one MIG instance")
    mem = p.check(_num, doc, "memory_gib", 0.0, prefix=pre)
    if mem is not None and mem < 0:
        p.add(pre + "memory_gib", "must not be negative")
    cpu = doc.get("cpu", False)
    if not isinstance(cpu, bool):
        p.add(pre + "cpu", "must be true or false")
    if len(p.found) > before:
        return None
    assert gpus and tp and pp and nodes and mem is not None
    return Profile(gpus=gpus, tp=tp, pp=pp, nodes=nodes, classes=tuple(classes), memory_gib=mem, cpu=cpu)


MAX_LIMIT = 2**31 - 1  # beyond any engine's context or choice count; keeps the number an engine's int
MAX_SLOTS = 100_000  # as gateway.upstream_connections_per_replica


def _limits(doc: Any, p: _Problems) -> Limits | None:
    """The request limits (null or absent: no limit), or None with the problems added to `p`."""
    if not p.table(doc, "limits", ("max_tokens", "max_n", "concurrency_per_replica"), "{max_tokens = 4096, max_n = 4}"):
        return None
    before = len(p.found)
    # None (JSON null, or absent) is "no limit": `to_doc` writes it so, and TOML leaves the key out.
    values = {
        key: None if doc.get(key) is None else p.check(_int, doc, key, 1, low=1, high=high, prefix="limits.")
        for key, high in (("max_tokens", MAX_LIMIT), ("max_n", MAX_LIMIT), ("concurrency_per_replica", MAX_SLOTS))
    }
    if len(p.found) > before:
        return None
    return Limits(max_tokens=values["max_tokens"], max_n=values["max_n"],
                  concurrency_per_replica=values["concurrency_per_replica"])


_TIMEOUT_KEYS = ("connect_s", "first_byte_s", "chunk_s")


def _timeouts(doc: Any, p: _Problems) -> ModelTimeouts | None:
    """The model's upstream timeouts (null or absent: the gateway's default), or None with the problems
    added to `p`."""
    if not p.table(doc, "timeouts", _TIMEOUT_KEYS, "{first_byte_s = 30, chunk_s = 10}"):
        return None
    before = len(p.found)
    values = {key: None if doc.get(key) is None else p.check(_timeout, doc, key) for key in _TIMEOUT_KEYS}
    if len(p.found) > before:
        return None
    return ModelTimeouts(**values) if any(v is not None for v in values.values()) else NO_OVERRIDES


def _routing(doc: Any, p: _Problems) -> Routing | None:
    """The model's routing (absent keys: the defaults), or None with the problems added to `p`."""
    if not p.table(doc, "routing", ("affinity", "prefix_chars"), '{affinity = "prefix", prefix_chars = 4096}'):
        return None
    before = len(p.found)
    affinity = None
    if doc.get("affinity") is not None:
        affinity = p.check(_choice, doc, "affinity", AFFINITIES)
        if affinity is None:  # `_choice` names the bare key: say where it is
            p.found[-1] = ("routing.affinity", f"must be one of {', '.join(AFFINITIES)} (or absent: prefix for "
                                               "chat and guard models, off for embedding models)")
    chars = p.check(_int, doc, "prefix_chars", PREFIX_CHARS, low=1, high=MAX_PREFIX_CHARS, prefix="routing.")
    if len(p.found) > before or chars is None:
        return None
    routing = Routing(affinity=affinity, prefix_chars=chars)
    return DEFAULT_ROUTING if routing == DEFAULT_ROUTING else routing


def _timeout(doc: Mapping[str, Any], key: str) -> float:
    seconds = _num(doc, key, 0.0, prefix="timeouts.")
    if not 0 < seconds <= LONGEST_WAIT:
        raise DefinitionError(f"timeouts.{key}", f"must be a number of seconds above 0 and at most {LONGEST_WAIT:g}")
    return seconds


# --- one field each: raise DefinitionError naming it -----------------------------------


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


def _int(doc: Mapping[str, Any], key: str, default: int, *, low: int, high: int, prefix: str = "") -> int:
    value = doc.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise DefinitionError(prefix + key, "must be an integer")
    if not low <= value <= high:
        raise DefinitionError(prefix + key, f"must be between {low} and {high}")
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
