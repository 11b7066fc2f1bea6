"""How much memory one replica of a model needs (S2): `profile.memory_gib` when set, else an
estimate from what the nodes' storage reports say of its weights. Owns `estimate_for`, the rule.

Pure. Unknown is None, never 0: a model whose weights nobody has seen has no estimate, and
placement then checks nothing it cannot know. The rule, in docs/placement.md ("Memory estimate"):
weights (the tensor bytes the files hold) + the KV cache for the context the engine will allocate
+ a fixed overhead per device for the engine. Where the KV cache cannot be sized (no head counts
in the files) the figure is a lower bound (`complete` False): weights and overhead only.
"""

from __future__ import annotations

import os.path
from dataclasses import dataclass, replace
from typing import Any, Mapping

from llmgw.domain.model import ModelDef
from llmgw.domain.observed import NodeInfo

GIB = 1 << 30
MIB = 1 << 20

# Per device (each GPU of a replica, or the CPU), on top of weights and KV cache. llama.cpp: the
# CUDA context and the compute buffers (a few hundred MiB at the default batch sizes). vLLM: the
# CUDA context, CUDA graphs and the activations of its profiling run (1-2 GiB on a 7-70B model).
ENGINE_OVERHEAD_BYTES: Mapping[str, int] = {"llama.cpp": 512 * MIB, "vllm": 3 * GIB // 2}
# The context an engine allocates when its args do not say: llmgw's in-process llama.cpp (CPU)
# uses 2048 (engines/llamacpp.py), llama-server (GPUs) its own default of 4096; both capped by the
# model's trained context. vLLM: the trained context (max_position_embeddings).
LLAMA_CPP_CONTEXT_CPU = 2048
LLAMA_CPP_CONTEXT_GPU = 4096
# vLLM takes this share of each of its GPUs whatever the model needs (--gpu-memory-utilization).
VLLM_DEFAULT_SHARE = 0.9
KV_BYTES = {"float32": 4, "float": 4, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}  # else 2 (f16 / bf16)


@dataclass(frozen=True)
class MemoryEstimate:
    total_bytes: int | None  # for the whole replica (all its GPUs, or its CPU memory); None = unknown
    source: str  # "profile" | "gguf" | "safetensors" | "unknown"
    detail: str = ""  # words for `ctl model show`: how the figure was made
    devices: int = 1  # GPUs the replica spreads over (1 on CPU); the overhead is counted per device
    complete: bool = True  # False: a lower bound (the KV cache could not be sized)
    # vLLM takes this share of each GPU's total memory at start, whatever it needs: the GPU must
    # have that much free. None for engines that take only what they need.
    device_share: float | None = None

    def per_device(self, devices: int) -> int | None:
        """Bytes each of `devices` GPUs must have free (an even split), None when unknown."""
        if self.total_bytes is None:
            return None
        return -(-self.total_bytes // max(devices, 1))

    def to_doc(self) -> dict[str, Any]:
        """The admin API's `estimate` field: `bytes` and `per_device` null when unknown."""
        return {
            "bytes": self.total_bytes, "source": self.source, "detail": self.detail, "devices": self.devices,
            "per_device": self.per_device(self.devices), "complete": self.complete,
            "device_share": self.device_share,
        }


def estimate_for(model: ModelDef, nodes: Mapping[str, NodeInfo], index: WeightsIndex | None = None,
                 sources: Mapping[str, Mapping[str, Any]] | None = None) -> MemoryEstimate:
    """The memory one replica of `model` needs; `nodes` are where storage reports come from.
    Reports that disagree (different files at the same path on two nodes): the largest figure.
    `index`: `WeightsIndex.of(nodes)`, for a caller estimating many models against the same nodes.
    `sources`: the facts of sources the control plane opened where it runs (`Observed.sources`: a
    `pkg://` file, a local path), used when no storage report gives a figure."""
    prof = model.profile
    devices = 1 if prof.cpu else prof.gpus * prof.nodes
    share = _vllm_share(model) if model.engine == "vllm" and not prof.cpu else None
    if prof.memory_gib > 0:
        return MemoryEstimate(int(prof.memory_gib * GIB), "profile", "profile.memory_gib", devices,
                              device_share=share)
    if model.engine == "sim":
        return MemoryEstimate(None, "unknown", "the sim engine has no weights; set profile.memory_gib", devices)
    best: MemoryEstimate | None = None
    for entry in (index or WeightsIndex.of(nodes)).entries(model.source):
        found = _from_entry(model, entry, devices, share)
        if found.total_bytes is not None and (best is None or found.total_bytes > (best.total_bytes or 0)):
            best = found
    if best is None and sources and isinstance(sources.get(model.source), Mapping):
        found = _from_entry(model, sources[model.source], devices, share)
        if found.total_bytes is not None:
            return replace(found, detail=found.detail + " (read from the source where the control plane runs)")
    if best is None:
        return MemoryEstimate(None, "unknown", "no node reports these weights; set profile.memory_gib", devices)
    return best


def estimate_from_facts(model: ModelDef, facts: Mapping[str, Any]) -> MemoryEstimate:
    """The memory one replica of `model` needs from one file's facts, under a storage report entry's names
    (`kind`, `size`, `tensor_bytes`, `context_length`, `layers`, head counts...): the mirror's catalog gives them
    before any node holds the file (`llmgw/domain/mirror_serve.py`). `profile.memory_gib` is not read."""
    prof = model.profile
    devices = 1 if prof.cpu else prof.gpus * prof.nodes
    share = _vllm_share(model) if model.engine == "vllm" and not prof.cpu else None
    return _from_entry(model, facts, devices, share)


@dataclass(frozen=True)
class WeightsIndex:
    """Every node's storage report entries by path and by name, each distinct entry once (a filer
    that 1,000 nodes mount is one entry), in node order: an estimate looks up, never scans."""

    by_path: Mapping[str, tuple[Mapping[str, Any], ...]]
    by_name: Mapping[str, tuple[Mapping[str, Any], ...]]

    @classmethod
    def of(cls, nodes: Mapping[str, NodeInfo]) -> WeightsIndex:
        """The index of `nodes`; the last one built is reused while the nodes are equal (reports
        change rarely; the same NodeInfo objects compare by identity, at C speed)."""
        cached = _LAST_INDEX.get("nodes")
        if cached is not None and cached[0] == nodes:
            return cached[1]
        by_path: dict[str, dict[Any, Mapping[str, Any]]] = {}
        by_name: dict[str, dict[Any, Mapping[str, Any]]] = {}
        for name in sorted(nodes):
            for report in nodes[name].storage:
                for entry in report.get("models", ()):
                    if not isinstance(entry, Mapping) or not isinstance(entry.get("path"), str):
                        continue
                    key = _identity(entry)
                    by_path.setdefault(os.path.normpath(entry["path"]), {}).setdefault(key, entry)
                    if isinstance(entry.get("name"), str):
                        by_name.setdefault(entry["name"], {}).setdefault(key, entry)
        index = cls({k: tuple(v.values()) for k, v in by_path.items()},
                    {k: tuple(v.values()) for k, v in by_name.items()})
        _LAST_INDEX["nodes"] = (dict(nodes), index)
        return index

    def entries(self, source: str) -> list[Mapping[str, Any]]:
        """The distinct entries that hold `source` (see `holds`)."""
        for scheme in ("hf://", "mirror://"):
            if source.startswith(scheme):
                return list(self.by_name.get(source[len(scheme):].strip("/"), ()))
        if not source.startswith("/"):
            return []
        want = os.path.normpath(source)
        inside = [e for e in self.by_path.get(os.path.dirname(want), ()) if e.get("kind") == "safetensors"]
        return [*self.by_path.get(want, ()), *inside]


# The last index built, with the nodes it was built from (a memo: the core stays pure).
_LAST_INDEX: dict[str, tuple[dict[str, NodeInfo], WeightsIndex]] = {}


def _identity(entry: Mapping[str, Any]) -> Any:
    """Equal entries (the same file seen through a filer by many nodes) are one."""
    try:
        key = tuple(sorted(entry.items()))
        hash(key)
        return key
    except TypeError:  # an unhashable value: this entry stands alone
        return id(entry)


def entries_for(source: str, nodes: Mapping[str, NodeInfo]) -> list[Mapping[str, Any]]:
    """Every distinct storage report entry, on any node, that holds `source`, in node order."""
    return WeightsIndex.of(nodes).entries(source)


def holds(entry: Mapping[str, Any], source: str) -> bool:
    """Whether a storage report entry is `source`'s weights: the same path, or the model directory
    (safetensors) the source lies in; `hf://ORG/REPO` and `mirror://NAME` by the name the report
    gives (a Hugging Face cache's repo id). A directory holding weights is not them."""
    path = entry.get("path")
    if not isinstance(path, str):
        return False
    for scheme in ("hf://", "mirror://"):
        if source.startswith(scheme):
            return entry.get("name") == source[len(scheme):].strip("/")
    if not source.startswith("/"):
        return False
    want, have = os.path.normpath(source), os.path.normpath(path)
    return want == have or (entry.get("kind") == "safetensors" and os.path.dirname(want) == have)


# --- one report entry ------------------------------------------------------------------------


def _from_entry(model: ModelDef, entry: Mapping[str, Any], devices: int, share: float | None) -> MemoryEstimate:
    kind = str(entry.get("kind", "weights"))
    weights = _int(entry, "tensor_bytes") or _int(entry, "size")
    if weights is None:
        return MemoryEstimate(None, "unknown", f"{kind}: the report gives no size", devices)
    overhead = ENGINE_OVERHEAD_BYTES.get(model.engine, 0) * devices
    context, why = _context(model, entry)
    per_token = _kv_per_token(model, entry)
    parts = [f"weights {gib(weights)}"]
    complete = context is not None and per_token is not None
    kv = 0
    if context is not None and per_token is not None:
        kv = context * per_token
        parts.append(f"KV cache {gib(kv)} for {context} tokens{why}")
    else:
        parts.append("KV cache unknown (" + ("no context length" if context is None else "no head counts")
                     + f" in the {kind} facts): a lower bound")
    if overhead:
        each = ENGINE_OVERHEAD_BYTES[model.engine]
        parts.append(f"overhead {gib(each)}" + (f" × {devices} GPUs" if devices > 1 else ""))
    detail = f"{kind}: " + " + ".join(parts)
    return MemoryEstimate(weights + kv + overhead, kind, detail, devices, complete, share)


def _context(model: ModelDef, entry: Mapping[str, Any]) -> tuple[int | None, str]:
    """Tokens of KV cache the engine allocates, and words when it is not what the args say."""
    trained = _int(entry, "context_length")
    if model.engine == "llama.cpp":
        asked = _whole(model.args, "--ctx-size")
        if asked is not None:
            return asked, ""  # taken as is: llama.cpp allocates it even past the trained context
        default = LLAMA_CPP_CONTEXT_CPU if model.profile.cpu else LLAMA_CPP_CONTEXT_GPU
        return (min(default, trained) if trained else default), " (llama.cpp's default)"
    if model.engine == "vllm":
        asked = _whole(model.args, "--max-model-len")
        if asked is not None:
            return asked, ""
        return trained, " (the trained context)"
    return trained, ""


def _kv_per_token(model: ModelDef, entry: Mapping[str, Any]) -> int | None:
    """K and V of every layer for one token: layers × kv heads × (key + value length) × bytes."""
    layers, heads = _int(entry, "layers"), _int(entry, "head_count")
    kv_heads = _int(entry, "head_count_kv") or heads
    embd = _int(entry, "embedding_length")
    head_dim = embd // heads if embd and heads else None
    k, v = _int(entry, "key_length") or head_dim, _int(entry, "value_length") or head_dim
    if not (layers and kv_heads and k and v):
        return None
    return layers * kv_heads * (k + v) * _kv_bytes(model, entry)


def _kv_bytes(model: ModelDef, entry: Mapping[str, Any]) -> int:
    """Bytes per cached element: llama.cpp's cache is f16; vLLM's follows --kv-cache-dtype, else
    --dtype, else the weights' dtype (config.json's torch_dtype)."""
    if model.engine != "vllm":
        return 2
    for flag in ("--kv-cache-dtype", "--dtype"):
        said = _arg(model.args, flag)
        if said is not None and said != "auto":
            return KV_BYTES.get(said, 2)
    dtype = entry.get("dtype")
    return KV_BYTES.get(dtype, 2) if isinstance(dtype, str) else 2


def _vllm_share(model: ModelDef) -> float:
    said = _arg(model.args, "--gpu-memory-utilization")
    try:
        return float(said) if said is not None else VLLM_DEFAULT_SHARE
    except ValueError:
        return VLLM_DEFAULT_SHARE


def _arg(args: tuple[str, ...], flag: str) -> str | None:
    """The value of `flag` in engine args (`--flag VALUE` or `--flag=VALUE`), the last one given."""
    value: str | None = None
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(flag + "="):
            value = arg[len(flag) + 1:]
    return value


def _whole(args: tuple[str, ...], flag: str) -> int | None:
    """A whole-number flag's value, None unless digits >= 1 (what the engine accepts at start)."""
    value = _arg(args, flag)
    if value is None or not (value.isascii() and value.isdigit()) or len(value) > 18 or int(value) < 1:
        return None
    return int(value)


def _int(entry: Mapping[str, Any], key: str) -> int | None:
    value = entry.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def gib(n: int) -> str:
    """A size in words: '4.1 GiB', '8 GiB', '512 MiB' (under 1 GiB), '256 KiB' (under 1 MiB)."""
    value, unit = (n / GIB, "GiB") if n >= GIB else (n / MIB, "MiB") if n >= MIB else (n / 1024, "KiB")
    text = f"{value:.1f}".rstrip("0").rstrip(".")
    return f"{text} {unit}"
