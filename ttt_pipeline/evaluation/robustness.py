"""What a run concludes from its per-review predictions: paired comparisons and ImageNet-C style aggregates.

Input is the evaluate step's predictions table (one row per set x method x mask seed x review: `kind`, `set`,
`family`, `severity`, `method`, `mask_seed`, `index`, `label`, `pred`). Everything here is recomputable after the
fact from that table; nothing re-runs a model. Definitions (docs/metrics.md):

- comparisons: every method against `none` on each set, pooled over mask seeds; each corrupted set against clean;
- gains pooled over the corrupted sets: a review's correctness is averaged over sets and mask seeds first;
- corruption error of family f: CE_f = sum_s E(f, s) / sum_s E_ref(f, s) (E = error = 1 - accuracy); mCE is the
  mean over families; relative CE_f = sum_s (E(f, s) - E_clean) / sum_s (E_ref(f, s) - E_ref,clean) and its mean,
  relative mCE (Hendrycks and Dietterich 2019). The reference is another run's `none` scores, or this run's own;
- recovery ratio of a method in family f: sum_s (acc_m - acc_none) / sum_s (acc_clean - acc_none), averaged over
  families whose summed drop is positive (undefined, None, where corruption did not lower accuracy);
- flip rate: share of reviews whose `none` prediction on a corrupted set differs from its clean prediction.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ttt_pipeline.corruption.external import is_external
from ttt_pipeline.defenses.registry import headline_method
from ttt_pipeline.evaluation.stats import Difference, paired_difference


def _matrix(preds: pd.DataFrame, sets: list[str], method: str, column: str = "correct") -> np.ndarray | None:
    """reviews x (sets x mask seeds) of `column` for a method, reviews in `index` order; None if absent."""
    part = preds[(preds["method"] == method) & preds["set"].isin(sets)]
    if part.empty:
        return None
    seeds = part["mask_seed"].fillna(-1).astype(int)
    wide = part.assign(draw=part["set"] + "#" + seeds.astype(str)).pivot(index="index", columns="draw", values=column)
    return wide.sort_index().to_numpy()


def _with_correct(preds: pd.DataFrame) -> pd.DataFrame:
    return preds if "correct" in preds else preds.assign(correct=(preds["pred"] == preds["label"]).astype(float))


def compare_methods(preds: pd.DataFrame, sets: list[str], method: str, base: str = "none", n_classes: int | None = None,
                    **kw) -> Difference | None:
    """`method` against `base` on the same reviews, pooled over `sets` and mask seeds."""
    preds = _with_correct(preds)
    a, b = _matrix(preds, sets, base), _matrix(preds, sets, method)
    if a is None or b is None:
        return None
    f1 = {}
    if n_classes:
        labels = _matrix(preds, sets[:1], base, "label")[:, 0]
        f1 = dict(labels=labels, pred_a=_matrix(preds, sets, base, "pred"), pred_b=_matrix(preds, sets, method, "pred"),
                  n_classes=n_classes)
    return paired_difference(a, b, **f1, **kw)


def compare_sets(preds: pd.DataFrame, set_a: str, set_b: str, method: str = "none", **kw) -> Difference | None:
    """Set b against set a under one method, on the same reviews (clean vs corrupted: a drop is b=clean)."""
    preds = _with_correct(preds)
    a, b = _matrix(preds, [set_a], method), _matrix(preds, [set_b], method)
    return None if a is None or b is None else paired_difference(a, b, **kw)


def _int(v) -> int | None:
    return None if v is None else int(v)


def sets_of(preds: pd.DataFrame, kind: str) -> list[str]:
    return list(dict.fromkeys(preds.loc[preds["kind"] == kind, "set"]))


def corrupted_parts(preds: pd.DataFrame) -> tuple[list[str], list[str]]:
    """(the own suite's corrupted sets, the external generators' sets): `ext:` families are the held-out test of a
    defense, reported apart and never pooled with the suite it was chosen on."""
    part = preds[preds["kind"] == "corrupted"].drop_duplicates("set")
    external = {s for s, f in zip(part["set"], part["family"]) if is_external(f or "")}
    sets = sets_of(preds, "corrupted")
    return [s for s in sets if s not in external], [s for s in sets if s in external]


def comparisons(preds: pd.DataFrame, n_classes: int | None = None, **kw) -> list[dict]:
    """Every method against `none` on every set, and every corrupted set against clean (both without defense)."""
    preds = _with_correct(preds)
    out = []
    meta = preds.drop_duplicates("set").set_index("set")[["kind", "family", "severity"]].astype(object)
    meta = meta.where(meta.notna(), None)
    for s in dict.fromkeys(preds["set"]):
        for m in dict.fromkeys(preds.loc[preds["set"] == s, "method"]):
            if m == "none":
                continue
            d = compare_methods(preds, [s], m, n_classes=n_classes, **kw)
            if d is not None:
                out.append({"comparison": "method", "set": s, "kind": meta.at[s, "kind"], "family": meta.at[s, "family"],
                            "severity": _int(meta.at[s, "severity"]), "method": m, "base": "none", **d.to_dict()})
    if "clean" in set(preds["set"]):
        for s in sets_of(preds, "corrupted"):
            d = compare_sets(preds, "clean", s, **kw)
            if d is not None:
                out.append({"comparison": "corruption", "set": s, "kind": "corrupted", "family": meta.at[s, "family"],
                            "severity": _int(meta.at[s, "severity"]), "method": "none", "base": "clean", **d.to_dict()})
    return out


def _acc_table(rows: list[dict]) -> dict:
    """(kind, family, severity, method) -> mean accuracy over mask seeds, from the evaluate rows."""
    acc: dict[tuple, list[float]] = {}
    for r in rows:
        acc.setdefault((r["kind"], r.get("family"), r.get("severity"), r["method"]), []).append(r["acc"])
    return {k: float(np.mean(v)) for k, v in acc.items()}


def corruption_errors(rows: list[dict], method: str, reference_rows: list[dict] | None = None) -> dict | None:
    """CE per family, mCE, relative mCE of a method, against the reference's `none` scores (else this run's)."""
    mine, ref = _acc_table(rows), _acc_table(reference_rows if reference_rows is not None else rows)
    clean = mine.get(("clean", None, None, method))
    ref_clean = ref.get(("clean", None, None, "none"))
    families = sorted({k[1] for k in mine if k[0] == "corrupted" and k[3] == method and not is_external(k[1])})
    ce, rel = {}, {}
    for f in families:
        sevs = sorted(k[2] for k in mine if k[0] == "corrupted" and k[1] == f and k[3] == method)
        if not all(("corrupted", f, s, "none") in ref for s in sevs):
            continue
        err = [1 - mine[("corrupted", f, s, method)] for s in sevs]
        ref_err = [1 - ref[("corrupted", f, s, "none")] for s in sevs]
        ce[f] = sum(err) / sum(ref_err) if sum(ref_err) > 0 else None
        if clean is not None and ref_clean is not None:
            ref_gap = sum(e - (1 - ref_clean) for e in ref_err)
            rel[f] = sum(e - (1 - clean) for e in err) / ref_gap if ref_gap > 1e-12 else None
    if not ce:
        return None
    mean = lambda d: (float(np.mean([v for v in d.values() if v is not None]))  # noqa: E731
                      if any(v is not None for v in d.values()) else None)
    return {"ce": ce, "mce": mean(ce), "relative_ce": rel, "rel_mce": mean(rel)}


def recovery_ratio(rows: list[dict], method: str) -> float | None:
    """Mean over families of the share of the summed corruption drop that a method wins back."""
    acc = _acc_table(rows)
    clean = acc.get(("clean", None, None, "none"))
    if clean is None:
        return None
    ratios = []
    for f in sorted({k[1] for k in acc if k[0] == "corrupted" and k[3] == method and not is_external(k[1])}):
        sevs = [k[2] for k in acc if k[0] == "corrupted" and k[1] == f and k[3] == method]
        drop = sum(clean - acc[("corrupted", f, s, "none")] for s in sevs)
        if drop > 1e-12:
            ratios.append(sum(acc[("corrupted", f, s, method)] - acc[("corrupted", f, s, "none")] for s in sevs) / drop)
    return float(np.mean(ratios)) if ratios else None


def flip_rate(preds: pd.DataFrame, method: str = "none") -> float | None:
    """Share of (review, corrupted set) pairs whose prediction differs from the clean one (mean over seeds)."""
    part = preds[preds["method"] == method]
    clean = part[part["set"] == "clean"]
    corrupted = part[part["kind"] == "corrupted"]
    if clean.empty or corrupted.empty:
        return None
    on = ["index"] + (["mask_seed"] if method != "none" else [])
    merged = corrupted.merge(clean[on + ["pred"]], on=on, suffixes=("", "_clean"))
    return float((merged["pred"] != merged["pred_clean"]).mean()) if len(merged) else None


def summarize_methods(rows: list[dict], preds: pd.DataFrame, reference_rows: list[dict] | None = None) -> dict:
    """Per method: mCE, relative mCE, recovery ratio, clean-accuracy change, flip rate."""
    acc = _acc_table(rows)
    clean_none = acc.get(("clean", None, None, "none"))
    out = {}
    for m in dict.fromkeys(r["method"] for r in rows):
        ce = corruption_errors(rows, m, reference_rows) or {}
        clean_m = acc.get(("clean", None, None, m))
        out[m] = {"mce": ce.get("mce"), "rel_mce": ce.get("rel_mce"), "ce": ce.get("ce"),
                  "relative_ce": ce.get("relative_ce"), "recovery_ratio": None if m == "none" else recovery_ratio(rows, m),
                  "clean_change": None if m == "none" or clean_m is None or clean_none is None else clean_m - clean_none,
                  "flip_rate": flip_rate(preds, m)}
    return out


def pooled_drop(preds: pd.DataFrame, external: bool = False, **kw) -> Difference | None:
    """Clean minus corrupted accuracy without defense, pooled over the own suite's corrupted sets (`external`: the
    external generators' sets instead), paired per review."""
    preds = _with_correct(preds)
    corrupted = corrupted_parts(preds)[1 if external else 0]
    if not corrupted:
        return None
    a, b = _matrix(preds, corrupted, "none"), _matrix(preds, ["clean"], "none")
    return None if a is None or b is None else paired_difference(a, b, **kw)


