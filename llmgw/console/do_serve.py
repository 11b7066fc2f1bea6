"""Do → Serve a model: the form (the fields of `ctl model serve`, or a whole definition as JSON), the
definition read from it, and `ctl plan`'s verdict shown before anything is committed.

Pure HTML from values: the routes are in `do.py`; the plan is `admin_plan.plan_doc`, as `ctl plan` asks it.
"""

from __future__ import annotations

import json
import shlex
from typing import Any, Mapping

from llmgw.console.layout import esc, table
from llmgw.domain.model import ENGINES, MODES, ROLES, DefinitionError, ModelDef
from llmgw.domain.observed import MIG_INDEX_BASE

MAX_DEFINITION_CHARS = 64 * 1024
INT_FIELDS = ("replicas_min", "replicas_max", "gpus")
FLOAT_FIELDS = ("memory_gib", "idle_timeout_s", "activation_window_s")


class FormError(ValueError):
    """What is wrong with the form, every problem in one sentence."""


def definition(form: Mapping[str, str]) -> dict[str, Any]:
    """The definition document the form asks: its `definition` JSON when given, else its fields as
    `ctl model serve` builds them from flags (gpus also sets tp). FormError names every problem."""
    raw = (form.get("definition") or "").strip()
    if raw:
        if len(raw) > MAX_DEFINITION_CHARS:
            raise FormError(f"the definition is over {MAX_DEFINITION_CHARS} characters")
        try:
            parsed = json.loads(raw)
        except (ValueError, RecursionError) as e:
            raise FormError(f"the definition is not valid JSON: {e}") from None
        if not isinstance(parsed, dict):
            raise FormError("the definition must be one JSON object (one model)")
        return parsed
    problems = [f"{f} is required" for f in ("name", "engine", "source") if not (form.get(f) or "").strip()]
    numbers: dict[str, Any] = {}
    for f in (*INT_FIELDS, *FLOAT_FIELDS):
        text = (form.get(f) or "").strip()
        if not text:
            continue
        try:
            numbers[f] = int(text) if f in INT_FIELDS else float(text)
        except ValueError:
            problems.append(f"{f.replace('_', ' ')} must be a {'whole ' if f in INT_FIELDS else ''}number, "
                            f"not {text[:40]!r}")
    try:
        args = shlex.split(form.get("args") or "")
    except ValueError as e:
        problems.append(f"args: {e}")
        args = []
    if problems:
        raise FormError("; ".join(problems))
    doc: dict[str, Any] = {k: form[k].strip() for k in ("name", "engine", "source")}
    for k in ("role", "mode"):
        if (form.get(k) or "").strip():
            doc[k] = form[k].strip()
    replicas = {k: numbers[f"replicas_{k}"] for k in ("min", "max") if f"replicas_{k}" in numbers}
    if replicas:
        doc["replicas"] = replicas
    for k in ("idle_timeout_s", "activation_window_s"):
        if k in numbers:
            doc[k] = numbers[k]
    profile: dict[str, Any] = {}
    if "gpus" in numbers:
        profile.update(gpus=numbers["gpus"], tp=numbers["gpus"])  # tensor-parallel across its GPUs, as ctl does
    classes = [c.strip() for c in (form.get("classes") or "").split(",") if c.strip()]
    if classes:
        profile["classes"] = classes
    if "memory_gib" in numbers:
        profile["memory_gib"] = numbers["memory_gib"]
    if form.get("cpu"):
        profile["cpu"] = True
    if profile:
        doc["profile"] = profile
    if args:
        doc["args"] = args
    return doc


def model_of(doc: dict[str, Any]) -> ModelDef:
    try:
        return ModelDef.from_doc(doc)
    except DefinitionError as e:
        raise FormError(f"the definition is not valid: {e}") from None


