"""Per-text random streams and exact edit counts.

Every text gets its own ``random.Random`` seeded from a cryptographic hash of
(seed, family, stream key, text).  Python's ``hash()`` is salted per process
(PYTHONHASHSEED), so it would make corruption differ between runs and workers;
a blake2b digest does not, and keying on the text itself makes the output of a
text independent of its position, of the batch it travels in and of the
number of workers that process the batch.
"""

from __future__ import annotations

import hashlib
import random
from typing import Sequence

__all__ = ["text_rng", "edit_count", "pick", "pick_spaced"]

_PERSON = b"ttt-corruption"  # domain separation: these streams never collide with other blake2b users


def text_rng(seed: int, family: str, stream: str, text: str) -> random.Random:
    """A generator that depends only on its arguments, never on the process."""
    h = hashlib.blake2b(digest_size=16, person=_PERSON)
    h.update(f"{int(seed)}\x00{family}\x00{stream}\x00".encode("utf-8"))
    # surrogatepass: a str holding a lone surrogate must still hash, not crash
    h.update(text.encode("utf-8", "surrogatepass"))
    return random.Random(int.from_bytes(h.digest(), "big"))


def edit_count(rate: float, n_eligible: int, rng: random.Random) -> int:
    """How many of ``n_eligible`` units to change for an exact rate.

    Exactly ``rate * n`` when that is whole, otherwise floor or ceil with the
    probability that makes the expectation exact (stochastic rounding).
    Plain ``round`` would bias every short text the same way (2% of 70 words
    is always 1 edit, 2% of 20 shuffle-eligible words always 0), so a corpus
    of short texts would miss its target rate by a wide margin; rounding
    stochastically keeps each text within one edit of the target *and* the
    corpus-level rate unbiased.  No forced minimum of one edit: that would put
    a 3-word text at severity 1 at 33%.
    """
    if n_eligible <= 0 or rate <= 0.0:
        return 0
    x = round(rate * n_eligible, 9)  # 0.1*30 == 3.0000000000000004 must count as whole
    k = int(x)
    frac = x - k
    if frac > 0.0 and rng.random() < frac:
        k += 1
    return min(k, n_eligible)


def pick(rng: random.Random, cands: Sequence[int], k: int) -> list[int]:
    """k distinct candidates, drawn without replacement."""
    if k <= 0 or not cands:
        return []
    if k >= len(cands):
        return list(cands)
    return rng.sample(cands, k)


def pick_spaced(rng: random.Random, cands: Sequence[int], k: int, span: int = 2) -> list[int]:
    """Up to k candidates whose ``span``-wide footprints do not overlap.

    Edits that touch two units (a swap, an ``rn``->``m`` merge) would otherwise
    chain or undo each other, and the count of applied edits would stop
    matching the count of real changes.  Random-order greedy acceptance: a
    cheap first pass over a sample, then the rest only if still short (rare:
    it needs a dense rate on text with few candidates).
    """
    n = len(cands)
    if k <= 0 or n == 0:
        return []
    k = min(k, n)
    used: set[int] = set()
    out: list[int] = []

    def offer(j: int) -> bool:
        p = cands[j]
        cells = range(p, p + span)
        if any(c in used for c in cells):
            return False
        used.update(cells)
        out.append(p)
        return len(out) >= k

    first = rng.sample(range(n), min(n, 2 * k + 4))
    for j in first:
        if offer(j):
            return out
    if len(first) < n:
        seen = set(first)
        rest = [j for j in range(n) if j not in seen]
        rng.shuffle(rest)
        for j in rest:
            if offer(j):
                return out
    return out
