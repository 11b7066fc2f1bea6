"""Serving a mirror file (pure): the model definition made from a file's header facts (`MirrorFile.metadata`,
`llmgw.mirror.inspect.FileFacts.to_doc()`), and the memory estimate one replica of it needs, before any node
holds the file. The admin op (`llmgw/control/ops/mirror_serve.py`) shows both with placement's plan, and stores
the definition on commit (docs/mirror.md "Serving a file").

The rules: a GGUF runs on llama.cpp, a safetensors file on vLLM; the role is chat, or embedding / rerank when
the GGUF's pooling says so (`{arch}.pooling_type`: mean, cls, last; rank); a Llama Guard file is a judge (role
guard, defined by the op as `ctl guard judge enable` defines one). The profile: llama.cpp on one GPU when a GPU
of the cluster holds the estimate, else on CPU; vLLM on the fewest GPUs (1, 2, 4, 8, tensor-parallel) whose
share of each holds it. `profile.memory_gib` is set to the estimate (rounded up to 0.01 GiB), so placement
checks memory before any node reports the file. A LoRA adapter, a GGUF in split parts and a multimodal projector
are refused (`serve_problem`): the mirror serves whole models only, for now.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from llmgw.domain.frozen import thaw
from llmgw.domain.memory import GIB, VLLM_DEFAULT_SHARE, MemoryEstimate, estimate_from_facts, gib
from llmgw.domain.mirror import SCHEME, MirrorFile
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import NodeInfo

EMBEDDING_POOLING = ("mean", "cls", "last")
VLLM_GPUS = (1, 2, 4, 8)  # tensor-parallel sizes tried, fewest first
OVERRIDES = ("mode", "replicas", "profile", "args", "limits", "aliases", "fallbacks", "routing", "timeouts",
             "role", "engine")  # what a serve request may set over the definition made from the file
JUDGE_OVERRIDES = ("replicas", "mode", "args", "profile")  # a judge stays a judge


def engine_of(f: MirrorFile) -> str:
    return "llama.cpp" if f.kind == "gguf" else "vllm"


def role_of(metadata: Mapping[str, Any]) -> str:
    """guard (a Llama Guard file), rerank (pooling rank), embedding (mean, cls, last pooling), else chat."""
    if metadata.get("llama_guard"):
        return "guard"
    pooling = metadata.get("pooling")
    if pooling == "rank":
        return "rerank"
    if pooling in EMBEDDING_POOLING:
        return "embedding"
    return "chat"


def is_judge(f: MirrorFile) -> bool:
    return bool(thaw(f.metadata).get("llama_guard"))


def serve_problem(f: MirrorFile) -> str | None:
    """Why the file cannot be served as a model of its own (None: it can)."""
    md = thaw(f.metadata)
    if md.get("lora_adapter") or md.get("general_type") == "adapter":
        return (f"{f.name} is a LoRA adapter: adapters from the mirror are not supported yet (a model's lora "
                "adapters are absolute paths on its nodes; docs/mirror.md)")
    if (md.get("split_count") or 0) > 1:
        return (f"{f.name} is part {md.get('split_part')} of a GGUF split in {md['split_count']} parts: the mirror "
                "serves whole files; merge them first (llama-gguf-split --merge) and add the merged file")
    if md.get("general_type") not in (None, "model"):
        return f"{f.name} is a GGUF of type {md['general_type']!r}, not a model"
    return None


def default_name(f: MirrorFile) -> str:
    """The model's name when none is given: the file's mirror name without `.gguf` / `.safetensors`."""
    for suffix in (".gguf", ".safetensors"):
        if f.name.lower().endswith(suffix) and len(f.name) > len(suffix):
            return f.name[: -len(suffix)]
    return f.name


def facts_entry(f: MirrorFile) -> dict[str, Any]:
    """The file's facts under a storage report entry's names (what `estimate_from_facts` reads)."""
    md = thaw(f.metadata)
    entry: dict[str, Any] = {"kind": f.kind, "size": f.size, "name": f.name}
    memory = md.get("memory")
    if isinstance(memory, dict):
        entry.update(memory)
    if md.get("context_length") and "context_length" not in entry:
        entry["context_length"] = md["context_length"]
    if "tensor_bytes" not in entry and isinstance(md.get("data_bytes"), int) and md["data_bytes"] > 0:
        entry["tensor_bytes"] = md["data_bytes"]
    return entry


def largest_gpu(nodes: Mapping[str, NodeInfo]) -> int:
    """The most memory of one placeable, healthy GPU of the cluster (0: none)."""
    return max((g.memory_total for n in nodes.values() for g in n.gpus if g.placeable and g.healthy), default=0)


def pick_profile(base: Mapping[str, Any], f: MirrorFile, nodes: Mapping[str, NodeInfo]) -> tuple[dict[str, Any], str]:
    """The profile for the definition `base` (engine, role, args set) of `f`, and words saying why."""
    entry = facts_entry(f)
    biggest = largest_gpu(nodes)

    def estimate(profile: dict[str, Any]) -> MemoryEstimate:
        return estimate_from_facts(ModelDef.from_doc({**base, "profile": profile}), entry)

    if base["engine"] == "llama.cpp":
        need = estimate({"gpus": 1}).total_bytes
        if biggest and (need is None or need <= biggest):
            return {"gpus": 1}, (f"one GPU: the largest GPU of the cluster ({gib(biggest)}) holds "
                                 f"{gib(need) if need is not None else 'it (no estimate)'}")
        return {"cpu": True}, ("CPU: " + ("no node reports a GPU" if not biggest else
                                          f"{gib(need or 0)} is more than the largest GPU ({gib(biggest)})"))
    for n in VLLM_GPUS:
        profile = {"gpus": n, "tp": n}
        each = estimate(profile).per_device(n)
        if biggest and (each is None or each <= biggest * VLLM_DEFAULT_SHARE):
            return profile, (f"{n} GPU{'s' if n > 1 else ''}: {gib(each) if each is not None else 'unknown'} each "
                             f"within vLLM's share of the largest GPU ({gib(biggest)})")
    return {"gpus": 1, "tp": 1}, ("1 GPU, though " + ("no node reports a GPU" if not biggest else
                                  f"no {VLLM_GPUS[-1]} GPUs of {gib(biggest)} hold it") + ": vLLM needs GPUs")


def definition_doc(f: MirrorFile, name: str, nodes: Mapping[str, NodeInfo], overrides: Mapping[str, Any],
                   judge: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], MemoryEstimate, str]:
    """(the definition, its memory estimate, why this profile) of the model `name` served from `f`.
    `judge`: the judge's definition (`ctl guard judge enable`'s) for a Llama Guard file, used as is but for its
    source and the overrides. `ModelDef.from_doc` may refuse the overrides (`DefinitionError`)."""
    md = thaw(f.metadata)
    source = SCHEME + f.name
    if judge is not None:
        doc: dict[str, Any] = {**judge, "name": name, "source": source}
        why = "CPU: a judge runs beside the models it judges (as `ctl guard judge enable` serves one)"
    else:
        doc = {"name": name, "engine": engine_of(f), "role": role_of(md), "source": source}
        doc.update({k: v for k, v in overrides.items() if k in ("engine", "role", "args")})
        profile, why = pick_profile(doc, f, nodes)
        doc["profile"] = profile
    given = dict(overrides.get("profile") or {}) if isinstance(overrides.get("profile"), dict) else {}
    doc.update({k: v for k, v in overrides.items() if k != "profile"})
    if "profile" in overrides:
        if not isinstance(overrides["profile"], dict):
            doc["profile"] = overrides["profile"]  # refused by from_doc, with its words
        else:
            doc["profile"] = {**doc.get("profile", {}), **given}
            why = "as given"
    model = ModelDef.from_doc(doc)
    estimate = estimate_from_facts(model, facts_entry(f))
    if "memory_gib" not in given and estimate.total_bytes is not None and isinstance(doc.get("profile"), dict):
        doc["profile"] = {**doc["profile"], "memory_gib": math.ceil(estimate.total_bytes / GIB * 100) / 100}
    return doc, estimate, why
