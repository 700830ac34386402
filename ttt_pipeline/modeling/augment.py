"""Robust training data (`finetune.augment`): the training reviews plus seeded, suite-corrupted copies of a share.

The training-side baseline against which the test-time defenses are judged. Deterministic: which reviews are
copied, each copy's family and severity (uniform draws from the configured lists) and the corruption itself
depend only on the texts and `seed`. The seed must differ from the test corruption's (`corruption.seed`, checked
where the configuration is validated), so no copy shares the test sets' random stream; the copies are of
training reviews, never of test reviews.

A model trained this way has seen some corruption families: its accuracy on those families measures
in-distribution noise, not robustness. The evaluate statistics therefore report the families in
`finetune.augment.families` apart from the held-out ones (`robustness.augment_partition`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ttt_pipeline.corruption import corrupt_texts


@dataclass
class AugmentedTexts:
    """The clean texts first (in their order), then the copies; `copies` says where each copy came from."""

    texts: list[str]
    labels: list
    n_clean: int
    copies: list[dict] = field(default_factory=list)  # {"index", "family", "severity"} per copy, in order

    def summary(self) -> dict:
        by: dict[str, int] = {}
        for c in self.copies:
            key = f"{c['family']}-{c['severity']}"
            by[key] = by.get(key, 0) + 1
        return {"n_clean": self.n_clean, "n_copies": len(self.copies), "copies_by_set": dict(sorted(by.items()))}


def augment_texts(texts: list[str], labels: list, families: list[str], severities: list[int], share: float,
                  seed: int) -> AugmentedTexts:
    """`texts` plus one corrupted copy (same label) of round(share x n) of them, drawn without replacement."""
    texts, labels = list(texts), list(labels)
    if len(texts) != len(labels):
        raise ValueError(f"{len(texts)} texts but {len(labels)} labels")
    if not families or not severities:
        raise ValueError("augmenting needs at least one family and one severity")
    if not 0 < share <= 1:
        raise ValueError(f"share must be in (0, 1], got {share}")
    n = len(texts)
    k = min(n, max(1, int(round(share * n)))) if n else 0
    rng = np.random.default_rng(seed)
    chosen = np.sort(rng.choice(n, size=k, replace=False)) if k else np.zeros(0, dtype=int)
    fam = rng.integers(len(families), size=k)
    sev = rng.integers(len(severities), size=k)
    plan = [{"index": int(i), "family": families[f], "severity": int(severities[s])}
            for i, f, s in zip(chosen, fam, sev)]
    out: list[str | None] = [None] * k
    groups: dict[tuple[str, int], list[int]] = {}
    for j, c in enumerate(plan):
        groups.setdefault((c["family"], c["severity"]), []).append(j)
    # each text's corruption depends only on (text, family, severity, seed): grouping changes nothing
    for (family, severity), js in groups.items():
        done = corrupt_texts([texts[plan[j]["index"]] for j in js], family, severity, seed)
        for j, t in zip(js, done.texts):
            out[j] = t
    return AugmentedTexts(texts + [str(t) for t in out], labels + [labels[c["index"]] for c in plan], n, plan)


def augment_dataset(train_ds, train_texts: list[str], tokenizer, max_length: int, augment):
    """The tokenised training split (input_ids, label, length, ...) with the tokenised copies appended;
    `augment` is a finetune.augment section. Returns (dataset, AugmentedTexts)."""
    from datasets import concatenate_datasets

    from ttt_pipeline.modeling.tokenize import lengths_dataset

    labels = train_ds["label"]
    aug = augment_texts(train_texts, labels, augment.families, augment.severities, augment.share, augment.seed)
    extra = lengths_dataset(tokenizer, aug.texts[aug.n_clean:], max_length, label=aug.labels[aug.n_clean:])
    cols = ["input_ids", "length", "label"]
    merged = concatenate_datasets([train_ds.select_columns(cols),
                                   extra.cast(train_ds.select_columns(cols).features)])
    return merged, aug
