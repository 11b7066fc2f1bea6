"""The `mirror` commands (docs/mirror.md): add a model file to the cluster's mirror (a resumable upload to the
leader, with a progress bar on stderr), list the files (per control plane: which hold each, which lack it), show
one, remove one (refused while a model, adapter or judge uses it), pin one.

An upload's id is the server's from the file's name, size and sha256: `ctl mirror add FILE` run again after an
interruption (a lost link, a Ctrl-C) asks the offset the upload reached and continues from there; nothing is kept
beside ctl's configuration. Each request carries one piece (`--piece-mib`), so a cut costs at most one piece.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, TextIO

import cyclopts
import httpx
from cyclopts import Parameter

from llmgw.cli.ctl.errors import EXIT_OK, CtlError, UsageError
from llmgw.cli.ctl.render import cell, dig, table
from llmgw.cli.ctl.session import Session, SessionParam, api_path
from llmgw.domain.timeouts import TIMEOUTS
from llmgw.diskfiles import sha256_of as file_sha256

MIB = 1 << 20
READ = 1 << 20
RETRIES = 5  # a piece cut this many times in a row stops the run (run it again to go on)
_SUFFIXES = (".gguf", ".safetensors")


def register(app: cyclopts.App) -> None:
    app.command(mirror_app)


mirror_app = cyclopts.App(name="mirror", help="The model mirror: model files kept by the control planes "
                                                "(add, list, show, remove, pin).")


class Bar:
    """A progress bar on stderr: bytes, %, rate; one line redrawn (`\\r`) at most every `every` seconds."""

    def __init__(self, out: TextIO, total: int, label: str, *, clock: Callable[[], float] = time.monotonic,
                 every: float = 0.2, start: int = 0) -> None:
        self.out, self.total, self.label, self.clock, self.every = out, total, label, clock, every
        self.start, self.done = start, start
        self.began = clock()
        self.drawn = -1.0

    def update(self, done: int, *, force: bool = False) -> None:
        self.done = done
        now = self.clock()
        if force or now - self.drawn >= self.every:
            self.drawn = now
            self.out.write("\r" + progress_line(self.label, done, self.total, (done - self.start) /
                                                max(now - self.began, 1e-6)))
            self.out.flush()

    def finish(self) -> None:
        self.update(self.done, force=True)
        self.out.write("\n")
        self.out.flush()


def progress_line(label: str, done: int, total: int, rate: float, width: int = 24) -> str:
    """`label [#####-----]  42%  12.0/28.6 MiB  85.1 MiB/s`: a pure function of the numbers."""
    share = done / total if total else 1.0
    filled = min(width, int(width * share))
    return (f"{label} [{'#' * filled}{'-' * (width - filled)}] {100 * share:3.0f}%  "
            f"{done / MIB:.1f}/{total / MIB:.1f} MiB  {rate / MIB:.1f} MiB/s")


def default_name(file: Path) -> str:
    """A file's mirror name when none is given: its name without `.gguf` / `.safetensors`."""
    name = file.name
    for suffix in _SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def sha256_of(file: Path, bar: Bar | None) -> str:
    sha = file_sha256(file, bar.update if bar is not None else None)
    if bar is not None:
        bar.finish()
    return sha


