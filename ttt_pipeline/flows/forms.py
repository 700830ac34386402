"""The Prefect UI form's help for the flows' `preset` parameter: the names of the presets this package ships.

Prefect shows each parameter's description from the flow function's docstring (its Args section); the preset names
there are filled in from the package's presets when the flow is defined, so a new preset is listed without an edit.
"""

from __future__ import annotations

from typing import Callable

from ttt_pipeline.config import preset_names

PLACEHOLDER = "PRESET_NAMES"


def name_presets(fn: Callable) -> Callable:
    """`fn` with PRESET_NAMES in its docstring replaced by the shipped presets' names (apply below `@flow`)."""
    fn.__doc__ = (fn.__doc__ or "").replace(PLACEHOLDER, ", ".join(preset_names()))
    return fn
