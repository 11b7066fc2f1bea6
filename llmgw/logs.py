"""One log format for every role: readable text by default, JSON lines on request.

Each line names its role (a context variable set by each role's root task) and,
in the gateway, the request id. Never log a prompt, a completion or a key.
"""

from __future__ import annotations

import contextvars
import json
import logging
import logging.handlers
import sys
import time
from pathlib import Path

role_var: contextvars.ContextVar[str] = contextvars.ContextVar("llmgw_role", default="-")
request_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("llmgw_request_id", default="")


class _ContextFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "role"):
            record.role = role_var.get()
        if not hasattr(record, "request_id"):
            record.request_id = request_id_var.get()
        return True


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        request_id = getattr(record, "request_id", "")
        rid = f" [{request_id}]" if request_id else ""
        line = f"{ts}.{int(record.msecs):03d}Z {record.levelname:<7} {getattr(record, 'role', '-')}{rid} {record.name}: {record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "role": getattr(record, "role", "-"),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        rid = getattr(record, "request_id", "")
        if rid:
            doc["request_id"] = rid
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, separators=(",", ":"))


def setup(*, json_lines: bool = False, level: str = "INFO", log_file: Path | None = None) -> None:
    """Configure the root logger once per process (stderr, plus a rotating file if given)."""
    formatter: logging.Formatter = JsonFormatter() if json_lines else TextFormatter()
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
        h.close()
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.handlers.RotatingFileHandler(log_file, maxBytes=10 << 20, backupCount=3))
    for h in handlers:
        h.setFormatter(formatter)
        h.addFilter(_ContextFilter())
        root.addHandler(h)
    root.setLevel(level.upper())
    # Libraries that log per request would drown the operator's view.
    for noisy in ("httpx", "httpcore", "hypercorn.access", "quart.serving", "trio-websocket"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
