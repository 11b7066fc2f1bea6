"""`llmgw doctor`: this machine's checks (GPUs by each discovery path, MIG, engines, state dir,
ports, clock), as text or one JSON document; exit 1 when a warning says something cannot run.

`examine()` does the work with its edges injectable (pynvml, nvidia-smi, paths), for tests.
"""

from __future__ import annotations

import fcntl
import inspect
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

from cyclopts import Parameter

from llmgw.agent.gpus.probe import Discovery, Runner, by_nvml, by_smi, chosen
from llmgw.domain.observed import Gpu

MIB = 1 << 20
# A wall clock before this (2024-01-01) has never been set: TLS, logs and leases go wrong.
_EARLIEST_PLAUSIBLE = 1704067200


def gpu_doc(g: Gpu, d: Discovery) -> dict[str, Any]:
    """One device as `--json` lists it."""
    card = None
    if d.facts is not None and g.index < len(d.facts.cards):
        card = d.facts.cards[g.index]
    return {"index": g.index, "label": g.label, "uuid": g.uuid, "name": g.name, "class": g.gpu_class,
            "memory_total_mib": g.memory_total // MIB if g.memory_total else None,
            "mig": {"current": card.mig_current, "pending": card.mig_pending} if card is not None else None,
            "parent_index": g.parent_index, "healthy": g.healthy, "placeable": g.placeable, "reason": g.reason,
            "utilization": g.utilization}


def _path_doc(d: Discovery) -> dict[str, Any]:
    return {"ok": d.facts is not None, "error": d.error, "driver": d.facts.driver if d.facts else None,
            "gpus": [gpu_doc(g, d) for g in d.gpus]}


def _same(a: Discovery, b: Discovery) -> bool:
    def key(d: Discovery) -> list[tuple[Any, ...]]:
        return [(g.index, g.uuid, g.gpu_class, g.healthy, g.placeable) for g in d.gpus]
    return key(a) == key(b)


