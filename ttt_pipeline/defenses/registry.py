"""Method names -> what runs: zero or more text repairs, then one model engine.

A method is `repair+...+engine` (`spell+masked_ttt`), a lone repair (`spell`: then plain prediction) or a lone
engine (`masked_ttt`). Adding a defense is one module with a `build` function plus one line in ENGINES or
REPAIRS (docs/architecture.md walks through it).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Entry:
    """A defense: the module that holds it (under ttt_pipeline.defenses, or a full dotted path) and whether its
    result depends on the mask seed (then it is scored once per `ttt.mask_seeds` entry)."""

    module: str | None
    masked: bool = False


# Model engines: each module has build(model, tokenizer, settings) -> an object with .predict(input_ids,
# attention_mask) -> logits (and .close()); `none` is the plain forward pass. One line per defense.
ENGINES: dict[str, Entry] = {
    "none": Entry(None),
    "masked_ttt": Entry("masked_ttt", masked=True),
    "tent": Entry("tent"),
    "mask_ensemble": Entry("mask_ensemble", masked=True),  # masked TTT's no-gradient control
    # masked TTT recipes beyond the tutorial's, and Tent with a reliability filter (docstrings cite sources)
    "masked_ttt_views": Entry("masked_ttt_views", masked=True),
    "masked_ttt_sgd": Entry("masked_ttt_sgd", masked=True),
    "masked_ttt_lower_norm": Entry("masked_ttt_lower_norm", masked=True),
    "masked_ttt_anchored": Entry("masked_ttt_anchored", masked=True),
    "tent_filtered": Entry("tent_filtered"),
}
# Text repairs: each module has build(settings, context) -> callable(list[str]) -> list[str].
REPAIRS: dict[str, Entry] = {
    "spell": Entry("spell"),
    "dedupe": Entry("dedupe"),
}
MASKED = {name for name, entry in ENGINES.items() if entry.masked}


def _module(entry: Entry):
    """The defense's module, imported only when it is built (config validation never imports torch)."""
    name = entry.module if "." in entry.module else f"ttt_pipeline.defenses.{entry.module}"
    return importlib.import_module(name)


@dataclass(frozen=True)
class Method:
    name: str
    repairs: tuple[str, ...]
    engine: str

    @property
    def masked(self) -> bool:
        """Scored once per mask seed."""
        return self.engine in MASKED


def parse(name: str) -> Method:
    """`spell+masked_ttt` -> Method(repairs=("spell",), engine="masked_ttt"); ValueError naming the choices."""
    parts = [p.strip() for p in name.split("+")]
    *repairs, last = parts
    if last in REPAIRS:
        repairs, last = parts, "none"
    bad = [p for p in repairs if p not in REPAIRS] + ([last] if last not in ENGINES else [])
    if bad or not parts[-1]:
        raise ValueError(f"unknown method {name!r}: {bad}; a method is [repair+...+]engine with repairs "
                         f"{sorted(REPAIRS)} and engines {sorted(ENGINES)} (e.g. spell+masked_ttt)")
    if len(set(repairs)) != len(repairs):
        raise ValueError(f"method {name!r} repeats a repair")
    return Method(name, tuple(repairs), last)


def known() -> list[str]:
    return sorted(ENGINES) + sorted(REPAIRS) + [f"{r}+{e}" for r in sorted(REPAIRS) for e in sorted(ENGINES)
                                                 if e != "none"]


def build_engine(method: Method | str, model, tokenizer, settings):
    """An object with .predict(input_ids, attention_mask) -> logits, or None for `none`; `settings` is a
    TTTSettings or a TTTConfig (converted)."""
    from ttt_pipeline.defenses.base import TTTSettings, settings_from_config

    m = parse(method) if isinstance(method, str) else method
    if not isinstance(settings, TTTSettings):
        settings = settings_from_config(settings)
    entry = ENGINES[m.engine]
    return None if entry.module is None else _module(entry).build(model, tokenizer, settings)


def build_repairs(method: Method | str, settings, context: dict | None = None, cache: dict | None = None,
                  key: tuple = ()) -> list[Callable]:
    """The method's text repairs. With `cache`, each repair is built once per (name, *key) and reused: a spelling
    dictionary loads in seconds, so the pipeline, the Classifier and the benches build it once for many sets."""
    m = parse(method) if isinstance(method, str) else method
    if cache is None:
        return [_module(REPAIRS[r]).build(settings, context or {}) for r in m.repairs]
    for r in m.repairs:
        if (r, *key) not in cache:
            cache[(r, *key)] = _module(REPAIRS[r]).build(settings, context or {})
    return [cache[(r, *key)] for r in m.repairs]
