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


class NoChampion(PipelineError):
    """No model version holds the alias the nightly check follows: there is nothing to re-evaluate."""


class DownloadError(PipelineError):
    """A remote source could not be fetched: names the source and the offline alternative."""


_USERINFO = re.compile(r"(://[^/@\s:]+):[^/@\s]+@")
_SECRET_QUERY = re.compile(r"([?&](?:password|passwd|pwd|token|access_token|secret|api_key|key|sig)=)[^&#\s]+",
                           re.IGNORECASE)


def redact(text: str) -> str:
    """`scheme://user:PASSWORD@host` and `?token=...` with the secret masked: for params, tags and messages."""
    return _SECRET_QUERY.sub(r"\1***", _USERINFO.sub(r"\1:***@", text))


# The optional extras (pyproject.toml): extra -> (the package pip installs, the module it provides).
EXTRAS = {"attribution": ("traker", "trak"), "gdrive": ("gdown", "gdown"), "external": ("nlpaug", "nlpaug")}


def extra_installed(extra: str) -> bool:
    """Whether the extra's module can be imported (found without importing it)."""
    import importlib.util

    try:
        return importlib.util.find_spec(EXTRAS[extra][1]) is not None
    except (ImportError, ValueError):
        return False


def extra_hint(extra: str) -> str:
    return f"pip install 'ttt-pipeline[{extra}]' (from a checkout, `make setup` installs it)"


def require_extra(extra: str, needed_by: str, instead: str | None = None):
    """The extra's module, imported; when it is not installed, a ConfigError that names what needs it (`needed_by`,
    a field or a command) and the install line, with `instead`, a way to do without it, when there is one. An
    ImportError from inside an installed package (a broken dependency of its own) is raised as it is."""
    import importlib

    package, module = EXTRAS[extra]
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if exc.name not in (None, module):
            raise
        hint = extra_hint(extra) + (f", or {instead}" if instead else "")
        raise ConfigError(f"{needed_by} needs the optional package {package}, which is not installed",
                          hint) from None
