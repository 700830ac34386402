"""Scoring: every test set (clean, each corruption, each shifted domain) under every method (none, TTT, Tent).

Batches are formed in the texts' own order (never shuffled), so a per-batch TTT result is reproducible.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from .metrics import recovered_fraction, summarize
from .tokenize import encode_texts
from .train import make_collate


def predict(model, tokenizer, texts: list[str], max_length: int, batch_size: int, engine=None,
            device: torch.device | str = "cpu", progress: Callable[[int, int], None] | None = None) -> np.ndarray:
    """Class logits for texts; `engine` (TTT/Tent) adapts per unit and restores, else a plain forward.

    The texts are one stream: the engine is closed when they are done, so an online engine's adapted weights
    never outlive the set they were adapted on (the next set, and plain scoring, see the source weights).
    """
    enc = encode_texts(tokenizer, texts, max_length)
    rows = [{"input_ids": ids} for ids in enc["input_ids"]]
    collate = make_collate(tokenizer)
    out = []
    model.eval()
    try:
        for i in range(0, len(rows), batch_size):
            b = collate(rows[i:i + batch_size])
            ids, am = b["input_ids"].to(device), b["attention_mask"].to(device)
            if engine is None:
                with torch.inference_mode():
                    logits = model(ids, am)
            else:
                logits = engine.predict(ids, am)
            out.append(logits.float().cpu().numpy())
            if progress:
                progress(min(i + batch_size, len(rows)), len(rows))
    finally:
        if hasattr(engine, "close"):
            engine.close()
    return np.concatenate(out) if out else np.zeros((0, model.meta.num_labels), dtype=np.float32)


def score(logits: np.ndarray, labels: list[int], n: int) -> dict:
    return summarize(labels, logits.argmax(-1).tolist(), n)


def headline(rows: list[dict]) -> dict:
    """acc_clean, acc_corrupted, acc_ttt (mean over corrupted sets), recovered fraction, clean with TTT."""
    def acc(kind: str, method: str) -> float | None:
        vals = [r["acc"] for r in rows if r["kind"] == kind and r["method"] == method]
        return float(np.mean(vals)) if vals else None

    out = {
        "acc_clean": acc("clean", "none"),
        "acc_corrupted": acc("corrupted", "none"),
        "acc_ttt": acc("corrupted", "masked_ttt"),
        "acc_clean_ttt": acc("clean", "masked_ttt"),
        "acc_tent": acc("corrupted", "tent"),
        "acc_shift": acc("shift", "none"),
        "acc_shift_ttt": acc("shift", "masked_ttt"),
    }
    if None not in (out["acc_clean"], out["acc_corrupted"], out["acc_ttt"]):
        out["recovered_fraction"] = recovered_fraction(out["acc_clean"], out["acc_corrupted"], out["acc_ttt"])
    f1 = [r["macro_f1"] for r in rows if r["kind"] == "clean" and r["method"] == "none"]
    if f1:
        out["macro_f1_clean"] = f1[0]
    return {k: v for k, v in out.items() if v is not None}


def metric_name(row: dict) -> str:
    """MLflow-chartable names: acc/clean/none, acc/keyboard/3/ttt, acc/shift_kitchen/tent ..."""
    method = {"none": "none", "masked_ttt": "ttt", "tent": "tent"}[row["method"]]
    if row["kind"] == "corrupted":
        return f"{row['family']}/{row['severity']}/{method}"
    return f"{row['set']}/{method}"
