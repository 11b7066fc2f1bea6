"""The `plan` command: a what-if placement of a model definition (a file as `model serve`
takes, flags, or a defined model's definition with flags changing it) against the live state,
through `POST /api/v1/plan`. Nothing changes; the page is `render.fleet.render_plan`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import cyclopts
from cyclopts import Parameter

from llmgw.cli.ctl.definitions import ModelFlags, definition_from_flags, definitions_from_file
from llmgw.cli.ctl.errors import EXIT_OK, UsageError
from llmgw.cli.ctl.render import dig
from llmgw.cli.ctl.render.fleet import render_plan
from llmgw.cli.ctl.session import SessionParam, api_path

# A definition's fields: what `GET /api/v1/models/NAME` adds (status, estimate, ...) is left out.
DEFINITION_KEYS = frozenset({"name", "engine", "role", "source", "mode", "replicas", "idle_timeout_s",
                             "activation_window_s", "args", "profile"})


def register(app: cyclopts.App) -> None:
    app.command(plan)


def plan(
    *,
    file: Annotated[Path | None, Parameter(name="--file")] = None,
    model: Annotated[str | None, Parameter(name="--model")] = None,
    flags: ModelFlags = ModelFlags(),
    gpus: Annotated[int | None, Parameter(name="--gpus")] = None,
    nodes: Annotated[int | None, Parameter(name="--nodes")] = None,
    gpu_class: Annotated[list[str] | None, Parameter(name="--class", negative_iterable="")] = None,
    memory_gib: Annotated[float | None, Parameter(name="--memory-gib")] = None,
    cpu: Annotated[bool, Parameter(name="--cpu", negative="", show_default=False)] = False,
    arg: Annotated[list[str] | None, Parameter(name="--arg", allow_leading_hyphen=True, negative_iterable="")] = None,
    session: SessionParam,
) -> int:
    """Where one more replica of a model would land now, or why it fits nowhere (each node's
    verdict, grouped by reason). Changes nothing.

    Parameters
    ----------
    file
        TOML as `model serve --file` takes; with several models, each is planned on its own (--name picks one).
    model
        Plan a defined model: its definition, changed by any flags given.
    flags.name
        Model name (with --engine and --source, or picks one model of --file).
    gpus
        GPUs per replica (per node for --nodes > 1), tensor-parallel across them (tp = gpus × nodes).
    nodes
        Nodes per replica (whole free nodes in one fabric).
    gpu_class
        A GPU class the replica may run on; repeat for more.
    memory_gib
        Memory one replica needs, overriding the estimate.
    cpu
        May run with no GPU.
    arg
        An extra engine argument; repeat for more.
    """
    changes = _profile_changes(gpus=gpus, nodes=nodes, classes=gpu_class, memory_gib=memory_gib, cpu=cpu)
    if file is not None:
        if model is not None or any(k != "name" for k in flags.given()) or arg is not None or changes:
            raise UsageError("plan takes --file FILE (and --name to pick one of its models), --model NAME, "
                             "or the model flags, not more than one")
        definitions, _ = definitions_from_file(file)
        if flags.name is not None:
            definitions = [d for d in definitions if d.get("name") == flags.name]
            if not definitions:
                raise UsageError(f"{file} has no model named {flags.name!r}")
    elif model is not None:
        _, doc = session.request("GET", api_path("models", model))
        base = {k: v for k, v in (dig(doc, "model") or {}).items() if k in DEFINITION_KEYS}
        base.update(flags.given())
        if arg is not None:
            base["args"] = arg
        definitions = [_with_profile(base, changes)]
    else:
        missing = flags.missing()
        if missing:
            raise UsageError(f"plan needs --file FILE, --model NAME, or --name, --engine and --source "
                             f"(missing: {', '.join(missing)}); e.g. llmgw ctl plan --name big --engine vllm "
                             f"--source hf://ORG/REPO --gpus 4")
        doc = definition_from_flags(flags, args=arg)
        definitions = [_with_profile(doc, changes)]
    answers = [session.request("POST", api_path("plan"), body=d, send_body=True)[1] for d in definitions]
    if session.as_json:
        session.print_json(answers if len(answers) > 1 else answers[0])
    else:
        session.out("\n\n".join(render_plan(a) for a in answers))
    return EXIT_OK


def _profile_changes(*, gpus: int | None, nodes: int | None, classes: list[str] | None,
                     memory_gib: float | None, cpu: bool) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    if gpus is not None:
        changes.update(gpus=gpus, tp=gpus * (nodes or 1), pp=1)  # tp spans the replica's GPUs, every node's
    if nodes is not None:
        changes["nodes"] = nodes
        if gpus is None:
            changes["tp"] = None  # filled from the profile's gpus below
    if classes:
        changes["classes"] = list(classes)
    if memory_gib is not None:
        changes["memory_gib"] = memory_gib
    if cpu:
        changes["cpu"] = True
    return changes


def _with_profile(doc: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """The definition with the profile flags applied; tp kept equal to gpus × nodes when the
    flags change either (pp 1), as `model serve --gpus` does."""
    if not changes:
        return doc
    profile = dict(doc.get("profile") or {})
    profile.update(changes)
    if profile.get("tp") is None:
        per_node = int(profile.get("gpus") or 1)
        profile.update(tp=per_node * int(profile.get("nodes") or 1), pp=1)
    return {**doc, "profile": profile}
