"""The `models` and `model show|serve|remove|retry` commands: the catalog as the
operator sees and changes it through the admin API."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import cyclopts
from cyclopts import Parameter

from llmgw.cli.ctl.definitions import ModelFlags, definition_from_flags, definitions_from_file
from llmgw.cli.ctl.errors import EXIT_OK, CtlError, Refused, UsageError
from llmgw.cli.ctl.mirror_serve import mirror_body, serve_from_mirror
from llmgw.cli.ctl.render import cell, dig, render_model, render_models
from llmgw.cli.ctl.session import SessionParam, api_path


def register(app: cyclopts.App) -> None:
    app.command(models)
    app.command(model_app)


def models(*, session: SessionParam) -> int:
    """Every model in the catalog with its health."""
    return session.show_answer("GET", api_path("models"), render=render_models)


model_app = cyclopts.App(name="model", help="Show, serve, remove or retry one model.")
ModelName = Annotated[str, Parameter(help="The model's name.")]


@model_app.command(name="show")
def model_show(name: ModelName, /, *, session: SessionParam) -> int:
    """One model: its definition, health and replicas."""
    return session.show_answer("GET", api_path("models", name), render=lambda d: render_model(dig(d, "model") or {}))


@model_app.command(name="serve")
def model_serve(
    *,
    file: Annotated[Path | None, Parameter(name="--file")] = None,
    flags: ModelFlags = ModelFlags(),
    min_: Annotated[int | None, Parameter(name="--min")] = None,
    max_: Annotated[int | None, Parameter(name="--max")] = None,
    gpus: Annotated[int | None, Parameter(name="--gpus")] = None,
    cpu: Annotated[bool, Parameter(name="--cpu", negative="", show_default=False)] = False,
    max_tokens: Annotated[int | None, Parameter(name="--max-tokens")] = None,
    max_n: Annotated[int | None, Parameter(name="--max-n")] = None,
    slots: Annotated[int | None, Parameter(name="--slots")] = None,
    connect_timeout: Annotated[float | None, Parameter(name="--connect-timeout")] = None,
    first_byte_timeout: Annotated[float | None, Parameter(name="--first-byte-timeout")] = None,
    chunk_timeout: Annotated[float | None, Parameter(name="--chunk-timeout")] = None,
    arg: Annotated[list[str] | None, Parameter(name="--arg", allow_leading_hyphen=True, negative_iterable="")] = None,
    fallback: Annotated[list[str] | None, Parameter(name="--fallback", negative_iterable="")] = None,
    alias: Annotated[list[str] | None, Parameter(name="--alias", negative_iterable="")] = None,
    affinity: Annotated[Literal["prefix", "off"] | None, Parameter(name="--affinity")] = None,
    prefix_chars: Annotated[int | None, Parameter(name="--prefix-chars")] = None,
    schedule: Annotated[list[str] | None, Parameter(name="--schedule", negative_iterable="")] = None,
    from_mirror: Annotated[str | None, Parameter(name="--from-mirror")] = None,
    yes: Annotated[bool, Parameter(name="--yes", negative="", show_default=False)] = False,
    session: SessionParam,
) -> int:
    """Add a model, or replace the one of that name.

    Parameters
    ----------
    file
        TOML with [[models]] tables (like examples/catalog.toml), or one model table.
    min_
        Fewest replicas.
    max_
        Most replicas.
    gpus
        GPUs per replica, tensor-parallel across them (tp = gpus).
    cpu
        May run with no GPU.
    max_tokens
        Most max_tokens (or max_completion_tokens) one request may ask for; the gateway refuses more.
    max_n
        Most choices (n) one request may ask for.
    slots
        Requests each gateway sends one replica at once (limits.concurrency_per_replica; default: the setting
        gateway.upstream_connections_per_replica); set it to the engine's parallel slots (llama.cpp --parallel,
        vLLM --max-num-seqs) so the gateway queues the rest by priority class and key.
    connect_timeout
        Seconds the gateway waits to connect to a replica (default: the gateway's upstream_connect_s).
    first_byte_timeout
        Seconds the gateway waits for an answer to start; past it, 504 upstream_timeout (default: upstream_first_byte_s).
    chunk_timeout
        Seconds of silence allowed in the middle of an answer (default: upstream_chunk_s).
    arg
        An extra engine argument; repeat for more (--arg=--ctx-size --arg=4096).
    fallback
        A defined model of the same role that serves this one's requests when it refuses them at once (parked,
        unplaceable, overloaded); repeat for more, tried in order.
    alias
        Another public name for this model; repeat for more. One alias on several models spreads its requests
        over them.
    affinity
        How gateways pick the replica (routing.affinity): prefix sends requests that start alike (system prompt
        and first turn) to the same replica so its engine reuses the prompt's cache; off, the least loaded one.
        Default: prefix for chat and guard models, off for embedding and rerank models.
    prefix_chars
        How many leading characters of a request prefix affinity reads (routing.prefix_chars, 1 to 1048576;
        default 4096).
    schedule
        A schedule rule: 'start=CRON; end=CRON; min=N; max=N' (or duration_s=SECONDS instead of end): from each
        time the start cron matches (minute hour day month weekday, in the setting cluster.time_zone) until the
        end, the model's replicas are between min and max (max 0: none). Repeat for more; where rules overlap,
        the one that began last rules. Outside every rule, --min and --max apply.
    from_mirror
        Make the definition from this mirror file's metadata (engine, role, a profile that fits, the memory
        estimate; source mirror://NAME), show it with where it would run, and store it once confirmed. --name
        (default: the file's name), --mode, --role, --engine, --min, --max, --gpus, --cpu and --arg change it. A
        Llama Guard file becomes the judge the guard policies ask for.
    yes
        With --from-mirror: store the definition without asking.
    """
    timeouts = {"connect_s": connect_timeout, "first_byte_s": first_byte_timeout, "chunk_s": chunk_timeout}
    if from_mirror is not None:
        others = [f for f, v in (("--file", file), ("--source", flags.source), ("--base", flags.base),
                                 ("--max-tokens", max_tokens), ("--max-n", max_n), ("--slots", slots),
                                 ("--fallback", fallback), ("--alias", alias), ("--affinity", affinity),
                                 ("--prefix-chars", prefix_chars), ("--schedule", schedule)) if v is not None]
        others += [f"--{k.replace('_s', '')}-timeout".replace("_", "-") for k, v in timeouts.items() if v is not None]
        if others:
            raise UsageError("model serve --from-mirror takes --name, --mode, --role, --engine, --min, --max, "
                             f"--gpus, --cpu and --arg, not {others[0]}")
        return serve_from_mirror(session, from_mirror, mirror_body(flags, min_, max_, gpus, cpu, arg), yes)
    if yes:
        raise UsageError("--yes goes with --from-mirror")
    flags_given = bool(flags.given()) or cpu or any(
        v is not None for v in (min_, max_, gpus, arg, max_tokens, max_n, fallback, alias, slots,
                                affinity, prefix_chars, schedule, *timeouts.values()))
    if file is not None:
        if flags_given:
            raise UsageError("model serve takes --file FILE or the model flags, not both")
        definitions, catalog = definitions_from_file(file)
    else:
        catalog = False
        definitions = [definition_from_flags(flags, min_=min_, max_=max_, gpus=gpus, cpu=cpu, args=arg,
                                             max_tokens=max_tokens, max_n=max_n, timeouts=timeouts,
                                             fallbacks=fallback, aliases=alias, slots=slots,
                                             affinity=affinity, prefix_chars=prefix_chars, schedules=schedule)]
    answers: list[Any] = []
    failed = 0
    for definition in definitions:
        label = cell(definition.get("name"))
        try:
            code, doc = session.request("POST", api_path("models"), body=definition, send_body=True)
        except Refused as e:
            if len(definitions) == 1:
                raise
            failed += 1  # the others may still be fine; a transport error stops them all
            session.note(f"error: {label}: {e.message}")
            continue
        answers.append(doc)
        if not session.as_json:
            verb = "created" if code == 201 else "replaced" if code == 200 else f"sent (status {code})"
            session.out(f"{verb} model {cell(dig(doc, 'model', 'name') or label)}")
    if session.as_json:
        session.print_json(answers if catalog else answers[0])
    if failed:
        raise CtlError(f"{failed} of {len(definitions)} models were not served")
    return EXIT_OK


@model_app.command(name="remove")
def model_remove(name: ModelName, /, *, session: SessionParam) -> int:
    """Remove a model; its replicas are stopped."""
    return session.show_answer("DELETE", api_path("models", name),
                               render=lambda d: f"removed model {cell(dig(d, 'removed') or name)}")


@model_app.command(name="retry")
def model_retry(name: ModelName, /, *, session: SessionParam) -> int:
    """Un-park a model so that it is placed again."""
    return session.show_answer(
        "POST", api_path("models", name, "retry"),
        render=lambda d: f"retrying model {cell(dig(d, 'retried') or name)}: its failure count is cleared")
