"""Which discovery path runs: `LLMGW_GPU_PROBE=nvml|nvidia-smi|auto` (auto: NVML, then
nvidia-smi, then none: a CPU-only node), and the one place `nvidia-smi` is run (with its timeout).

Each path's outcome is a `Discovery`: the facts it read, or why it read nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from llmgw.agent.gpus import facts as gpu_facts
from llmgw.agent.gpus.facts import MachineFacts
from llmgw.agent.gpus.smi import SmiOutputError, parse
from llmgw.domain.observed import Gpu
from llmgw.domain.timeouts import TIMEOUTS

PATHS = ("nvml", "nvidia-smi")
CHOICES = ("auto", *PATHS)
ENV = "LLMGW_GPU_PROBE"


@dataclass(frozen=True)
class Discovery:
    """One path's answer: `facts` None when it read nothing, `error` saying why."""

    path: str  # "nvml" | "nvidia-smi" | "none"
    facts: MachineFacts | None = None
    error: str = ""
    warnings: tuple[str, ...] = field(default=())  # about the path itself (fell back, missing tool)

    @property
    def gpus(self) -> tuple[Gpu, ...]:
        return gpu_facts.to_gpus(self.facts) if self.facts else ()

    @property
    def all_warnings(self) -> tuple[str, ...]:
        return (*self.warnings, *(gpu_facts.warnings(self.facts) if self.facts else ()))


# nvidia-smi as a function: argv -> stdout; raises OSError / subprocess errors. Tests pass a fake.
Runner = Callable[[list[str]], str]


def run_command(argv: list[str], timeout_s: float = TIMEOUTS.gpu_probe_command_s) -> str:
    """Run `argv` and return its stdout; a non-zero exit raises CalledProcessError with its words."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, argv, done.stdout, done.stderr)
    return done.stdout


def _said(e: subprocess.CalledProcessError) -> str:
    words = " ".join(str(e.stderr or e.stdout or "").split())[:300]
    return f"exit status {e.returncode}{': ' + words if words else ''}"


def by_nvml(api: Any = None) -> Discovery:
    """NVML's answer (`api` None: the real pynvml)."""
    try:
        from llmgw.agent.gpus import nvml
    except ImportError as e:  # nvidia-ml-py missing from this install
        return Discovery("nvml", error=f"nvidia-ml-py is not installed ({e})")
    if api is None:
        import pynvml
        api = pynvml
    try:
        return Discovery("nvml", facts=nvml.read(api))
    except nvml.NvmlUnavailable as e:
        return Discovery("nvml", error=str(e))


def by_smi(run: Runner | None = None, binary: str = "nvidia-smi") -> Discovery:
    """nvidia-smi's answer: `-L`, then `-q -x`; what `-L` says survives a `-q -x` that fails."""
    if run is None:
        path = shutil.which(binary)
        if path is None:
            return Discovery("nvidia-smi", error=f"{binary} is not on PATH")
        run = lambda argv: run_command([path, *argv[1:]])  # noqa: E731
    try:
        listing = run([binary, "-L"])
    except FileNotFoundError:
        return Discovery("nvidia-smi", error=f"{binary} is not on PATH")
    except subprocess.TimeoutExpired:
        return Discovery("nvidia-smi", error=f"{binary} -L did not answer within {TIMEOUTS.gpu_probe_command_s:g} s")
    except subprocess.CalledProcessError as e:
        return Discovery("nvidia-smi", error=f"{binary} -L failed ({_said(e)})")
    except OSError as e:
        return Discovery("nvidia-smi", error=f"{binary} -L could not run: {e}")
    query: str | None = None
    trouble: tuple[str, ...] = ()
    try:
        query = run([binary, "-q", "-x"])
    except subprocess.TimeoutExpired:
        trouble = (f"{binary} -q -x did not answer within {TIMEOUTS.gpu_probe_command_s:g} s; "
                   f"memory and health are unknown",)
    except subprocess.CalledProcessError as e:
        trouble = (f"{binary} -q -x failed ({_said(e)}); memory and health are unknown",)
    except OSError as e:
        trouble = (f"{binary} -q -x could not run ({e}); memory and health are unknown",)
    try:
        return Discovery("nvidia-smi", facts=parse(listing, query), warnings=trouble)
    except SmiOutputError as e:
        return Discovery("nvidia-smi", error=str(e))


def chosen(env: dict[str, str] | None = None) -> str:
    """The path LLMGW_GPU_PROBE names ("auto" when unset); ValueError for anything else."""
    value = (os.environ if env is None else env).get(ENV, "auto").strip().lower() or "auto"
    if value not in CHOICES:
        raise ValueError(f"{ENV}={value!r}: use one of {', '.join(CHOICES)}")
    return value


def discover(choice: str = "auto", *, nvml_api: Any = None, smi_run: Runner | None = None) -> Discovery:
    """The GPUs by the chosen path. Forced, a path that fails is a node without GPUs, with its
    error as a warning. Auto: NVML; when it cannot start, nvidia-smi; when neither answers, none
    (a CPU-only node: no warning unless nvidia-smi was there and failed)."""
    if choice == "nvml":
        d = by_nvml(nvml_api)
        return d if d.facts else Discovery("none", error=d.error, warnings=(f"GPU discovery by NVML failed: {d.error}",))
    if choice == "nvidia-smi":
        d = by_smi(smi_run)
        return d if d.facts else Discovery("none", error=d.error,
                                           warnings=(f"GPU discovery by nvidia-smi failed: {d.error}",))
    first = by_nvml(nvml_api)
    if first.facts:
        return first
    second = by_smi(smi_run)
    if second.facts:
        said = (f"NVML did not start ({first.error}) while nvidia-smi works: "
                f"a driver/library mismatch? GPUs were found with nvidia-smi")
        return Discovery("nvidia-smi", facts=second.facts, warnings=(said, *second.warnings))
    if "not on PATH" in second.error:
        return Discovery("none", error=f"{first.error}; {second.error}")  # no NVIDIA stack: a CPU node
    return Discovery("none", error=f"{first.error}; {second.error}",
                     warnings=(f"no GPU discovery worked: {first.error}; {second.error}",))
