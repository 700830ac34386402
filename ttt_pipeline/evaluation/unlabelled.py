"""The evaluation grid without gold labels (issue 69): what noise does to a model's predictions on unlabelled reviews.

With no labels there is no accuracy, but every corrupted set is a copy of the clean reviews, so each review's clean
prediction (under `none`) is a reference its corrupted copies can be held against. Per corrupted set (family x
severity):

- `changed`: the share of reviews whose prediction under `none` differs from their clean prediction;
- per defense, `changed` again (its prediction on the corrupted copy against the clean `none` prediction) and
  `restored`: of the reviews `none` changed, the share the defense brings back to the clean prediction (None when
  `none` changed none).

On the clean set, a defense's `changed` is what it does to clean text (scored when ttt.score_clean is on). Each share
has a Wilson score interval (statsmodels' `proportion_confint`: it stays inside [0, 1] and keeps its coverage at
shares near 0 or 1 and at the few reviews a restored share often counts, where the normal interval does not). A
masked defense is read at its first mask seed, as the forecast's calibration reads it. These are changes, not
accuracy: a changed prediction may have been wrong on the clean text (the issue's probe: at the highest misspelling
severity 10% of predictions changed while accuracy did not fall).
"""

from __future__ import annotations

import pandas as pd
from statsmodels.stats.proportion import proportion_confint

from ttt_pipeline.defenses.registry import method_tag


def share(count: int, n: int, confidence: float) -> dict | None:
    """{share, ci_low, ci_high, count, n}: count / n with its Wilson interval at `confidence`; None when n is 0."""
    if n == 0:
        return None
    low, high = proportion_confint(count, n, alpha=1 - confidence, method="wilson")
    return {"share": count / n, "ci_low": float(low), "ci_high": float(high), "count": int(count), "n": int(n)}


def _predictions(frame: pd.DataFrame, set_name: str, method: str):
    """One set's predicted classes under one method in review order (a masked method's first mask seed); None
    when the method did not score the set."""
    rows = frame[(frame["set"] == set_name) & (frame["method"] == method)]
    if rows.empty:
        return None
    seeds = rows["mask_seed"].dropna()
    if len(seeds):
        rows = rows[rows["mask_seed"] == seeds.min()]
    return rows.sort_values("index")["pred"].to_numpy()


def label_free_grid(predictions: pd.DataFrame, confidence: float) -> list[dict]:
    """One row per scored set of the evaluate step's `predictions` (clean first, then the corrupted sets in their
    order): {set, family, severity, n, changed, defenses: {method: {changed, restored}}} as in the module
    docstring (`changed` of the clean set is None: it is the reference)."""
    clean = _predictions(predictions, "clean", "none")
    if clean is None:
        raise ValueError("the predictions hold no clean reviews under none: the label-free grid compares every "
                         "set with them")
    methods = [m for m in dict.fromkeys(predictions["method"]) if m != "none"]
    sets = predictions.drop_duplicates("set")[["set", "kind", "family", "severity"]]
    out = []
    for s in sets.itertuples(index=False):
        if s.kind not in ("clean", "corrupted"):  # shifted domains are other reviews: no clean copy to compare
            continue
        raw = clean if s.set == "clean" else _predictions(predictions, s.set, "none")
        moved = raw != clean
        row = {"set": s.set, "family": None if s.kind == "clean" else s.family,
               "severity": None if s.kind == "clean" else int(s.severity), "n": len(clean),
               "changed": None if s.kind == "clean" else share(int(moved.sum()), len(clean), confidence),
               "defenses": {}}
        for m in methods:
            fixed = _predictions(predictions, s.set, m)
            if fixed is None:
                continue
            back = (fixed == clean) & moved
            row["defenses"][m] = {"changed": share(int((fixed != clean).sum()), len(clean), confidence),
                                  "restored": share(int(back.sum()), int(moved.sum()), confidence)}
        out.append(row)
    return out


def flat_metrics(grid: list[dict]) -> dict[str, float]:
    """The grid as MLflow metrics: `changed/<family>/<severity>/none` and, per defense, `changed/.../<defense>` and
    `restored/.../<defense>` (the clean set as `changed/clean/<defense>`); shares as fractions."""
    out: dict[str, float] = {}
    for row in grid:
        where = "clean" if row["family"] is None else f"{row['family']}/{row['severity']}"
        if row["changed"] is not None:
            out[f"changed/{where}/none"] = row["changed"]["share"]
        for m, d in row["defenses"].items():
            for what in ("changed", "restored"):
                if d[what] is not None:
                    out[f"{what}/{where}/{method_tag(m)}"] = d[what]["share"]
    return out