@mirror_app.command(name="add")
def mirror_add(
    file: Annotated[Path, Parameter(help="The model file to add: a GGUF or a safetensors file.")], /, *,
    name: Annotated[str | None, Parameter(help="Its name in the mirror (a model's source is mirror://NAME); "
                                               "default: the file's name without .gguf / .safetensors.")] = None,
    piece_mib: Annotated[int, Parameter(help="How many MiB each request carries (an interruption costs at most "
                                             "one piece).")] = 64,
    session: SessionParam,
) -> int:
    """Upload a model file to the mirror, with a progress bar; run it again after an interruption and it continues
    where the upload stopped. The leader hashes and validates the file before it is kept (a refused file is
    deleted, with the reason); the standbys then pull it."""
    if file.is_dir():
        raise UsageError(f"{file} is a directory: add a checkpoint's files one by one (a GGUF, or each .safetensors "
                         "shard); whole directories are not supported yet")
    if not file.is_file():
        raise UsageError(f"{file}: no such file")
    if not 1 <= piece_mib <= 1024:
        raise UsageError("--piece-mib must be from 1 to 1024")
    size = file.stat().st_size
    label = name or default_name(file)
    quiet = session.as_json
    sha = sha256_of(file, None if quiet else Bar(session.stderr, size, "hashing  "))
    _, started = session.request("POST", api_path("mirror", "uploads"),
                                 body={"name": label, "size": size, "sha256": sha}, send_body=True)
    uid, offset = str(started["id"]), int(started["offset"])
    if offset and not quiet:
        session.note(f"resuming the upload of {label} at {offset / MIB:.1f} MiB of {size / MIB:.1f} MiB")
    bar = None if quiet else Bar(session.stderr, size, "uploading", start=offset)
    offset = _send(session, file, uid, offset, size, piece_mib * MIB, bar)
    if bar is not None:
        bar.finish()
    _, done = session.request("POST", api_path("mirror", "uploads", uid, "commit"), timeout=TIMEOUTS.mirror_commit_s)
    session.show(done, render_added)
    return EXIT_OK


def _send(session: Session, file: Path, uid: str, offset: int, size: int, piece: int, bar: Bar | None) -> int:
    """Send the file from `offset`, a piece per request; after a cut, ask the offset the upload holds and go on."""
    client = session.client()
    path = api_path("mirror", "uploads", uid)
    failures = 0
    while offset < size:
        end = min(offset + piece, size)
        try:
            response = client.put(path, content=_read(file, offset, end, bar), headers={
                "Content-Type": "application/octet-stream", "Content-Range": f"bytes {offset}-{end - 1}/{size}"})
        except httpx.TransportError as e:
            failures += 1
            if failures > RETRIES:
                raise CtlError(f"the upload was cut {failures} times in a row ({e or type(e).__name__}); run the same "
                               "command again to continue where it stopped") from e
            offset = int(session.request("GET", path)[1]["offset"])
            continue
        doc = _json(response)
        error = doc.get("error") if isinstance(doc, dict) else None
        if response.status_code == 409 and isinstance(error, dict) and isinstance(error.get("offset"), int):
            offset = error["offset"]  # the upload holds another offset: continue there
            continue
        if not 200 <= response.status_code < 300:
            raise CtlError(f"{cell(dig(doc, 'error', 'code'))}: {cell(dig(doc, 'error', 'message'))}")
        offset = int(doc["offset"])
        failures = 0
    return offset


def _read(file: Path, start: int, end: int, bar: Bar | None) -> Iterator[bytes]:
    with file.open("rb") as f:
        f.seek(start)
        at = start
        while at < end:
            data = f.read(min(READ, end - at))
            if not data:
                raise CtlError(f"{file} became shorter while it was uploaded")
            at += len(data)
            yield data
            if bar is not None:
                bar.update(at)


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return {"error": {"code": f"http_{response.status_code}", "message": response.text[:200]}}


@mirror_app.command(name="list")
def mirror_list(*, session: SessionParam) -> int:
    """Every file of the mirror: name, kind, size, sha256, what uses it, pinned, and the control planes that lack
    it; the budget."""
    return session.show_answer("GET", api_path("mirror"), render=render_list)


mirror_app.default(mirror_list)


@mirror_app.command(name="show")
def mirror_show(name: Annotated[str, Parameter(help="The file's name in the mirror.")], /, *,
                session: SessionParam) -> int:
    """One file: its header facts, what uses it, and which control planes hold it."""
    return session.show_answer("GET", api_path("mirror", name), render=lambda d: render_file(dig(d, "file")))


