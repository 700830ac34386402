"""The scoring grid of the evaluate step as named types: test sets x methods x mask seeds.

A `TestSet` is one scored set (clean, a shifted domain, a corrupted copy); a `Job` is one set under one method
and, for a masked method, one mask seed (`jobs`). `score_grid` runs them with the method's text repairs built
once for every set (`registry.build_repairs`) and returns the accuracy rows (with bootstrap intervals) and every
review's prediction, the two files the evaluate step stores. It takes the slices of the configuration it reads
(`ttt`, `evaluation`, the model's max length), not the whole pipeline configuration.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ttt_pipeline.config import EvaluationConfig, TTTConfig
from ttt_pipeline.defenses import registry
from ttt_pipeline.evaluation.scoring import score, score_texts
from ttt_pipeline.evaluation.signal import heldout_fields, mlm_quality
from ttt_pipeline.evaluation.stats import accuracy_interval
from ttt_pipeline.metrics import softmax
from ttt_pipeline.modeling.oom import release_freed_memory


@dataclass(frozen=True)
class TestSet:
    """One scored set: `kind` is clean, shift or corrupted; family and severity name a corrupted copy."""

    __test__ = False  # not a pytest test class, whatever its name

    kind: str
    name: str
    texts: list[str]
    labels: list[int]
    family: str | None = None
    severity: int | None = None

    def fields(self) -> dict:
        """The set's columns of a result row and of a prediction record."""
        return {"kind": self.kind, "set": self.name, "family": self.family, "severity": self.severity}


@dataclass(frozen=True)
class Job:
    """One set under one method (and one mask seed for a masked method; None otherwise)."""

    test_set: TestSet
    method: registry.Method
    mask_seed: int | None


def jobs(test_sets: list[TestSet], ttt: TTTConfig) -> list[Job]:
    """Every set under every `ttt.methods` entry, masked ones once per mask seed; defenses skip clean text unless
    `ttt.score_clean`."""
    methods = [registry.parse(m) for m in ttt.methods]
    runs = [(m, seed) for m in methods for seed in (ttt.seeds() if m.masked else [None])]
    return [Job(s, m, seed) for s in test_sets for m, seed in runs
            if ttt.score_clean or s.kind != "clean" or m.name == "none"]


def build_repairs(ttt: TTTConfig, train_texts: Callable[[], list[str]]) -> dict[str, list]:
    """Each method's text repairs, each built once for every set (a spelling dictionary takes seconds to load);
    the training texts are read only when a method has a repair (spell trusts their words)."""
    methods = [registry.parse(m) for m in ttt.methods]
    context = {"vocabulary": train_texts()} if any(m.repairs for m in methods) else {}
    cache: dict = {}
    return {m.name: registry.build_repairs(m, ttt, context, cache) for m in methods}


def score_grid(grid: list[Job], model, tokenizer, ttt: TTTConfig, evaluation: EvaluationConfig, max_length: int,
               device, repairs: dict[str, list], progress: Callable[[int, int], None] | None = None,
               amp=None) -> tuple[list[dict], list[dict]]:
    """Every job: its accuracy row (interval, macro F1, recall, confusion, speed, the MLM signal on `none`, the
    engine's held-out fields) and its predictions (label, predicted class, class probabilities per review).
    `amp`: the run's scoring precision (`Runtime.score.dtype`; None: fp32), for plain passes and engines alike."""
    total, done = sum(len(j.test_set.texts) for j in grid), 0
    quality: dict[str, dict] = {}
    rows, preds = [], []
    for job in grid:
        s, m = job.test_set, job.method
        if s.name not in quality:
            quality[s.name] = _mlm_quality(model, tokenizer, s.texts, ttt, evaluation, max_length, device)
        settings = ttt if job.mask_seed is None else ttt.model_copy(update={"seed": job.mask_seed})
        t0 = time.perf_counter()
        logits, engine_stats = score_texts(model, tokenizer, s.texts, m.name, settings, max_length, ttt.batch_size,
                                           device, (lambda i, t, d=done: progress(d + i, total)) if progress else None,
                                           repairs[m.name], amp)
        wall = time.perf_counter() - t0
        done += len(s.texts)
        pred = logits.argmax(-1)
        rows.append(_row(job, logits, pred, wall, evaluation, model.meta.num_labels,
                         {**(quality[s.name] if m.name == "none" else {}), **heldout_fields(engine_stats)}))
        preds.append({**s.fields(), "method": m.name, "mask_seed": job.mask_seed, "label": list(s.labels),
                      "pred": pred.tolist(), "probs": softmax(logits).tolist()})
        release_freed_memory()  # each method's batches fragment the heap anew; the next starts from what is live
    return rows, preds


def _row(job: Job, logits: np.ndarray, pred: np.ndarray, wall: float, evaluation: EvaluationConfig, n: int,
         extra: dict) -> dict:
    s = job.test_set
    found = score(logits, s.labels, n)
    lo, hi = accuracy_interval(pred == np.asarray(s.labels), evaluation.resamples, evaluation.confidence,
                               evaluation.seed)
    return {**s.fields(), "method": job.method.name, "mask_seed": job.mask_seed, "acc": found["acc"],
            "acc_ci_low": lo, "acc_ci_high": hi, "macro_f1": found["macro_f1"], "recall": found["recall"],
            "confusion": found["confusion"], "n": found["n"], "wall_s": wall,
            "samples_per_s": len(s.texts) / wall if wall > 0 else 0.0, **extra}


def _mlm_quality(model, tokenizer, texts: list[str], ttt: TTTConfig, evaluation: EvaluationConfig,
                 max_length: int, device) -> dict:
    """The MLM head on this set's own text (evaluation.signal_reviews of them): the signal TTT would adapt on."""
    n = evaluation.signal_reviews
    found = mlm_quality(model, tokenizer, texts, max_length, ttt.batch_size, device, evaluation.seed, n) if n else None
    return found or {}


def samples(test_sets: list[TestSet], preds: list[dict], label_names: list[str]) -> list[dict]:
    """The first 8 reviews of each corrupted set with every method's prediction (first mask seed)."""
    out = []
    for s in test_sets:
        if s.kind != "corrupted":
            continue
        mine: dict = {}
        for p in preds:
            if p["set"] == s.name and p["method"] not in mine:
                mine[p["method"]] = p["pred"]
        for i in range(min(8, len(s.texts))):
            out.append({"set": s.name, "text": s.texts[i], "label": label_names[s.labels[i]],
                        **{f"pred_{m}": label_names[p[i]] for m, p in mine.items()}})
    return out
