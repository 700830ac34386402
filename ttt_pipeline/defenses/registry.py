"""Method names -> what runs: zero or more text repairs, then one model engine.

A method is `repair+...+engine` (`spell+masked_ttt`), a lone repair (`spell`: then plain prediction) or a lone
engine (`masked_ttt`). Adding a defense is one module with a `build` function, and a `Settings` class when it
has knobs of its own, plus one line in ENGINES or REPAIRS (docs/architecture.md walks through it): the registry
collects each `Settings` as the config section `ttt.<defense>` (`settings_types`) and hands the validated
section to `build`. The line's `summary` is what the help texts list (`describe`, `catalogue`), and its module
joins the "Defenses are independent" import contract in pyproject.toml (a test holds the two in step).
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Entry:
    """A defense: the module that holds it (under ttt_pipeline.defenses, or a full dotted path), whether its
    result depends on the mask seed (then it is scored once per `ttt.mask_seeds` entry) and whether it adapts on
    the MLM head's loss (a model without an MLM head cannot run it). How reports show it: `label` and `style`
    (matplotlib color and marker) in plots; `headline`, the short key of a defense the run's headline always
    reports when scored (acc_<headline>, acc_<kind>_<headline> for each of `headline_kinds` beyond corrupted)
    and the confusion plots show. Scoring, robustness and plots read these and name no defense themselves.
    `summary`: what it does, in one line, for the help texts (`catalogue`)."""

    module: str | None
    summary: str
    masked: bool = False
    mlm: bool = False
    label: str | None = None
    style: tuple[str, str] | None = None
    headline: str | None = None
    headline_kinds: tuple[str, ...] = ("corrupted",)


# Model engines: each module has build(model, tokenizer, settings[, own]) -> an object with .predict(input_ids,
# attention_mask) -> logits (and .close()); `settings` are the engines' shared knobs (defenses.base.EngineSettings,
# the `ttt` section), `own` the module's `Settings` (`ttt.<defense>`) when it has one; `none` is the plain
# forward pass. One line per defense.
ENGINES: dict[str, Entry] = {
    "none": Entry(None, "no defense: the fine-tuned model's plain forward pass",
                  label="no adaptation", style=("#d62728", "o")),
    "masked_ttt": Entry("masked_ttt", "adapt on the MLM loss of masked copies of each test unit, predict, restore",
                        masked=True, mlm=True, label="masked TTT", style=("#2ca02c", "s"),
                        headline="ttt", headline_kinds=("corrupted", "clean", "shift")),
    "tent": Entry("tent", "Tent: minimise the prediction entropy over the encoder's LayerNorm parameters",
                  label="Tent", style=("#1f77b4", "^"), headline="tent"),
    "mask_ensemble": Entry("mask_ensemble", "masked TTT's no-gradient control: predictions averaged over its masks",
                           masked=True, label="mask ensemble (TTT's control)", style=("#7f7f7f", "v")),
    # masked TTT recipes beyond the tutorial's, and Tent with a reliability filter (docstrings cite sources)
    "masked_ttt_views": Entry("masked_ttt_views", "masked TTT whose every step averages the MLM loss over 4 "
                              "masked views", masked=True, mlm=True),
    "masked_ttt_sgd": Entry("masked_ttt_sgd", "masked TTT with 3 SGD steps at momentum 0.9 instead of one Adam step",
                            masked=True, mlm=True),
    "masked_ttt_lower_norm": Entry("masked_ttt_lower_norm", "masked TTT adapting only the LayerNorm/bias of the "
                                   "encoder's lower half", masked=True, mlm=True),
    "masked_ttt_anchored": Entry("masked_ttt_anchored", "masked TTT keeping an adapted prediction only if its MLM "
                                 "loss fell and its KL is in budget", masked=True, mlm=True),
    "tent_filtered": Entry("tent_filtered", "Tent on low-entropy, reliable reviews only, back to the source "
                           "on collapse"),
    # consistency with masked views plus a KL anchor to the frozen model (PCL, Anti-CF), and its no-gradient control
    "anchored_tta": Entry("anchored_tta", "LayerNorm/bias steps toward agreement with masked views, KL-anchored to "
                          "the frozen model", masked=True),
    "anchored_tta_views": Entry("anchored_tta_views", "anchored_tta's no-gradient control: its views' predictions "
                                "averaged, no update", masked=True),
}
# Text repairs: each module has build(own, context) -> callable(list[str]) -> list[str]; `own` is the module's
# `Settings` (`ttt.<defense>`), None when it has none.
REPAIRS: dict[str, Entry] = {
    "spell": Entry("spell", "spelling repair: SymSpell corrects likely typos word by word, known words kept",
                   label="spelling repair", style=("#9467bd", "D")),
    "dedupe": Entry("dedupe", "drops a word written twice in a row: the the battery -> the battery"),
}
MASKED = {name for name, entry in ENGINES.items() if entry.masked}


def method_tag(method: str) -> str:
    """A method's MLflow-safe short name, the one spelling of metric names and logged keys: masked_ttt -> ttt,
    spell+masked_ttt -> spell-ttt."""
    return method.replace("masked_ttt", "ttt").replace("+", "-")


def label(method: str) -> str:
    """A method's name in plots and reports: its parts' labels joined (`spell+masked_ttt` -> spelling repair + masked
    TTT); a defense without a label, or a name that is no method, as written."""
    try:
        m = parse(method)
    except ValueError:
        return method
    parts = [*m.repairs, *([] if m.engine == "none" and m.repairs else [m.engine])]
    return " + ".join((ENGINES.get(p) or REPAIRS[p]).label or p for p in parts)


def style(method: str) -> dict | None:
    """A lone defense's plot style ({color, marker}); None for a combination or a defense without one (the plot
    picks from its own spare colours)."""
    entry = ENGINES.get(method) or REPAIRS.get(method)
    return None if entry is None or entry.style is None else {"color": entry.style[0], "marker": entry.style[1]}


def headline_methods() -> dict[str, Entry]:
    """`{method: entry}` for the defenses the run's headline reports whenever they were scored."""
    return {name: e for name, e in ENGINES.items() if e.headline}


