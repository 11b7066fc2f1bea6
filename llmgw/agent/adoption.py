"""Engines that outlive their agent: one state record per replica in the agent's state dir (pid,
process start time, url, launch hash), written atomically, and the process checks behind adoption.

A replica id comes from the control plane and never becomes a path as it is: ids are checked
against a strict pattern (a refusal says why) and files are named by `file_stem`, a cleaned prefix
and a hash of the id. A pid alone is not an identity (pids are reused): a record matches a live
process only when the start time in /proc/<pid>/stat (field 22) is the one recorded.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import signal
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import trio

from llmgw.domain.model import DefinitionError, ModelDef
from llmgw.diskfiles import fsync_dir

log = logging.getLogger("llmgw.agent.supervisor")

RECORD_VERSION = 1
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,199}")  # a model name (see domain/model.py) + "-rN"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_PROC = Path("/proc")
_OWN_SUFFIXES = (".json.tmp", ".log.1", ".log")  # the files of the engines directory besides records


def replica_id_problem(replica_id: str) -> str:
    """Why `replica_id` is refused here, or "" when it is fine."""
    if _ID.fullmatch(replica_id):
        return ""
    shown = replica_id if len(replica_id) <= 80 else replica_id[:80] + "…"
    return (f"replica id {shown!r} refused: an id is 1 to 200 letters, digits, '.', '_', ':' or '-', "
            "starting with a letter or digit")


def file_stem(replica_id: str) -> str:
    """The name of a replica's files in the engines directory: readable, and never a path."""
    digest = hashlib.sha256(replica_id.encode()).hexdigest()[:12]
    prefix = _UNSAFE.sub("_", replica_id)[:48].lstrip(".")
    return f"{prefix}.{digest}" if prefix else digest


