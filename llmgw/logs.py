"""One log format for every role: readable text by default, JSON lines on request.

Each line names its role (a context variable set by each role's root task) and,
in the gateway, the request id. Never log a prompt, a completion or a key.

Lines are formatted and written by a thread, off the event loop: a request pays for a queued record,
not for a write, and a stderr pipe nobody reads (or a slow disk) never stalls serving. The queue holds
`QUEUE_RECORDS`; past that, records are dropped and counted, and the next line written says how many.
"""

from __future__ import annotations

import atexit
import contextvars
import json
import logging
import logging.handlers
import sys
import threading
import time
from collections import deque
from pathlib import Path

from llmgw.domain.timeouts import TIMEOUTS

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


QUEUE_RECORDS = 10_000


class _Queued(logging.Handler):
    """The root logger's one handler: stamps the caller's context on a record and appends it to a deque
    (no lock, no wake-up); a writer thread drains it every `log_write_interval_s`, in batches, so a
    busy loop pays neither a write nor a thread switch per line. A full deque drops and counts."""

    def __init__(self, handlers: list[logging.Handler]) -> None:
        super().__init__()
        self.handlers = handlers
        self.records: deque[logging.LogRecord] = deque()
        self.dropped = 0
        self._wake = threading.Event()  # flush or close: write now
        self._written = threading.Condition()
        self._closing = False
        self.addFilter(_ContextFilter())  # here, on the caller's thread: the context variables are its
        self._thread = threading.Thread(target=self._write, name="llmgw-log", daemon=True)
        self._thread.start()

    def emit(self, record: logging.LogRecord) -> None:
        if len(self.records) >= QUEUE_RECORDS:
            self.dropped += 1
        else:
            self.records.append(record)

    def _write(self) -> None:
        while True:
            self._wake.wait(TIMEOUTS.log_write_interval_s)
            self._wake.clear()
            while self.records:
                if self.dropped:
                    dropped, self.dropped = self.dropped, 0
                    self._each(logging.makeLogRecord({
                        "name": "llmgw.logs", "levelno": logging.WARNING, "levelname": "WARNING",
                        "role": self.records[0].__dict__.get("role", "-"),
                        "msg": f"{dropped} log lines dropped: the log could not keep up"}))
                self._each(self.records.popleft())
            with self._written:
                self._written.notify_all()
            if self._closing:
                return

    def _each(self, record: logging.LogRecord) -> None:
        for handler in self.handlers:
            if record.levelno >= handler.level:
                handler.handle(record)

    def flush(self) -> None:
        """Return once every record appended so far is written (at most a few seconds)."""
        with self._written:
            while self.records and self._thread.is_alive():
                self._wake.set()
                self._written.wait(1.0)
        for handler in self.handlers:
            handler.flush()

    def close(self) -> None:
        """Write what is queued, then stop the thread (at most a few seconds)."""
        if self._thread.is_alive():
            self._closing = True
            self._wake.set()
            self._thread.join(TIMEOUTS.log_write_interval_s * 100)
        for handler in self.handlers:
            handler.close()
        super().close()


def flush() -> None:
    """Wait until every line logged so far is written (tests, and before reading one's own log)."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, _Queued):
            handler.flush()


def setup(*, json_lines: bool = False, level: str = "INFO", log_file: Path | None = None) -> None:
    """Configure the root logger once per process (stderr, plus a rotating file if given), written by a thread."""
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
    queued = _Queued(handlers)
    root.addHandler(queued)
    atexit.register(queued.close)  # a clean exit writes every queued line
    root.setLevel(level.upper())
    # Libraries that log per request would drown the operator's view.
    for noisy in ("httpx", "httpcore", "hypercorn.access", "quart.serving", "trio-websocket"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