def state_dir_doc(state_dir: Path) -> tuple[dict[str, Any], list[str]]:
    """Exists, writable, held by a running llmgw (a shared flock, dropped at once, tells)."""
    doc: dict[str, Any] = {"path": str(state_dir), "exists": state_dir.is_dir(), "writable": None, "locked_by": None}
    if not state_dir.is_dir():
        return doc, []  # made on first start
    try:
        with tempfile.NamedTemporaryFile(dir=state_dir, prefix=".doctor-"):
            doc["writable"] = True
    except OSError as e:
        doc["writable"] = False
        return doc, [f"state dir {state_dir} is not writable ({e.strerror or e}): nothing can start with it"]
    lock = state_dir / "lock"
    if lock.exists():
        fd = os.open(lock, os.O_RDONLY | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            doc["locked_by"] = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "a running process"
        finally:
            os.close(fd)  # a shared lock we took goes with the descriptor
    return doc, []


def ports_doc(host: str, ports: dict[str, int]) -> list[dict[str, Any]]:
    rows = []
    for what, port in ports.items():
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
                rows.append({"what": what, "host": host, "port": port, "free": True, "error": ""})
            except OSError as e:
                rows.append({"what": what, "host": host, "port": port, "free": False, "error": e.strerror or str(e)})
    return rows


def default_ports() -> dict[str, int]:
    """`llmgw up`'s defaults, read from its signature so the two cannot drift."""
    from llmgw.cli.up import up

    params = inspect.signature(up).parameters
    return {"gateway": int(params["gateway_port"].default), "admin": int(params["admin_port"].default)}


def clock_doc(now: float) -> tuple[dict[str, Any], list[str]]:
    doc = {"time": now, "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)), "monotonic": time.monotonic(),
           "checked_against_peer": False}
    if now < _EARLIEST_PLAUSIBLE:
        return doc, [f"the system clock reads {doc['utc']}: it was never set (enable NTP)"]
    return doc, []


def examine(*, env: dict[str, str] | None = None, nvml_api: Any = None, smi_run: Runner | None = None,
            state_dir: Path = Path(".llmgw"), host: str = "127.0.0.1", ports: dict[str, int] | None = None,
            engines: dict[str, str] | None = None, now: float | None = None) -> dict[str, Any]:
    """Every check, as the `--json` document."""
    warnings: list[str] = []
    notes: list[str] = []
    nv, sm = by_nvml(nvml_api), by_smi(smi_run)
    try:
        choice = chosen(env)
    except ValueError as e:
        warnings.append(f"{e}; using auto")
        choice = "auto"
    pick = {"nvml": nv, "nvidia-smi": sm}.get(choice) or (nv if nv.facts else sm)
    if pick.facts is None:
        path = "none"
        if choice != "auto":
            warnings.append(f"GPU discovery by {choice} (LLMGW_GPU_PROBE) failed: {pick.error}")
        elif "not on PATH" not in sm.error:
            warnings.append(f"no GPU discovery worked: {nv.error}; {sm.error}")
        else:
            notes.append("no NVIDIA driver or nvidia-smi here: a CPU-only node")
    else:
        path = pick.path
        warnings += pick.all_warnings
    if nv.facts and sm.facts and not _same(nv, sm):
        warnings.append("NVML and nvidia-smi disagree about the GPUs (see paths): a driver/library mismatch, "
                        "or a card changed between the two reads; run doctor again")
    elif sm.facts and not nv.facts:
        warnings.append(f"NVML does not work ({nv.error}) while nvidia-smi does: a driver/library version "
                        f"mismatch? (reboot after a driver upgrade, or reinstall nvidia-ml-py)")
    elif nv.facts and nv.facts.cards and not sm.facts:
        warnings.append(f"nvidia-smi does not work ({sm.error}) while NVML sees GPUs: the driver's tools are "
                        f"missing or broken (MIG instances are carved with nvidia-smi)")
    if engines is None:
        from llmgw.agent.inventory import engine_versions
        engines = engine_versions()
    if not engines:
        warnings.append("no engine can start on this node")
    sd, said = state_dir_doc(state_dir)
    warnings += said
    if sd["locked_by"]:
        notes.append(f"state dir {state_dir} is in use by {sd['locked_by']}")
    port_rows = ports_doc(host, default_ports() if ports is None else ports)
    notes += [f"the {r['what']} port {host}:{r['port']} is taken ({r['error']})" for r in port_rows if not r["free"]]
    clock, said = clock_doc(time.time() if now is None else now)
    warnings += said
    notes.append("the clock was not compared with any other machine")
    return {"gpus": [gpu_doc(g, pick) for g in pick.gpus], "warnings": warnings, "notes": notes, "probe": path,
            "paths": {"nvml": _path_doc(nv), "nvidia-smi": _path_doc(sm)}, "engines": engines,
            "state_dir": sd, "ports": port_rows, "clock": clock}


def render(doc: dict[str, Any]) -> str:
    lines = [f"GPUs (by {doc['probe']}):"]
    for g in doc["gpus"]:
        mig = g["mig"] or {}
        mode = "" if mig.get("current") is None else f" MIG {'on' if mig['current'] else 'off'}" + (
            f" (pending {'on' if mig['pending'] else 'off'})" if mig.get("pending") != mig.get("current") else "")
        state = "ok" if g["healthy"] and g["placeable"] else ("unhealthy" if not g["healthy"] else "not placeable")
        mem = f"{g['memory_total_mib']} MiB" if g["memory_total_mib"] else "memory unknown"
        lines.append(f"  {g['label']:<7} {g['class']:<24} {mem:<12} {state}{mode}  {g['uuid']}"
                     + (f"\n          {g['reason']}" if g["reason"] else ""))
    if not doc["gpus"]:
        lines.append("  none")
    for name, p in doc["paths"].items():
        lines.append(f"{name}: " + (f"driver {p['driver']}, {len(p['gpus'])} device(s)" if p["ok"] else p["error"]))
    lines.append("engines: " + (", ".join(f"{e} {v or '(version unknown)'}" for e, v in doc["engines"].items()) or "none"))
    sd = doc["state_dir"]
    lines.append(f"state dir: {sd['path']} " + ("(not made yet)" if not sd["exists"] else
                 f"writable={sd['writable']}" + (f", in use by {sd['locked_by']}" if sd["locked_by"] else "")))
    lines += [f"port {r['what']} {r['host']}:{r['port']}: " + ("free" if r["free"] else f"taken ({r['error']})")
              for r in doc["ports"]]
    lines.append(f"clock: {doc['clock']['utc']} (not compared with any other machine)")
    lines += [f"warning: {w}" for w in doc["warnings"]] + [f"note: {n}" for n in doc["notes"]]
    return "\n".join(lines)


def doctor(*, as_json: Annotated[bool, Parameter(name="--json")] = False, state_dir: Path = Path(".llmgw"),
           host: str = "127.0.0.1") -> None:
    """Check this machine (its help text is at its registration in llmgw/cli/__init__.py).

    Parameters
    ----------
    as_json
        Print one JSON document instead of text.
    state_dir
        The state directory to check (writable, in use).
    host
        The address whose default ports (gateway, admin) are checked.
    """
    doc = examine(state_dir=state_dir, host=host)
    print(json.dumps(doc, indent=2) if as_json else render(doc))
    sys.exit(1 if doc["warnings"] else 0)
