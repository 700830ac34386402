"""Method names -> what runs: zero or more text repairs, then one model engine.

A method is `repair+...+engine` (`spell+masked_ttt`), a lone repair (`spell`: then plain prediction) or a lone
engine (`masked_ttt`). Adding a defense is one module plus one line in REPAIRS or ENGINES.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

# engine name -> factory(model, tokenizer, settings) -> object with .predict(ids, am) (None: plain forward)
ENGINES: dict[str, Callable] = {}
# repair name -> factory(settings, context) -> callable(list[str]) -> list[str]
REPAIRS: dict[str, Callable] = {}
# Engines whose result depends on the mask seed: scored once per `ttt.mask_seeds` entry.
MASKED = {"masked_ttt", "mask_ensemble"}


def engine(name: str, masked: bool = False):
    def register(factory):
        ENGINES[name] = factory
        if masked:
            MASKED.add(name)
        return factory
    return register


def repair(name: str):
    def register(factory):
        REPAIRS[name] = factory
        return factory
    return register


@engine("none")
def _none(model, tokenizer, settings):
    return None


@engine("masked_ttt", masked=True)
def _masked_ttt(model, tokenizer, settings):
    from ..ttt import MaskedTTT
    from ..model import special_token_ids

    return MaskedTTT(model, tokenizer.mask_token_id, special_token_ids(tokenizer), settings)


@engine("tent")
def _tent(model, tokenizer, settings):
    from ..tent import TentEngine

    return TentEngine(model, settings)


@engine("mask_ensemble", masked=True)
def _mask_ensemble(model, tokenizer, settings):
    from ..model import special_token_ids
    from .mask_ensemble import MaskEnsemble

    return MaskEnsemble(model, tokenizer.mask_token_id, special_token_ids(tokenizer), settings)


# Masked TTT recipes beyond the tutorial's and Tent with a reliability filter: one module each (docstrings cite
# their sources); each takes ttt.* and fixes only what defines it.
@engine("masked_ttt_views", masked=True)
def _masked_ttt_views(model, tokenizer, settings):
    from .masked_ttt_views import build

    return build(model, tokenizer, settings)


@engine("masked_ttt_sgd", masked=True)
def _masked_ttt_sgd(model, tokenizer, settings):
    from .masked_ttt_sgd import build

    return build(model, tokenizer, settings)


@engine("masked_ttt_lower_norm", masked=True)
def _masked_ttt_lower_norm(model, tokenizer, settings):
    from .masked_ttt_lower_norm import build

    return build(model, tokenizer, settings)


@engine("masked_ttt_anchored", masked=True)
def _masked_ttt_anchored(model, tokenizer, settings):
    from .masked_ttt_anchored import build

    return build(model, tokenizer, settings)


@engine("tent_filtered")
def _tent_filtered(model, tokenizer, settings):
    from .tent_filtered import build

    return build(model, tokenizer, settings)


@repair("spell")
def _spell(settings, context):
    from .spell import SpellRepair

    return SpellRepair(max_edit_distance=getattr(settings, "spell_max_edit_distance", 2),
                       extra_vocabulary=context.get("vocabulary")).repair_all


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
    m = parse(method) if isinstance(method, str) else method
    return ENGINES[m.engine](model, tokenizer, settings)


def build_repairs(method: Method | str, settings, context: dict | None = None) -> list[Callable]:
    m = parse(method) if isinstance(method, str) else method
    return [REPAIRS[r](settings, context or {}) for r in m.repairs]