@mirror_app.command(name="remove")
def mirror_remove(name: Annotated[str, Parameter(help="The file's name in the mirror.")], /, *,
                  session: SessionParam) -> int:
    """Remove a file; refused while a model, a LoRA adapter or a judge uses it (the refusal names them). Its blob
    is deleted from every control plane once no name refers to it."""
    return session.show_answer("DELETE", api_path("mirror", name),
                               render=lambda d: f"removed {cell(dig(d, 'removed'))}")


@mirror_app.command(name="pin")
def mirror_pin(name: Annotated[str, Parameter(help="The file's name in the mirror.")], /, *,
               off: Annotated[bool, Parameter(negative="", help="Unpin it instead.")] = False,
               session: SessionParam) -> int:
    """Pin a file: it is kept whether or not anything uses it (or, with --off, no longer)."""
    return session.show_answer("POST", api_path("mirror", name, "pin"), body={"pinned": not off}, send_body=True,
                               render=lambda d: f"{cell(dig(d, 'name'))}: "
                                                f"{'pinned' if dig(d, 'pinned') else 'unpinned'}")


# --- rendering: pure functions of the JSON ---------------------------------------------------------


def size_words(n: Any) -> str:
    if not isinstance(n, int):
        return "-"
    for unit, scale in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def render_list(doc: Mapping[str, Any]) -> str:
    files = dig(doc, "files")
    lines = []
    if isinstance(files, list) and files:
        rows = [[f.get("name"), f.get("kind"), size_words(f.get("size")), str(f.get("sha256", ""))[:12],
                 ", ".join(f.get("used_by") or []) or "-", "yes" if f.get("pinned") else "no",
                 ", ".join(dig(f, "members", "missing") or []) or "-"]
                for f in files if isinstance(f, Mapping)]
        lines.append(table(["NAME", "KIND", "SIZE", "SHA256", "USED BY", "PINNED", "MISSING ON"], rows))
    else:
        lines.append("no files in the mirror (add one: `llmgw ctl mirror add FILE`)")
    uploads = dig(doc, "uploads")
    for u in uploads if isinstance(uploads, list) else []:
        if isinstance(u, Mapping):
            lines.append(f"upload in progress: {cell(u.get('name'))} {size_words(u.get('offset'))} of "
                         f"{size_words(u.get('size'))} (`llmgw ctl mirror add` the same file to continue)")
    lines.append(f"stored {size_words(dig(doc, 'stored_bytes'))} of a {size_words(dig(doc, 'budget_bytes'))} budget "
                 "(mirror.budget_gib)")
    return "\n".join(lines)


def render_file(f: Any) -> str:
    if not isinstance(f, Mapping):
        return "-"
    found = f.get("metadata")
    meta: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    lines = [f"name      {cell(f.get('name'))}", f"kind      {cell(f.get('kind'))}",
             f"size      {size_words(f.get('size'))} ({cell(f.get('size'))} bytes)", f"sha256    {cell(f.get('sha256'))}",
             f"pinned    {'yes' if f.get('pinned') else 'no'}",
             f"used by   {', '.join(f.get('used_by') or []) or '-'}",
             f"held by   {', '.join(dig(f, 'members', 'holding') or []) or '-'}",
             f"missing   {', '.join(dig(f, 'members', 'missing') or []) or '-'}"]
    lines += [f"{k:<9} {cell(v)}" for k, v in sorted(meta.items())]
    lines.append(f"serve it  llmgw ctl model serve --from-mirror {cell(f.get('name'))}"
                 + (" (a judge: the one the guard policies ask for)" if meta.get("llama_guard") else ""))
    return "\n".join(lines)


def render_added(doc: Mapping[str, Any]) -> str:
    f = dig(doc, "file")
    head = "added" if dig(doc, "added") else "already in the mirror:"
    return f"{head} {cell(dig(f, 'name'))} ({cell(dig(f, 'kind'))}, {size_words(dig(f, 'size'))}, sha256 " \
           f"{str(dig(f, 'sha256'))[:12]}); serve it with source mirror://{cell(dig(f, 'name'))}"
