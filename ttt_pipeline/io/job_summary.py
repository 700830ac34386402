"""Where a CI job's markdown summary goes: GitHub Actions' $GITHUB_STEP_SUMMARY when set (appended, as every step
of a job appends to it), else a plain file, written whole and atomically."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from ttt_pipeline.storage import atomic_write_text

ENV_STEP_SUMMARY = "GITHUB_STEP_SUMMARY"


def write_job_summary(text: str, path: str | Path | None, environ: Mapping[str, str]) -> Path:
    """Write `text` to `path` when given, else to $GITHUB_STEP_SUMMARY; returns the file written."""
    if path is None and environ.get(ENV_STEP_SUMMARY):
        target = Path(environ[ENV_STEP_SUMMARY])
        with open(target, "a", encoding="utf-8") as out:
            out.write(text)
        return target
    target = Path(path or "gate-summary.md")
    atomic_write_text(target, text)
    return target
