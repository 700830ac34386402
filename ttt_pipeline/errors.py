"""User-facing errors: one message that says what is wrong and one hint that says how to fix it."""

from __future__ import annotations

import re


class PipelineError(Exception):
    """An error the user can fix; the CLI prints it as two plain lines, without a traceback."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\nhint: {self.hint}"


class ConfigError(PipelineError):
    """Bad configuration: names the field and the fix."""


class DataError(PipelineError):
    """Bad or unreadable data: names the file (and row/column where known) and the fix."""


class DownloadError(PipelineError):
    """A remote source could not be fetched: names the source and the offline alternative."""


_USERINFO = re.compile(r"(://[^/@\s:]+):[^/@\s]+@")
_SECRET_QUERY = re.compile(r"([?&](?:password|passwd|pwd|token|access_token|secret|api_key|key|sig)=)[^&#\s]+",
                           re.IGNORECASE)


def redact(text: str) -> str:
    """`scheme://user:PASSWORD@host` and `?token=...` with the secret masked: for params, tags and messages."""
    return _SECRET_QUERY.sub(r"\1***", _USERINFO.sub(r"\1:***@", text))
