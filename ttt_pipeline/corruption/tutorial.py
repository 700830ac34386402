"""The corruption of torch-ttt's "Test-Time Training with BERT" tutorial
(sphinx-gallery script of github.com/nikitadurasov/torch-ttt), re-implemented so
that, given the same ``random.Random`` state, it makes the same draws in the
same order as the tutorial's ``corrupt_text(text, char_prob, word_prob)``:

1. word pass, per whitespace word: ``random() < word_prob`` then
   ``choice(['delete', 'shuffle'])``; shuffle (``random.shuffle`` of the inner
   letters) only if ``len(word) > 3``;
2. the survivors are joined with single spaces and split again;
3. char pass, per word, per character index: ``random() < char_prob`` then
   ``choice(['swap', 'drop', 'repeat'])``; swap with the next character only if
   it is not the last one, drop empties it, repeat doubles it.

Unlike the exact-rate families, these are nominal probabilities: a shuffle may
reproduce the word and a swap may exchange equal letters.  The realised rate
reported is therefore measured, as the fraction of the original words that
did not come through unchanged (deleted or altered).  Whitespace is
normalised to single spaces, as in the tutorial.
"""

from __future__ import annotations

import random

__all__ = ["apply_tutorial", "word_pass", "stream_key", "TUTORIAL_CHAR_PROB", "TUTORIAL_WORD_PROB"]

TUTORIAL_CHAR_PROB = 0.1
TUTORIAL_WORD_PROB = 0.1  # the tutorial evaluates with CorruptedDataset(char_prob=0.1, word_prob=0.1)

# Same lists, same order as the tutorial: rng.choice draws an index into them.
_WORD_OPS = ("delete", "shuffle")
_CHAR_OPS = ("swap", "drop", "repeat")


def stream_key(char_prob: float, word_prob: float) -> str:
    """The rng stream name: probabilities, not severity, select the stream."""
    return f"p{float(char_prob)!r},{float(word_prob)!r}"


def word_pass(words: list[str], word_prob: float, rng: random.Random) -> list[tuple[int, str]]:
    """Step 1: the words that survive, as (index in `words`, word after a possible shuffle).  Public so that
    bench/studies/repair_ceiling.py can tell the deleted words from the altered ones on the same random stream."""
    survivors: list[tuple[int, str]] = []
    for idx, word in enumerate(words):
        if rng.random() < word_prob:
            if rng.choice(_WORD_OPS) == "delete":
                continue
            if len(word) > 3:
                middle = list(word[1:-1])
                rng.shuffle(middle)
                word = word[0] + "".join(middle) + word[-1]
        survivors.append((idx, word))
    return survivors


def apply_tutorial(text: str, char_prob: float, word_prob: float,
                   rng: random.Random) -> tuple[str, int, int]:
    words = text.split()
    survivors = word_pass(words, word_prob, rng)
    changed = len(words) - len(survivors)
    out: list[str] = []
    for idx, word in survivors:
        chars = list(word)
        last = len(chars) - 1
        for i in range(len(chars)):
            if rng.random() < char_prob:
                op = rng.choice(_CHAR_OPS)
                if op == "swap" and i < last:
                    chars[i], chars[i + 1] = chars[i + 1], chars[i]
                elif op == "drop":
                    chars[i] = ""
                elif op == "repeat":
                    chars[i] = chars[i] * 2
        new = "".join(chars)
        changed += new != words[idx]
        out.append(new)
    return " ".join(out), changed, len(words)


def tutorial_family(text: str, rate: float, rng: random.Random) -> tuple[str, int, int]:
    """Registry adapter: ``rate`` (severity) is ignored by design."""
    return apply_tutorial(text, TUTORIAL_CHAR_PROB, TUTORIAL_WORD_PROB, rng)