def headline_method(key: str) -> str:
    """The method whose headline key is `key` (`ttt` -> masked_ttt)."""
    return next(name for name, e in headline_methods().items() if e.headline == key)


def needs_mlm(method: str) -> bool:
    """Whether the method's engine adapts on the MLM head's loss (masked TTT and its recipes)."""
    return ENGINES[parse(method).engine].mlm


def module_name(entry: Entry) -> str | None:
    """The dotted name of the defense's module (`ttt_pipeline.defenses.tent`); None for one without (`none`)."""
    if entry.module is None:
        return None
    return entry.module if "." in entry.module else f"ttt_pipeline.defenses.{entry.module}"


def modules() -> dict[str, str]:
    """`{defense: its module's dotted name}` for every defense that has a module, engines first (the list
    pyproject.toml's "Defenses are independent" contract must hold: tests/defenses/test_registry_lists.py)."""
    return {name: module_name(e) for name, e in {**ENGINES, **REPAIRS}.items() if e.module is not None}


def describe() -> list[tuple[str, str, str]]:
    """`(name, kind, summary)` of every defense, kind `engine` or `repair`, in the tables' order."""
    return ([(name, "engine", e.summary) for name, e in ENGINES.items()]
            + [(name, "repair", e.summary) for name, e in REPAIRS.items()])


def catalogue() -> str:
    """Every defense in one sentence, `engines none (summary), ...; repairs spell (summary), ...`: the list the
    help texts (`ttt.methods`, `ttt-pipeline predict`) print, so none of them lags the tables."""
    rows = describe()
    return "; ".join(f"{kind}s " + ", ".join(f"{name} ({summary})" for name, k, summary in rows if k == kind)
                     for kind in ("engine", "repair"))


def _module(entry: Entry):
    """The defense's module, imported only when it is built (config validation never imports torch)."""
    return importlib.import_module(module_name(entry))


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


@functools.cache
def settings_types() -> dict[str, type]:
    """`{defense: its Settings class}` for every defense module that defines one (a recipe that reuses another
    defense's class, as tent_filtered does Tent's, shares that defense's section). The tables above are fixed, so
    this is worked out once (callers must not change the dict)."""
    out = {}
    for name, entry in {**ENGINES, **REPAIRS}.items():
        cls = None if entry.module is None else getattr(_module(entry), "Settings", None)
        if cls is not None and cls.__module__ == _module(entry).__name__:
            out[name] = cls
    return out


def own_settings(name: str, settings):
    """The defense's own validated settings: its section of `settings` (a TTTConfig), or the defaults of its
    `Settings` where `settings` has no such section (a bare EngineSettings, a repair built alone); None when the
    defense has no knobs."""
    entry = ENGINES.get(name) or REPAIRS[name]
    cls = None if entry.module is None else getattr(_module(entry), "Settings", None)
    if cls is None:
        return None
    section = next(n for n, c in settings_types().items() if c is cls)
    found = getattr(settings, section, None)
    return found if isinstance(found, cls) else cls()


def build_engine(method: Method | str, model, tokenizer, settings, amp=None):
    """An object with .predict(input_ids, attention_mask) -> logits, or None for `none`; `settings` is the
    validated `ttt` section (a TTTConfig) or an EngineSettings; `amp` the autocast dtype it scores and adapts in,
    the run's scoring precision as the caller resolved it (`Runtime.score.dtype`; None: fp32)."""
    m = parse(method) if isinstance(method, str) else method
    entry = ENGINES[m.engine]
    if entry.module is None:
        return None
    own = own_settings(m.engine, settings)
    engine = _module(entry).build(model, tokenizer, settings, *([] if own is None else [own]))
    engine.amp = amp
    return engine


def build_repairs(method: Method | str, settings, context: dict | None = None, cache: dict | None = None,
                  key: tuple = ()) -> list[Callable]:
    """The method's text repairs, each given its own settings (`ttt.<repair>`, see own_settings). With `cache`,
    each repair is built once per (name, *key) and reused: a spelling dictionary and its index take about a
    second, so the pipeline, the Classifier and the benches build it once for many sets."""
    m = parse(method) if isinstance(method, str) else method

    def make(r: str):
        return _module(REPAIRS[r]).build(own_settings(r, settings), context or {})

    if cache is None:
        return [make(r) for r in m.repairs]
    for r in m.repairs:
        if (r, *key) not in cache:
            cache[(r, *key)] = make(r)
    return [cache[(r, *key)] for r in m.repairs]
