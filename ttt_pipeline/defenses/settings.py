"""The base of a defense's own settings (no torch here: a text repair's settings load without it)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class DefenseSettings(BaseModel):
    """A defense's knobs, `ttt.<defense>.<knob>` in the config (defenses/registry.py collects them): unknown keys
    are errors and values are validated on assignment, as everywhere in the config."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
