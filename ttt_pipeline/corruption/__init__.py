"""Text-corruption suite: seeded, exact-rate corruption families for robustness
evaluation (pure Python; no torch, no Prefect).

Why it looks the way it does:

* Severity 1-5 is an *exact* edit rate (SEVERITY_RATES) of the units a family
  can really change, not a per-unit probability, so "severity 3" means the
  same amount of damage for every family and every dataset.  Per text, the
  number of edits is ``rate * n_eligible`` rounded stochastically to one of its
  two neighbouring integers (see ``rng.edit_count``): every text is within one
  edit of its target and the rate over a corpus is unbiased even for short
  texts, where plain rounding would always round the same way.  Each counted
  edit is a real change (no swaps of equal letters, no shuffles that give the
  word back, no overlapping edits).
* Output depends only on (text, family, severity, seed): each text's
  ``random.Random`` is seeded from a blake2b hash, never from ``hash()``.
* ``tutorial`` replays torch-ttt's BERT tutorial corruption at its own
  probabilities (char 0.1, word 0.1); severity is recorded in the result but
  does not change the texts, and its realised rate is the fraction of words
  changed.  ``tutorial_corrupt`` exposes the probabilities.
"""

from ttt_pipeline.corruption.corrupt import CorruptedSet, corrupt_texts, tutorial_corrupt
from ttt_pipeline.corruption.registry import FAMILIES, SEVERITY_RATES, Family, get_family, list_families

__all__ = [
    "FAMILIES",
    "list_families",
    "get_family",
    "corrupt_texts",
    "tutorial_corrupt",
    "CorruptedSet",
    "SEVERITY_RATES",
    "Family",
]