def form_html(csrf: str, values: Mapping[str, str] | None = None) -> str:
    """The serve form; `values` refills it after a refusal."""
    v = values or {}

    def text(name: str, label: str, placeholder: str = "", kind: str = "text") -> str:
        return (f'<label>{esc(label)} <input type="{kind}" name="{name}" value="{esc(v.get(name, ""))}" '
                f'placeholder="{esc(placeholder)}" data-testid="serve-{name}"></label>')

    def select(name: str, label: str, choices: tuple[str, ...], blank: str | None) -> str:
        opts = f'<option value="">{esc(blank)}</option>' if blank is not None else ""
        opts += "".join(f'<option value="{esc(c)}"{" selected" if v.get(name) == c else ""}>{esc(c)}</option>'
                        for c in choices)
        return f'<label>{esc(label)} <select name="{name}" data-testid="serve-{name}">{opts}</select></label>'

    cpu = " checked" if v.get("cpu") else ""
    return (f'<form method="post" action="/do/serve" id="serve-form" data-testid="serve-form" class="do">{csrf}'
            f'<p>{text("name", "Name", "qwen2.5-7b")} {select("engine", "Engine", ENGINES, None)} '
            f'{text("source", "Source", "/models/qwen2.5-7b.gguf, hf://org/model, sim://name")}</p>'
            f'<p>{select("role", "Role", ROLES, "chat (default)")} {select("mode", "Mode", MODES, "always (default)")} '
            f'{text("replicas_min", "Replicas min", "1")} {text("replicas_max", "max", "1")}</p>'
            f'<p>{text("gpus", "GPUs per replica", "1")} {text("classes", "GPU classes", "h100-80g, a100-80g")} '
            f'{text("memory_gib", "Memory GiB", "estimated")} <label><input type="checkbox" name="cpu" value="1"'
            f'{cpu} data-testid="serve-cpu"> may run on CPU</label></p>'
            f'<p>{text("idle_timeout_s", "Idle timeout s", "900")} '
            f'{text("activation_window_s", "Activation window s", "120")} '
            f'{text("args", "Engine args", "--ctx-size 8192")}'
            f'</p><details><summary>or paste a whole definition (JSON)</summary>'
            f'<textarea name="definition" rows="6" cols="80" data-testid="serve-definition">'
            f'{esc(v.get("definition", ""))}</textarea></details>'
            f'<p><button type="submit" data-testid="serve-plan">Plan it (nothing is changed yet)</button></p></form>')


def plan_html(plan: Mapping[str, Any]) -> str:
    """`ctl plan`'s verdict: where one more replica would land now, or every node's reason grouped."""
    choice = plan.get("choice")
    out = []
    if plan.get("fits") and isinstance(choice, Mapping):
        devices = labels([int(g) for g in choice.get("gpus") or ()]) or "CPU"
        members = choice.get("members") or []
        where = f"nodes {', '.join(str(m.get('node')) for m in members)}" if members else f"node {choice.get('node')}"
        out.append(f'<p class="verdict fits" data-testid="plan-verdict" data-fits="true">Fits now: {esc(where)}, '
                   f'devices {esc(devices)}, score {esc(choice.get("score"))} of 100.</p>')
    else:
        out.append(f'<p class="verdict nowhere banner warn" data-testid="plan-verdict" data-fits="false">Fits nowhere '
                   f'now: {esc(plan.get("reason") or "no node fits")}. Served anyway, it waits (unplaceable, with '
                   f'this reason) until a node can take it.</p>')
    groups = plan.get("groups") or []
    if groups:
        rows = []
        for g in groups:
            for m in g.get("messages") or ():
                nodes = [str(n) for n in m.get("nodes") or ()]
                rows.append([str(g.get("verdict", "")).replace("_", " "), g.get("code"), len(nodes), m.get("message"),
                             ", ".join(nodes[:4]) + (f" +{len(nodes) - 4}" if len(nodes) > 4 else "")])
        out.append(table(["Verdict", "Reason", "Nodes", "Why", "E.g."], rows, testid="plan-refusals"))
    estimate = plan.get("estimate") or {}
    size = estimate.get("bytes")
    memory = (f"{size / 2**30:.1f} GiB{'' if estimate.get('complete', True) else ' at least'}"
              if isinstance(size, int) else "unknown")
    out.append(f'<p data-testid="plan-memory">Memory for one replica: {esc(memory)} '
               f'({esc(estimate.get("detail") or estimate.get("source"))}).</p>')
    existing = plan.get("existing") or {}
    if existing.get("defined"):
        same = existing.get("same_definition")
        change = ("with this same definition: serving it changes nothing" if same else
                  f"with another definition: its {existing.get('replicas')} replica(s) are replaced by the new one")
        out.append(f'<p data-testid="plan-existing">A model named {esc(plan.get("model"))} is already defined '
                   f'{esc(change)}.</p>')
    out.append(f'<p>Planned against revision {esc(plan.get("revision"))} and {esc(plan.get("nodes"))} connected '
               f'node(s); nothing was changed.</p>')
    return "".join(out)


def labels(indexes: list[int]) -> str:
    """Placement indexes as every view names them: "3", or "0/mig1" for a MIG instance."""
    return ", ".join(f"{(i - MIG_INDEX_BASE) // 100}/mig{(i - MIG_INDEX_BASE) % 100}" if i >= MIG_INDEX_BASE
                     else str(i) for i in indexes)