def method_gains(preds: pd.DataFrame, method: str, **kw) -> dict:
    """A method against `none`: on the own suite's corrupted sets pooled (`corrupted`), on the external generators'
    sets pooled (`external`, when scored), on clean text, and on each shift domain."""
    own, external = corrupted_parts(preds)
    out = {}
    for part, sets in (("corrupted", own), ("external", external)):
        if sets and (d := compare_methods(preds, sets, method, **kw)) is not None:
            out[part] = d.to_dict()
    if (d := compare_methods(preds, ["clean"], method, **kw)) is not None:
        out["clean"] = d.to_dict()
    shift = {s.removeprefix("shift_"): d.to_dict() for s in sets_of(preds, "shift")
             if (d := compare_methods(preds, [s], method, **kw)) is not None}
    if shift:
        out["shift"] = shift
    return out


def augment_partition(preds: pd.DataFrame, families: list[str], n_classes: int | None = None, **kw) -> dict | None:
    """A model trained on corrupted copies (finetune.augment) has seen `families`: its figures there measure
    in-distribution noise. Reports `trained` (corrupted sets of those families) apart from `held_out` (the
    others), each with its `families`, `sets`, `corruption_drop` (clean minus corrupted without defense, pooled),
    every method's `acc` (pooled over the part's sets and mask seeds) and `gains` over none (pooled, paired)."""
    preds = _with_correct(preds)
    family_of = preds.drop_duplicates("set").set_index("set")["family"]
    corrupted = sets_of(preds, "corrupted")
    out = {}
    for part, inside in (("trained", True), ("held_out", False)):
        sets = [s for s in corrupted if (family_of[s] in families) == inside]
        if not sets:
            continue
        here = preds[preds["set"].isin(sets)]
        entry: dict = {"families": sorted({str(family_of[s]) for s in sets}), "sets": sets}
        a, b = _matrix(preds, sets, "none"), _matrix(preds, ["clean"], "none")
        if a is not None and b is not None:
            entry["corruption_drop"] = paired_difference(a, b, **kw).to_dict()
        entry["acc"] = {m: float(here.loc[here["method"] == m, "correct"].mean())
                        for m in dict.fromkeys(here["method"])}
        entry["gains"] = {m: d.to_dict() for m in entry["acc"] if m != "none"
                          and (d := compare_methods(preds, sets, m, n_classes=n_classes, **kw)) is not None}
        out[part] = entry
    return out or None


