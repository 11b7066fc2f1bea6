"""ctl's failures and exit codes: every failure is one `error: ...` line on stderr
and an exit code; nothing else in ctl decides how a failure looks.

    CtlError    exit 1: the API refused, or could not be reached or understood
    ├── UsageError  exit 2: the command line, or a file it names, is wrong
    └── Refused     exit 1: the API understood and said no (`code: message`)
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_API = 1  # the API refused, or could not be reached or understood
EXIT_USAGE = 2  # the command line (or a file it names) is wrong


class CtlError(Exception):
    """A failure to report as one `error: ...` line on stderr, with an exit code."""

    def __init__(self, message: str, exit_code: int = EXIT_API) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


class UsageError(CtlError):
    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_USAGE)


class Refused(CtlError):
    """The API understood the request and said no (`{"error": {"code", "message"}}`)."""
