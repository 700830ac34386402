"""The presets shipped inside the package (the checkout's `configs/` links there): found without importing the
configuration schema, so `ttt-pipeline --help` lists them before torch loads."""

from __future__ import annotations

import importlib.resources
from pathlib import Path

PRESETS_DIR = Path(str(importlib.resources.files("ttt_pipeline").joinpath("presets")))


def preset_names() -> list[str]:
    """The presets by name (`--config NAME`, a deployment's `preset`)."""
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))
