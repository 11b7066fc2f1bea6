"""The reconciler's "no placement" warning under a MockClock: one line per model per
`placement.warn_interval_s` (at once when the reason changes), with the count of passes it kept quiet."""

from __future__ import annotations

import logging
import re

import pytest
import trio
import trio.testing

from llmgw.control.hub import AgentHub
from llmgw.control.reconciler import Reconciler
from llmgw.domain import commands
from llmgw.domain.model import ModelDef
from llmgw.domain.observed import Gpu, NodeInfo
from llmgw.testing import MemoryStore


@pytest.fixture
def clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


def gpu_model(name: str, gpus: int = 1) -> ModelDef:
    return ModelDef.from_doc({"name": name, "engine": "vllm", "source": f"hf://org/{name}", "profile": {"gpus": gpus, "tp": gpus}})


def lines(caplog: pytest.LogCaptureFixture, model: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"no placement for {model}:")]


async def test_one_line_per_model_per_interval_with_the_count_it_kept_quiet(
    clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="llmgw.control.reconciler")
    store, hub = MemoryStore(), AgentHub(trio.current_time)
    store.submit_nowait(commands.put_setting("placement.warn_interval_s", 60, 0.0))
    store.submit_nowait(commands.put_model(gpu_model("phi"), 0.0))
    store.submit_nowait(commands.put_model(gpu_model("big", 2), 0.0))
    send, _ = trio.open_memory_channel[dict[str, object]](100)
    link = hub.connect("n1", send)
    hub.report_inventory(link, NodeInfo("n1", cpus=4, engines=("vllm",)))
    rec = Reconciler(store, hub, clock=trio.current_time)
    passes = 0
    while trio.current_time() < 150:  # a pass a second, as the loop runs them
        await rec.run_once()
        passes += 1
        await trio.sleep(1)
    for model in ("phi", "big"):
        said = lines(caplog, model)
        assert len(said) == 3, said  # at 0 s, 60 s and 120 s: not one per pass
        assert "node has no GPU" in said[0] and "still" not in said[0]
        quiet = [int(m.group(1)) for s in said[1:] if (m := re.search(r"still; (\d+) more passes", s))]
        assert quiet == [59, 59], said
    assert passes == 150
    # A new reason is said at once, whatever the interval: a GPU node joins, still too small for
    # big (2 GPUs); phi fits there and is placed, so it says nothing more.
    gpu = NodeInfo("n2", cpus=4, engines=("vllm",), gpus=(Gpu(0, "GPU-0", "H100", "h100-80g", 80 << 30, 0),))
    hub.report_inventory(hub.connect("n2", send), gpu)
    await rec.run_once()
    assert len(lines(caplog, "phi")) == 3
    said = lines(caplog, "big")
    assert len(said) == 4 and "n2: " in said[-1] and "still" not in said[-1], said
