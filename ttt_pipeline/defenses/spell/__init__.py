"""Spelling repair in front of the model: word-level SymSpell lookups on symspellpy's English dictionary.

Why word-level `lookup` (not `lookup_compound`): compound segmentation is far too slow for a test set and
rewrites spacing; per-word lookups with a per-word cache cost little once the review vocabulary is seen. The
lookups' answers are found, for all new words of a batch at once, by a whole-word delete index (_DeleteIndex):
the same words in the same order as symspellpy's `lookup`, several times faster than one pure-Python lookup per
word. Where only symspellpy's search knows the order (equal counts), its search runs over the closest words alone
(_tie_ordered), so its index of the whole shipped dictionary (2 s and 135 MB) loads only for edit distance 3 (a
training-vocabulary word over 64 letters sends a search to the vocabulary's own small SymSpell).
Only what is likely a typo is touched, so clean text passes through (almost) unchanged:

- the text is cut into word / non-word runs; punctuation, whitespace and numbers are copied verbatim;
- candidates are ASCII alphabetic words of 2+ letters (and, with `glyphs`, words of 3+ letters with a digit or two
  where letters belong: pr0duct, 9ood); other words with digits (mp3, 4th, 1080p), apostrophes (don't) or other
  scripts, mixed-case words (iPod, SanDisk: deliberate brand spellings) and all-caps words of up to 4
  letters (DVD, USB, HDMI: acronyms the dictionary lacks) are left as written;
- words in the dictionary or in the training vocabulary are kept, and so are contractions written without
  their apostrophe (dont, im): SymSpell would otherwise turn them into other words (done, in);
- runs of 3+ equal letters are cut to 2 first (goooood -> good: English has no triple letters);
- the correction is the closest word (TOP verbosity, ties by frequency), re-cased like the input
  (BATTRY -> BATTERY, Graet -> Great); words of 2-3 letters only accept 1 edit (2 edits reach too much).

Typo fixes beyond the closest word (`fixes`; DEFAULT_FIXES are the ones that passed bench/spell_repair.py's
check on training reviews, docs/benchmarks.md): `undouble` (letters doubled by a sticky key, written once when that
makes a known word: purchasseedd -> purchased), `case` (shift-key slips on a capitalised word: TThe -> The,
hTese -> These; other mixed case is still left alone), `real_word` (a dictionary word rarer than 10^7 whose
letters spell one 1,000x as frequent: rae -> are), `jumble_late` (inner letters shuffled, first and last kept,
when no word is within the edit distance: nveagite -> negative), `context` (when several words are equally close,
the one most probable between its neighbours by symspellpy's shipped bigram counts, instead of the most frequent:
"I ahd" -> "I had", not "and"; without known neighbours it is the most frequent, as before), `confusions` (the known
words one rewrite away that real misspellings show, learned from codespell's list of Wikipedia's common
misspellings: gud -> good, ocasion -> occasion; they join SymSpell's closest words and the neighbours rank them all;
an option until bench/spell_repair.py's rule adopts it), `glyphs` (a digit read as the letter it is confused with,
by OCR glyphs or a slipped key, when that spells a known word: pr0duct -> product, he11o -> hello; the pairs come
from this project's own `ocr` and `keyboard` families; a known word before trailing digits, as in ipod2, is left
as written). An option, not on by default (it failed the check: it costs keyboard typos): `jumble` (the same
before the closest-word lookup).

`extra_vocabulary` (training texts, words, or a word -> count mapping such as `defenses.vocabulary`'s) adds
the words seen at least `min_count` times that the dictionary lacks (product names, jargon, the domain's
slang) at a high frequency, so they survive and their misspellings are repaired towards them.
`ranking` (`ttt.spell.ranking`) names how equally close candidates are chosen: `frequency`, `bigram` (the `context`
fix above, the default) or `context`: the bigram score, plus in-domain bigrams when the repair is given texts
(`domain_texts`), a preference for look-alike shapes (rn/m, vv/w, cl/d, 0/o: ranking.LOOKALIKES) and a gate that
leaves the word as written unless the best candidate beats the runner-up by `gate` (bench/studies/spell_ranking.py,
docs/benchmarks.md). Deterministic: no randomness; ties go to the more frequent word, then symspellpy's stable order.

The package: `dictionary` (the shipped word and bigram lists, and what is derived from them), `index` (the
closest-word search), `ranking` (the choice among equally close candidates), `repair` (SpellRepair, get_repair) and
`cache` (the bound on its caches); here, the defense as the registry sees it: `Settings` (`ttt.spell`) and `build`.
"""

from __future__ import annotations

from typing import Callable, Literal

from pydantic import Field, ValidationInfo, field_validator

from ttt_pipeline.defenses.settings import DefenseSettings
from ttt_pipeline.defenses.spell.dictionary import CONFUSION_MIN_COUNT, DICTIONARY, _confusions, _counts
from ttt_pipeline.defenses.spell.index import _base_index
from ttt_pipeline.defenses.spell.repair import DEFAULT_FIXES, FIXES, SpellRepair, get_repair, vocabulary_counts

__all__ = ["SpellRepair", "get_repair", "DICTIONARY", "DEFAULT_FIXES", "FIXES", "CONFUSION_MIN_COUNT",
           "vocabulary_counts", "Settings", "build", "_base_index", "_confusions", "_counts"]


class Settings(DefenseSettings):
    """`ttt.spell.*`."""

    max_edit_distance: int = Field(2, ge=1, le=3, description="Largest edit distance of a repair.")
    vocabulary: Literal["train", "none"] = Field(
        "train", description="train: also trust the words of the training texts (seen at least twice), so product "
        "names survive; none: the shipped English dictionary only.")
    ranking: Literal["frequency", "bigram", "context"] = Field(
        "bigram", description="How equally close candidates are chosen. frequency: the most frequent; bigram: the "
        "most probable between the neighbours by symspellpy's bigram counts; context: that, plus look-alike shapes "
        "(rn/m, vv/w, cl/d, 0/o, ...) preferred and the gate (bench/studies/spell_ranking.py measures them).")
    gate: float = Field(
        0.0, ge=0.0, le=50.0, description="ranking context only: leave a word as written unless its best candidate "
        "scores at least this much (natural log) above the runner-up; 0 takes the best.")

    @field_validator("gate")
    @classmethod
    def _gate_needs_context(cls, gate: float, info: ValidationInfo) -> float:
        if gate and info.data.get("ranking") != "context":
            raise ValueError(f"a gate of {gate} needs ttt.spell.ranking=context (the only ranking that reads it); "
                             "set the ranking to context or the gate to 0")
        return gate


def build(settings: Settings, context: dict) -> Callable[[list[str]], list[str]]:
    """The registry's constructor for a text repair: `ttt.spell.max_edit_distance`, `ranking` and `gate`, and the
    training vocabulary when the context has one (`context["vocabulary"]`) and `ttt.spell.vocabulary` is train. The
    in-domain bigrams of `ranking: context` are not passed: a served model has the vocabulary's word counts only
    (defenses.vocabulary), and it must repair as the evaluation did."""
    vocabulary = context.get("vocabulary") if settings.vocabulary == "train" else None
    return SpellRepair(max_edit_distance=settings.max_edit_distance, extra_vocabulary=vocabulary,
                       ranking=settings.ranking, gate=settings.gate).repair_all