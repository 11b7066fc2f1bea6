"""`ctl model serve --from-mirror NAME`: the preview of the model made from a mirror file (its definition, the
memory estimate, where it would land now), then, once confirmed (or with `--yes`), the definition stored.
The route is `POST /api/v1/mirror/{name}/serve` (docs/mirror.md "Serving a file")."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from llmgw.cli.ctl.errors import EXIT_OK
from llmgw.cli.ctl.render import cell, dig
from llmgw.cli.ctl.session import Session, api_path
from llmgw.cli.ctl.mirror import size_words


def serve_from_mirror(session: Session, file: str, body: dict[str, Any], yes: bool) -> int:
    """Preview, ask (a terminal) or stop (no terminal, no --yes), then commit."""
    _, preview = session.request("POST", api_path("mirror", file, "serve"), body={**body, "commit": False},
                                 send_body=True)
    if not yes:
        if session.as_json:
            session.print_json(preview)
        else:
            session.out(render_preview(preview))
        if not sys.stdin.isatty():
            session.note("nothing stored: run it again with --yes to serve it")
            return EXIT_OK
        session.stdout.flush()
        if input("serve it? [y/N] ").strip().lower() not in ("y", "yes"):
            session.note("nothing stored")
            return EXIT_OK
    elif not session.as_json:
        session.out(render_preview(preview))
    code, done = session.request("POST", api_path("mirror", file, "serve"), body={**body, "commit": True},
                                 send_body=True)
    if session.as_json:
        session.print_json(done)
    else:
        session.out(render_committed(done, code))
    return EXIT_OK


def render_preview(doc: Mapping[str, Any]) -> str:
    d = dig(doc, "definition")
    d = d if isinstance(d, Mapping) else {}
    found = d.get("profile")
    prof: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    where = "CPU" if prof.get("cpu") else f"{cell(prof.get('gpus'))} GPU(s)"
    found = d.get("replicas")
    reps: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    est, plan = dig(doc, "estimate"), dig(doc, "plan")
    size = dig(est, "bytes")
    name = cell(dig(doc, "name"))
    what = (f"judge {name} (role guard: never a model clients call)" if dig(doc, "judge")
            else f"model {name} (role {cell(d.get('role'))})")
    lines = [f"{what} from mirror file {cell(dig(doc, 'file'))}",
             f"engine    {cell(d.get('engine'))}",
             f"source    {cell(d.get('source'))}",
             f"profile   {where} ({cell(dig(doc, 'profile_reason'))})",
             f"replicas  {cell(reps.get('min'))}..{cell(reps.get('max'))}, mode {cell(d.get('mode'))}",
             f"memory    {size_words(size) if isinstance(size, int) else 'unknown'}"
             + (f" ({cell(dig(est, 'detail'))})" if dig(est, "detail") else "")]
    if dig(plan, "fits"):
        lines.append(f"would run on {cell(dig(plan, 'choice', 'node'))} now")
    else:
        lines.append(f"would run nowhere now: {cell(dig(plan, 'reason'))}")
    warnings = dig(doc, "warnings")
    if isinstance(warnings, list):
        lines += [f"warning: {cell(w)}" for w in warnings]
    return "\n".join(lines)


def render_committed(doc: Mapping[str, Any], code: int) -> str:
    verb = "created" if code == 201 else "replaced"
    kind = "judge" if dig(doc, "judge") else "model"
    follow = "llmgw ctl guard judge status" if dig(doc, "judge") else f"llmgw ctl model show {cell(dig(doc, 'name'))}"
    return f"{verb} {kind} {cell(dig(doc, 'name'))} (source mirror://{cell(dig(doc, 'file'))}); follow it: {follow}"


def mirror_body(flags: Any, min_: int | None, max_: int | None, gpus: int | None, cpu: bool,
                args: list[str] | None) -> dict[str, Any]:
    """The serve request's name and overrides from `model serve`'s flags (`flags`: its ModelFlags)."""
    body: dict[str, Any] = {k: v for k, v in (("name", flags.name), ("mode", flags.mode), ("role", flags.role),
                                              ("engine", flags.engine)) if v is not None}
    replicas = {k: v for k, v in (("min", min_), ("max", max_)) if v is not None}
    if replicas:
        body["replicas"] = replicas
    profile: dict[str, Any] = {"gpus": gpus, "tp": gpus} if gpus is not None else {}
    if cpu:
        profile["cpu"] = True
    if profile:
        body["profile"] = profile
    if args:
        body["args"] = list(args)
    return body