def worst_case(per_set: list[dict]) -> dict:
    """Per method, its lowest paired change against none over every scored set (each corrupted set of every family
    and severity, external ones included, clean text, each shift domain; from `comparisons`): `delta`, `ci_low`,
    `ci_high`, `set`, `n_sets`, and `harm` (true when any set's interval lies wholly below 0) with `harmed_sets`."""
    out: dict = {}
    for c in per_set:
        if c["comparison"] != "method":
            continue
        e = out.setdefault(c["method"], {"n_sets": 0, "harmed_sets": [], "delta": float("inf")})
        e["n_sets"] += 1
        if c["ci_high"] < 0:
            e["harmed_sets"].append(c["set"])
        if c["delta"] < e["delta"]:
            e.update({k: c[k] for k in ("delta", "n", *_DIFF_FIELDS)}, set=c["set"])
    for e in out.values():
        e["harm"] = bool(e["harmed_sets"])
    return out


def run_statistics(rows: list[dict], preds: pd.DataFrame, mask_seeds: list[int],
                   reference_rows: list[dict] | None = None, n_classes: int | None = None,
                   default_defense: str | None = None, augment_families: list[str] | None = None, **kw) -> dict:
    """The run's contract: defense_gain (the recommended defense, `default_defense`, vs none on the corrupted
    sets: the headline, with `method`) and defense_clean_change (the same on clean text, when scored),
    corruption_drop, every method's gains, ttt_gain / ttt_clean_change / ttt_shift_change (masked TTT vs none,
    pooled over sets and mask seeds, when it was scored), and mce / rel_mce / flip_rate per method. With external
    generators' sets (`ext:` families): external_drop and defense_external_gain, apart from the own suite (which
    alone makes corruption_drop, defense_gain, the gains' `corrupted` and mCE). worst_case: every method's lowest
    paired change over all scored sets and its `harm` flag (worst_case())."""
    out: dict = {}
    if (drop := pooled_drop(preds, **kw)) is not None:
        out["corruption_drop"] = drop.to_dict()
    if (drop := pooled_drop(preds, external=True, **kw)) is not None:
        out["external_drop"] = drop.to_dict()  # the held-out generators: apart from the suite
    gains = {m: method_gains(preds, m, n_classes=n_classes, **kw) for m in dict.fromkeys(preds["method"]) if m != "none"}
    out["gains"] = gains
    ttt = gains.get(headline_method("ttt"), {})  # the ttt_* keys: one scored method among others (the headline
    # is the recommended defense's defense_gain)
    for key, part in (("ttt_gain", "corrupted"), ("ttt_clean_change", "clean")):
        if part in ttt:
            out[key] = {**ttt[part], "mask_seeds": list(mask_seeds)}
    if "shift" in ttt:
        out["ttt_shift_change"] = {k: {**v, "mask_seeds": list(mask_seeds)} for k, v in ttt["shift"].items()}
    if default_defense and "corrupted" in gains.get(default_defense, {}):
        from ttt_pipeline.defenses.registry import parse

        seeds = {"mask_seeds": list(mask_seeds)} if parse(default_defense).masked else {}
        out["defense_gain"] = {**gains[default_defense]["corrupted"], "method": default_defense, **seeds}
        if "clean" in gains[default_defense]:
            out["defense_clean_change"] = {**gains[default_defense]["clean"], "method": default_defense, **seeds}
        if "external" in gains[default_defense]:
            out["defense_external_gain"] = {**gains[default_defense]["external"], "method": default_defense, **seeds}
    if gains:
        out["worst_case"] = worst_case(comparisons(preds, **kw))
    if augment_families and (part := augment_partition(preds, augment_families, n_classes, **kw)) is not None:
        out["augment_families"] = part  # robust training: families trained on apart from held-out ones
    methods = summarize_methods(rows, preds, reference_rows)
    for key in ("mce", "rel_mce", "flip_rate"):
        vals = {m: v[key] for m, v in methods.items() if v[key] is not None}
        if vals:
            out[key] = vals
    out["methods"] = methods
    return out