def launch_hash(model_launch: str, name: str, devices: Sequence[int], group: Any) -> str:
    """What a running engine was started from, as the control plane asked: the model's own launch
    hash, its name, the GPUs and the group. Neither the port nor the agent's own program is in it,
    so an upgraded agent adopts its engines instead of restarting them."""
    blob = json.dumps({"model": model_launch, "name": name, "gpus": list(devices),
                       "group": None if group is None else repr(group)}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


class StartRefused(Exception):
    """A start that cannot be done as asked; reported as a failed replica of `model` ("?" unknown)."""

    def __init__(self, model: str, error: str) -> None:
        super().__init__(error)
        self.model = model
        self.error = error


def read_start(replica_id: str, model_doc: Any, gpus: Sequence[int], group: Any) -> tuple[ModelDef, str]:
    """A start as control sent it, checked: (the model, its launch hash). Raises `StartRefused`
    for an id that must not name a file, or a definition that is not one. Every `ReplicaRunner`
    (the supervisor, sim-fleet's) reads its starts here."""
    problem = replica_id_problem(replica_id)
    if problem:  # reported under the id control sent; the id never names a file
        raise StartRefused("?", problem)
    try:
        model = ModelDef.from_doc(model_doc)
    except DefinitionError as e:
        name = str(model_doc.get("name", "?")) if isinstance(model_doc, dict) else "?"
        raise StartRefused(name, f"bad model definition: {e}") from None
    return model, launch_hash(model.launch_hash(), model.name, gpus, group)


@dataclass(frozen=True)
class EngineRecord:
    replica_id: str
    model: str
    engine: str
    pid: int
    start_ticks: int  # /proc/<pid>/stat field 22: with the pid, the process's identity
    url: str
    probe: str  # how it is known to serve: "http" (GET `health` answers 200), "tcp" or "process"
    health: str  # the path of its HTTP health probe, e.g. /health; "" for the other probes
    launch: str  # launch_hash(...)
    started: float  # wall clock
    ready_since: float = 0.0  # wall clock; 0.0 while it has not served yet
    version: int = RECORD_VERSION
    # The mirror cache's file it runs from (agent/mirror_fetch.py), kept from eviction by the next agent too;
    # "" for none (and in a record written before the mirror).
    mirror_sha256: str = ""

    @classmethod
    def from_doc(cls, doc: Any) -> EngineRecord:
        if not isinstance(doc, dict) or doc.get("version") != RECORD_VERSION:
            raise ValueError("not an engine record of this version")
        number = (int, float)
        types: dict[str, type | tuple[type, ...]] = {
            "replica_id": str, "model": str, "engine": str, "pid": int, "start_ticks": int, "url": str, "probe": str,
            "health": str, "launch": str, "started": number, "ready_since": number, "version": int,
            "mirror_sha256": str}
        values: dict[str, Any] = {}
        for f in fields(cls):
            value = doc.get(f.name, "" if f.name == "mirror_sha256" else None)
            if isinstance(value, bool) or not isinstance(value, types[f.name]):
                raise ValueError(f"field {f.name} is missing or of the wrong type")
            values[f.name] = value
        if replica_id_problem(values["replica_id"]) or values["pid"] <= 1:
            raise ValueError("bad replica id or pid")
        if not values["url"].startswith("http://") or values["probe"] not in ("http", "tcp", "process") or (
                values["probe"] == "http" and not values["health"].startswith("/")):
            raise ValueError("bad url, probe or health path")
        return cls(**values)


class Records:
    """The engines directory: `<stem>.json` (the record), `<stem>.log` (+ `.log.1`) per replica."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory

    def record_path(self, replica_id: str) -> Path:
        return self.dir / f"{file_stem(replica_id)}.json"

    def log_path(self, replica_id: str) -> Path:
        return self.dir / f"{file_stem(replica_id)}.log"

    def write(self, record: EngineRecord) -> None:
        """Atomically: a reader (the next agent) sees the old record or the new one, never a piece."""
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.record_path(record.replica_id)
        tmp = path.with_name(path.name + ".tmp")
        with tmp.open("w") as f:
            json.dump(asdict(record), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(self.dir)

    def delete(self, replica_id: str) -> None:
        self.record_path(replica_id).unlink(missing_ok=True)

    def load(self) -> list[EngineRecord]:
        """Every readable record; an unreadable one is logged and deleted, and so is each file that
        belongs to no record (logs of replicas gone, a write cut short)."""
        if not self.dir.is_dir():
            return []
        records: list[EngineRecord] = []
        for path in sorted(self.dir.glob("*.json")):
            try:
                record = EngineRecord.from_doc(json.loads(path.read_text()))
                if path.stem != file_stem(record.replica_id):
                    raise ValueError(f"it names replica {record.replica_id!r}, whose record is not this file")
            except (OSError, ValueError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
                log.warning("engine record %s is unreadable (%s): deleted; its engine, if any, is not adopted",
                            path, e)
                path.unlink(missing_ok=True)
                continue
            records.append(record)
        kept = {file_stem(r.replica_id) for r in records}
        for path in self.dir.iterdir():
            suffix = next((s for s in _OWN_SUFFIXES if path.name.endswith(s)), None)
            if suffix is not None and path.is_file() and (
                    suffix == ".json.tmp" or path.name[:-len(suffix)] not in kept):
                path.unlink(missing_ok=True)
        return records


def start_ticks(pid: int, proc: Path = _PROC) -> int | None:
    """The start time of process `pid` (clock ticks since boot), or None when there is no such
    live process (a zombie counts as gone)."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except (OSError, ValueError):
        return None
    # The command name (field 2) may hold spaces and parentheses: fields start after the last ")".
    rest = stat.rpartition(")")[2].split()
    if len(rest) < 20 or rest[0] in ("Z", "X"):
        return None
    return int(rest[19])


def same_process(pid: int, ticks: int, proc: Path = _PROC) -> bool:
    return start_ticks(pid, proc) == ticks


class AdoptedProcess:
    """An engine started by an earlier agent: not our child, so its exit status is unknown and
    its end is seen through a pidfd (or, without one, by polling /proc)."""

    returncode: int | None = None  # never known: only a parent learns it

    def __init__(self, pid: int, ticks: int, poll_s: float) -> None:
        self.pid, self.ticks, self._poll_s = pid, ticks, poll_s

    def running(self) -> bool:
        return same_process(self.pid, self.ticks)

    async def wait(self) -> None:
        fd = _pidfd(self.pid)
        try:
            # The pidfd is checked against the start time after it is opened: a pid reused in between
            # fails the check, and the pidfd then watches the right process for good.
            if fd is not None and self.running():
                await trio.lowlevel.wait_readable(fd)
                return
            while self.running():
                await trio.sleep(self._poll_s)
        finally:
            if fd is not None:
                os.close(fd)

    def signal_group(self, sig: signal.Signals) -> None:
        """Signal the engine's process group (its own session: pgid = pid), if it is still ours."""
        if self.running():
            try:
                os.killpg(self.pid, sig)
            except ProcessLookupError:
                pass


def _pidfd(pid: int) -> int | None:
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    try:
        fd: int = opener(pid)
    except OSError:  # gone already, or a kernel without pidfd
        return None
    return fd
