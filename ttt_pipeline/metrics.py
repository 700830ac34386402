"""Classification metrics computed from label arrays (no sklearn on the hot path)."""

from __future__ import annotations

import numpy as np


def softmax(logits: np.ndarray) -> np.ndarray:
    """Class probabilities as the evaluate step stores them and the classifier returns them (float32)."""
    z = logits - logits.max(-1, keepdims=True)
    e = np.exp(z)
    return (e / e.sum(-1, keepdims=True)).astype("float32")


def confusion(y_true, y_pred, n: int) -> np.ndarray:
    m = np.zeros((n, n), dtype=np.int64)
    np.add.at(m, (np.asarray(y_true, dtype=np.int64), np.asarray(y_pred, dtype=np.int64)), 1)
    return m


def summarize(y_true, y_pred, n: int) -> dict:
    m = confusion(y_true, y_pred, n)
    tp = np.diag(m).astype(float)
    support = m.sum(1).astype(float)
    predicted = m.sum(0).astype(float)
    recall = np.divide(tp, support, out=np.zeros(n), where=support > 0)
    precision = np.divide(tp, predicted, out=np.zeros(n), where=predicted > 0)
    f1 = np.divide(2 * precision * recall, precision + recall, out=np.zeros(n), where=(precision + recall) > 0)
    present = support > 0
    return {
        "acc": float(tp.sum() / max(1, m.sum())),
        "macro_f1": float(f1[present].mean()) if present.any() else 0.0,
        "recall": recall.tolist(),
        "confusion": m.tolist(),
        "n": int(m.sum()),
    }


def recovered_fraction(clean: float, corrupted: float, ttt: float) -> float | None:
    """Share of the corruption-induced drop that TTT wins back.

    None when corruption did not lower accuracy (clean <= corrupted): there is nothing to win back, and the
    ratio's sign would flip (the demo once printed -1.000 for a TTT gain on a negative drop).
    """
    drop = clean - corrupted
    return None if drop < 1e-12 else (ttt - corrupted) / drop
