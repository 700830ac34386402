"""New reviews against the training data: the change in accuracy with its interval, and a simple drift summary.

The accuracy on new reviews is compared with the test accuracy of the same model under the same method. The two
are different reviews, so the difference is unpaired: Newcombe's interval for a difference of two independent
proportions (statsmodels `confint_proportions_2indep`, method `newcomb`). The drift summary says what changed in
the input: the label shares, the mean length in words and the share of words never seen in training (against
the test split's share, the same measure on reviews of the training distribution).
"""

from __future__ import annotations

import re
from collections import Counter

import numpy as np

WORD = re.compile(r"[a-z0-9']+")


def words(text: str) -> list[str]:
    return WORD.findall(text.lower())


def accuracy_change(correct_new, correct_ref, confidence: float = 0.95) -> dict:
    """New minus reference accuracy with its Newcombe interval (independent samples)."""
    from statsmodels.stats.proportion import confint_proportions_2indep

    a, b = np.asarray(correct_new, dtype=float), np.asarray(correct_ref, dtype=float)
    ka, kb = int(a.sum()), int(b.sum())
    lo, hi = confint_proportions_2indep(ka, len(a), kb, len(b), method="newcomb", compare="diff",
                                       alpha=1 - confidence)
    return {"delta": ka / len(a) - kb / len(b), "ci_low": float(lo), "ci_high": float(hi), "acc": ka / len(a),
            "acc_reference": kb / len(b), "n": len(a), "n_reference": len(b),
            "significant": bool(lo > 0 or hi < 0)}


def label_shares(labels, names: list[str]) -> dict[str, float]:
    counts = Counter(int(v) for v in labels)
    n = max(1, sum(counts.values()))
    return {name: counts.get(i, 0) / n for i, name in enumerate(names)}


def unseen_share(texts, vocabulary: set[str]) -> float | None:
    """Share of word tokens of `texts` that are not in `vocabulary`."""
    toks = [w for t in texts for w in words(t)]
    return sum(w not in vocabulary for w in toks) / len(toks) if toks else None


def drift_summary(train_texts, train_labels, test_texts, new_texts, new_labels, names: list[str]) -> dict:
    """Label shares (train, new), mean length in words (train, new) and the share of words unseen in training
    (test, new); `label_share_shift` is the total variation distance between the two label distributions."""
    vocab = {w for t in train_texts for w in words(t)}
    shares = {"train": label_shares(train_labels, names), "new": label_shares(new_labels, names)}

    def mean_words(texts) -> float:
        return float(np.mean([len(words(t)) for t in texts])) if len(texts) else 0.0

    return {"label_shares": shares,
            "label_share_shift": 0.5 * sum(abs(shares["new"][k] - shares["train"][k]) for k in names),
            "mean_words": {"train": mean_words(train_texts), "new": mean_words(new_texts)},
            "unseen_word_share": {"test": unseen_share(test_texts, vocab), "new": unseen_share(new_texts, vocab)},
            "n": {"train": len(train_texts), "new": len(new_texts)}}
