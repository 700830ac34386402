"""The training vocabulary that `spell` trusts besides its English dictionary (`ttt.spell.vocabulary: train`).

One definition for every user: the evaluation step builds it from the training texts, the finetune step
stores it as `vocabulary.json` inside the logged MLflow Model, and a served or `ttt-pipeline predict`
classifier reads it back, so `spell` repairs the same words in all three.

A word is a run of letters or digits with inner apostrophes (`don't`, `mp3`), lowercased; it is kept when it
occurs at least `min_count` times in the training texts (one typo in the training data is not a word).
`SpellRepair(extra_vocabulary=training_vocabulary(texts))` repairs exactly as `SpellRepair(extra_vocabulary=texts)`.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Iterable

WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)*")  # the word runs `spell` cuts texts into
FILE = "vocabulary.json"


def words(text: str) -> list[str]:
    """The lowercased words of a text, in order."""
    return WORD.findall(text.lower())


def training_vocabulary(texts: Iterable[str], min_count: int = 2) -> dict[str, int]:
    """word -> count over `texts`, words seen at least `min_count` times; most frequent first, ties by word
    (the same texts give the same dict, and the same file)."""
    counts = Counter(w for t in texts if isinstance(t, str) for w in words(t))
    kept = [(w, n) for w, n in counts.items() if n >= min_count]
    return dict(sorted(kept, key=lambda wn: (-wn[1], wn[0])))


def write_vocabulary(vocabulary: dict[str, int], path: Path) -> Path:
    from ttt_pipeline.storage import atomic_write_text

    atomic_write_text(Path(path), json.dumps(vocabulary, ensure_ascii=False, indent=0))
    return Path(path)


def read_vocabulary(path: Path) -> dict[str, int] | None:
    """The stored vocabulary, or None when the file is absent."""
    path = Path(path)
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, int) for k, v in data.items()):
        raise ValueError(f"{path}: expected a JSON object of word -> count")
    return data