CONTRACT = ("corruption_drop", "defense_gain", "defense_clean_change", "ttt_gain", "ttt_clean_change", "ttt_shift_change",
            "mce", "rel_mce", "flip_rate", "augment_families", "external_drop", "defense_external_gain", "worst_case")
_DIFF_FIELDS = ("ci_low", "ci_high", "p_mcnemar", "helped", "hurt", "significant")


def flat_metrics(stats: dict, per_set: list[dict] | None = None) -> dict[str, float]:
    """MLflow metrics of the statistics: each difference `name` with `name_ci_low`, `name_ci_high`,
    `name_p_mcnemar`, `name_helped`, `name_hurt`, `name_significant` (1/0) companions."""
    from ttt_pipeline.evaluation.scoring import method_tag

    out: dict[str, float] = {}

    def diff(name: str, d: dict) -> None:
        out[name] = d["delta"]
        out.update({f"{name}_{k}": float(d[k]) for k in _DIFF_FIELDS})

    for key in ("corruption_drop", "defense_gain", "defense_clean_change", "ttt_gain", "ttt_clean_change",
                "external_drop", "defense_external_gain"):
        if key in stats:
            diff(key, stats[key])
    for m, w in stats.get("worst_case", {}).items():
        if "ci_low" in w:
            diff(f"worst/{method_tag(m)}", w)
        out[f"harm/{method_tag(m)}"] = float(w["harm"])
    for dom, d in stats.get("ttt_shift_change", {}).items():
        diff(f"ttt_shift_change_{dom}", d)
    for part, e in stats.get("augment_families", {}).items():
        if "corruption_drop" in e:
            diff(f"augment/{part}/drop", e["corruption_drop"])
        for m, d in e["gains"].items():
            diff(f"augment/{part}/gain/{method_tag(m)}", d)
    for m, g in stats.get("gains", {}).items():
        for part in ("corrupted", "external", "clean"):
            if part in g:
                diff(f"gain/{method_tag(m)}/{part}", g[part])
        for dom, d in g.get("shift", {}).items():
            diff(f"gain/{method_tag(m)}/shift_{dom}", d)
    for key in ("mce", "rel_mce", "flip_rate"):
        for m, v in stats.get(key, {}).items():
            out[f"{key}/{method_tag(m)}"] = v
    for c in per_set or []:
        where = f"{c['family']}/{c['severity']}" if c["kind"] == "corrupted" else c["set"]
        diff(f"drop/{where}" if c["comparison"] == "corruption" else f"gain/{where}/{method_tag(c['method'])}", c)
    return out


def regression_between(previous: pd.DataFrame, tonight: pd.DataFrame, method: str, threshold: float,
                       **kw) -> dict | None:
    """Tonight minus the previous night on the same reviews of the fixed reference suite, for one method pooled
    over its corrupted sets and mask seeds. `regression` is true only when the whole interval lies below
    -threshold: a drop the interval cannot tell from noise (another mask seed, say) never fires. None when the
    two nights did not score the same reviews (then nothing can be said)."""
    previous, tonight = _with_correct(previous), _with_correct(tonight)
    sets = [s for s in sets_of(tonight, "corrupted") if s in set(previous["set"])]
    a, b = _matrix(previous, sets, method), _matrix(tonight, sets, method)
    if a is None or b is None:
        return None
    la, lb = _matrix(previous, sets[:1], method, "label"), _matrix(tonight, sets[:1], method, "label")
    if la.shape != lb.shape or not np.array_equal(la[:, 0], lb[:, 0]):
        return None
    d = paired_difference(a, b, **kw).to_dict()
    return {**d, "threshold": threshold, "method": method, "sets": sets, "regression": bool(d["ci_high"] < -threshold)}
