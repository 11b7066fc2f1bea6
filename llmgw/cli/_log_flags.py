"""The log flags of every long-running command (`--log-json`, `--log-level`), declared once."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cyclopts import Parameter


@Parameter(name="*")  # flattened: `--log-json` and `--log-level` on the command that takes it
@dataclass(frozen=True)
class LogFlags:
    """How this process logs. A command that wants another default declares a subclass with
    that field again (simfleet/command.py: `FleetLogFlags`), so `--help` shows it."""

    log_json: bool = False
    """One JSON object per log line instead of text."""
    log_level: str = "info"
    """debug, info, warning or error."""

    def setup(self, log_file: Path | None = None) -> None:
        """Configure this process's logging as the flags say: stderr, plus `log_file` if given."""
        from llmgw import logs

        logs.setup(json_lines=self.log_json, level=self.log_level, log_file=log_file)
