"""The nightly check's markdown: the night's report, and what to do when there is no champion yet."""

from __future__ import annotations

ALIAS = "champion"


def no_champion_report(message: str, hint: str, tracking_uri: str, night: str) -> str:
    from ttt_pipeline.errors import redact

    return (f"# ⏸ No champion yet: nothing was re-evaluated\n\n"
            f"Night {night}: {message} (MLflow at `{redact(tracking_uri)}`).\n\n"
            f"**What to do:** {hint[0].upper()}{hint[1:]}. Deployments → `ttt-pipeline` → Run starts it "
            f"with the same default configuration as this flow; once it has finished, the next night (or a run "
            f"started now) re-evaluates its model.\n\n"
            f"This run fails once, without retries: a retry would find no champion either.\n")


def night_report(night: str, mv, now: dict, prev, threshold: float, regression: bool, run_link: str,
                 defense: str, extra: dict) -> str:
    """The night's markdown: verdict, tonight against the previous night, the alarm's evidence and power, the new
    reviews. `mv` is the champion's model version, `prev` the previous night's MLflow run (or None)."""
    def f(v):
        return "-" if v is None else f"{v:.3f}"

    head = (f"# ❌ REGRESSION — `{defense}` robust accuracy fell significantly by more than {100 * threshold:.1f} "
            "points\n\n" if regression else f"# ✅ Nightly re-evaluation of `{defense}`: no regression\n\n")
    rows = [("clean accuracy", "acc_clean"), (f"clean accuracy with {defense}", "acc_clean_ttt"),
            ("reference suite, corrupted", "acc_corrupted_ref"),
            (f"reference suite, with {defense} (robust)", "robust_acc_ref"),
            ("tonight's suite, corrupted", "acc_corrupted_night"), (f"tonight's suite, with {defense}", "robust_acc_night")]
    pm = prev.data.metrics if prev is not None else {}
    table = "\n".join(f"| {label} | {f(now.get(k))} | {f(pm.get(k))} |" for label, k in rows)
    prev_line = (f"Previous night: {prev.data.tags.get('night')} (MLflow run `{prev.info.run_id}`)" if prev is not None
                 else "No previous night (first run).")
    return (f"{head}Model `{mv.name}` version {mv.version} (alias `{ALIAS}`, source run `{mv.run_id}`), "
            f"defense `{defense}` (evaluation.default_defense), night {night}.\n\n"
            f"| metric | tonight | previous night |\n|---|---|---|\n{table}\n\n{prev_line}\n\n"
            f"{change_line(now, threshold, extra.get('reference'))}\n\n{power_line(extra)}\n\n"
            f"{new_reviews_lines(extra.get('new_data'), defense)}MLflow run: {run_link}\n")


def power_line(extra: dict) -> str:
    mdd, n = extra.get("min_detectable_drop"), extra.get("reference_n")
    if mdd is None:
        return f"{n} reviews: no drop is detectable at this threshold." if n else ""
    return (f"Power: the reference suite has {n} reviews; the alarm detects (80% power) a drop of at least "
            f"{100 * mdd:.1f} points (min_detectable_drop); a smaller regression passes unseen.")


def new_reviews_lines(new: dict | None, defense: str) -> str:
    if not new:
        return ""
    w, d = new["with_defense"], new["drift"]
    return (f"New reviews ({new['n']}, `{new['source']}`): accuracy with {defense} {w['acc']:.3f} against "
            f"{w['acc_reference']:.3f} on the test split: {100 * w['delta']:+.2f} points, 95% interval "
            f"[{100 * w['ci_low']:+.2f}, {100 * w['ci_high']:+.2f}] (Newcombe, unpaired). Drift: label shares "
            f"{d['label_shares']['new']} (training {d['label_shares']['train']}), mean words "
            f"{d['mean_words']['new']:.1f} (training {d['mean_words']['train']:.1f}), words unseen in training "
            f"{d['unseen_word_share']['new']:.3f} (test split {d['unseen_word_share']['test']:.3f}).\n\n")


def change_line(now: dict, threshold: float, reference: dict | None) -> str:
    """The alarm's evidence: the paired change with its interval, and what the rule made of it."""
    if "robust_acc_change" not in now:
        return ("No paired baseline (no previous night with stored predictions, and the champion's pipeline run "
                "has none for this suite): nothing to compare, no alarm.")
    c, lo, hi = (100 * now[k] for k in ("robust_acc_change", "robust_acc_change_ci_low", "robust_acc_change_ci_high"))
    fired = hi < -100 * threshold
    return (f"Robust accuracy change, tonight minus {reference['against']} on the same reference reviews: {c:+.2f} "
            f"points, 95% paired interval [{lo:+.2f}, {hi:+.2f}], McNemar p={now['robust_acc_change_p_mcnemar']:.3g}. "
            f"The alarm fires only when the whole interval lies below -{100 * threshold:.2f} points: "
            + ("it does." if fired else "it does not."))
