"""Weights files checked from their headers alone: GGUF (`gguf.py`) and safetensors (`safetensors.py`).
Owns `WeightsError`, the one refusal both raise: its `reason` is the words the operator sees.

Standard library only, and no module here ever reads tensor data: a check
reads a bounded header and compares the sizes it promises with the file's.
"""

from __future__ import annotations

__all__ = ["WeightsError"]


class WeightsError(Exception):
    """Not usable weights, and why (`reason`: one line for the operator). `transient`: the
    file could not be read (permissions, a file that vanished), which says nothing about
    its content, so a scanner must not remember the verdict."""

    def __init__(self, reason: str, *, transient: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.transient = transient
