"""Where a saved classifier's files are: read without importing torch (the CLI and `Classifier` look first)."""

from __future__ import annotations

from pathlib import Path


def is_model_folder(folder: Path) -> bool:
    """A saved classifier: meta.json beside the pipeline's own head (head.safetensors) or beside a classifier
    brought with `evaluate --model` (classifier/config.json)."""
    return (folder / "meta.json").is_file() and ((folder / "head.safetensors").is_file()
                                                 or (folder / "classifier" / "config.json").is_file())


def model_folder(path: Path) -> Path | None:
    """The saved classifier at `path` or in its `model/` (a store entry)."""
    for cand in (path, path / "model"):
        if is_model_folder(cand):
            return cand
    return None
