"""The header facts of model sources this control plane can open where it runs: a `pkg://` file (the
shipped SmolLM2), a local path (a GGUF file, a safetensors model directory). They give a memory estimate
(llmgw/domain/memory.py) to weights that no node's storage report names, as under `llmgw up`, where the
control plane and the agent share a machine.

Read by the leader, in a worker thread, when the models change and every `source_facts_refresh_s`
(a file read before and unchanged is not read again); the facts go to the reconciler and every view
through `Observed.sources`. A source that cannot be opened here is simply absent: the estimate then
stays what the agents' reports make it (or unknown).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from typing import Any, Callable

import trio

from llmgw.agent.storage import StorageScanner
from llmgw.domain.model import ModelDef
from llmgw.domain.timeouts import TIMEOUTS, Timeouts
from llmgw.engines.base import EngineError
from llmgw.engines.sources import package_file
from llmgw.interfaces import StateReader

log = logging.getLogger(__name__)


def wanted(models: Iterable[ModelDef]) -> list[str]:
    """The sources whose facts an estimate could use: a `pkg://` or absolute path of a model with weights
    and no `profile.memory_gib` (which is taken as said)."""
    return sorted({m.source for m in models if m.engine != "sim" and m.profile.memory_gib <= 0
                   and (m.source.startswith("pkg://") or m.source.startswith("/"))})


def read(sources: Iterable[str], scanner: StorageScanner) -> dict[str, dict[str, Any]]:
    """Source -> its storage-report entry (`kind`, `size`, `tensor_bytes`, head counts...), for those that
    open here. Blocking: run it in a thread."""
    paths: dict[str, str] = {}
    for source in sources:
        try:
            path = package_file(source) if source.startswith("pkg://") else os.path.normpath(source)
        except EngineError:
            continue  # the package is not installed here
        paths[source] = path
    found = scanner.describe(sorted(set(paths.values())))
    return {source: found[path] for source, path in paths.items() if path in found}


class SourceFacts:
    """Keeps `sink` (the hub's `sources`) up to date with `read` of the state's models' sources."""

    def __init__(self, store: StateReader, sink: Callable[[dict[str, dict[str, Any]]], None],
                 timeouts: Timeouts = TIMEOUTS) -> None:
        self.store = store
        self.sink = sink
        self.timeouts = timeouts
        self.scanner = StorageScanner(())

    async def refresh(self) -> None:
        sources = wanted(self.store.snapshot().models.values())
        facts = await trio.to_thread.run_sync(read, sources, self.scanner) if sources else {}
        self.sink(facts)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            revision = self.store.snapshot().revision
            try:
                await self.refresh()
            except Exception:  # a bug costs the estimate, never the control plane
                log.exception("reading the models' sources failed")
            with trio.move_on_after(self.timeouts.source_facts_refresh_s):
                await self.store.wait_changed(revision)
