"""A run's summaries: the headline table and its paired differences (terminal and markdown).

Differences are read from the flat metrics (`name`, `name_ci_low`, `name_ci_high`, ...: what the run logs to
MLflow), so the run's summary, `ttt-pipeline report` and the Prefect artifact print the same numbers.
"""

from __future__ import annotations

from ttt_pipeline.evaluation.stats import verdict

ROWS = [("acc_clean", "clean accuracy"), ("acc_corrupted", "corrupted accuracy"),
        ("acc_default", "corrupted accuracy with the default defense"),
        ("recovered_fraction", "recovered fraction of the drop (default defense)"),
        ("acc_clean_default", "clean accuracy with the default defense"),
        ("acc_ttt", "corrupted accuracy with masked TTT"), ("acc_clean_ttt", "clean accuracy with masked TTT"),
        ("acc_tent", "corrupted accuracy with Tent"), ("acc_shift", "domain-shift accuracy"),
        ("acc_shift_default", "domain-shift accuracy with the default defense"),
        ("acc_shift_ttt", "domain-shift accuracy with TTT"),
        ("acc_external", "external generators' accuracy (held out)"),
        ("acc_external_default", "external generators' accuracy with the default defense"),
        ("macro_f1_clean", "clean macro-F1")]
# the headline differences first: the drop, then what the recommended defense wins back
FIRST = ("corruption_drop", "defense_gain", "defense_clean_change", "external_drop", "defense_external_gain")


def fmt(v) -> str:
    return "-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)


def difference_label(name: str, defense: str | None = None) -> str | None:
    """What a flat difference metric compares, in words; None for per-set ones (shown by the grid)."""
    if name == "corruption_drop":
        return "corruption drop (clean - corrupted, no defense)"
    if name == "external_drop":
        return "external generators' drop (clean - ext: sets, no defense)"
    if name in ("defense_gain", "defense_clean_change", "defense_external_gain"):
        which = f"default defense ({defense})" if defense else "default defense"
        part = {"defense_gain": "corrupted", "defense_clean_change": "clean"}.get(name, "external generators")
        return f"{which} - none, {part}"
    if name == "ttt_gain":
        return "masked TTT - none, corrupted"
    if name == "ttt_clean_change":
        return "masked TTT - none, clean"
    if name.startswith("ttt_shift_change_"):
        return f"masked TTT - none, shift {name.removeprefix('ttt_shift_change_')}"
    parts = name.split("/")
    # gain/<method>/<corrupted|clean|shift_x>; per-set ones (gain/clean/<method>, gain/<family>/<sev>/<method>)
    # are the grid's
    if (parts[0] == "gain" and len(parts) == 3 and parts[1] != "ttt" and parts[1] != "clean"
            and not parts[1].startswith("shift_")
            and (parts[2] in ("corrupted", "external", "clean") or parts[2].startswith("shift_"))):
        return f"{parts[1]} - none, {parts[2].replace('_', ' ')}"
    return None


def differences(metrics: dict, defense: str | None = None) -> list[tuple[str, dict]]:
    """(label, difference) for every headline difference among flat metrics: the drop and the default defense's
    (`defense`) figures first, then the others in a stable order."""
    out = []
    for name in sorted(metrics, key=lambda k: FIRST.index(k) if k in FIRST else len(FIRST)):
        label = difference_label(name, defense)
        if label is None or f"{name}_ci_low" not in metrics:
            continue
        d = {"delta": metrics[name], **{k: metrics.get(f"{name}_{k}") for k in
                                        ("ci_low", "ci_high", "p_mcnemar", "helped", "hurt", "significant")}}
        d["significant"] = bool(d["significant"])
        out.append((label, d))
    return out


def difference_line(d: dict) -> tuple[str, str, str, str]:
    """(difference in points, interval, McNemar p, verdict with helped/hurt counts)."""
    return (f"{100 * d['delta']:+.2f}", f"[{100 * d['ci_low']:+.2f}, {100 * d['ci_high']:+.2f}]",
            f"p={d['p_mcnemar']:.3g}", f"{verdict(d)} (helped {int(d['helped'])}, hurt {int(d['hurt'])})")


def differences_table(metrics: dict, mask_seeds: int | None = None, defense: str | None = None) -> str:
    diffs = differences(metrics, defense)
    if not diffs:
        return ""
    width = max(len(label) for label, _ in diffs)
    seeds = f", masked methods pooled over {mask_seeds} mask seeds" if mask_seeds else ""
    lines = [f"paired differences in accuracy points (95% bootstrap interval over reviews, exact McNemar p{seeds}):"]
    lines += [f"  {label:<{width}}  {'  '.join(difference_line(d))}" for label, d in diffs]
    return "\n".join(lines)


def worst_cases(metrics: dict, summary: dict | None = None) -> list[tuple[str, dict]]:
    """(method tag, its worst case) from the flat metrics `worst/<tag>` (and `harm/<tag>`); the set's name and the
    harmed sets come from the summary's `worst_case` when given."""
    from ttt_pipeline.evaluation.scoring import method_tag

    named = {method_tag(m): w for m, w in ((summary or {}).get("worst_case") or {}).items()}
    out = []
    for name in sorted(k for k in metrics if k.startswith("worst/") and f"{k}_ci_low" in metrics):
        tag = name.removeprefix("worst/")
        w = {"delta": metrics[name], "ci_low": metrics[f"{name}_ci_low"], "ci_high": metrics[f"{name}_ci_high"],
             "harm": bool(metrics.get(f"harm/{tag}", 0.0))}
        w.update({k: named[tag][k] for k in ("set", "harmed_sets", "n_sets") if tag in named})
        out.append((tag, w))
    return out


def worst_case_table(metrics: dict, summary: dict | None = None) -> str:
    """Each defense's lowest paired change over every scored set, and HARM where an interval lies below 0."""
    rows = worst_cases(metrics, summary)
    if not rows:
        return ""
    width = max(len(tag) for tag, _ in rows)
    lines = ["worst case per defense (its lowest paired change vs none over every scored set; harm: a set's "
             "whole interval below 0):"]
    for tag, w in rows:
        where = f" on {w['set']}" if w.get("set") else ""
        flag = ("HARM on " + ", ".join(w.get("harmed_sets") or ["a set"])) if w["harm"] else "no harm shown"
        lines.append(f"  {tag:<{width}}  {100 * w['delta']:+.2f} [{100 * w['ci_low']:+.2f}, "
                     f"{100 * w['ci_high']:+.2f}]{where}  {flag}")
    return "\n".join(lines)


def headline_table(summary: dict, metrics: dict | None = None) -> str:
    """The accuracies, then every headline difference with its interval and verdict (`metrics`: the flat
    metrics of the run; taken from the summary's own objects when not given)."""
    lines = [(label, fmt(summary[key])) for key, label in ROWS if key in summary]
    width = max(len(label) for label, _ in lines) if lines else 10
    text = "\n".join(f"{label:<{width}}  {value}" for label, value in lines)
    if metrics is None:
        from ttt_pipeline.evaluation.robustness import flat_metrics

        metrics = flat_metrics(summary)
    seeds = len((summary.get("ttt_gain") or {}).get("mask_seeds") or []) or None
    table = differences_table(metrics, seeds, summary.get("default_defense"))
    worst = worst_case_table(metrics, summary)
    return "\n\n".join(part for part in (text, table, worst) if part)


def run_link(summary: dict, tracker=None) -> str:
    uri = summary.get("mlflow_tracking_uri", "")
    rid, eid = summary["mlflow_run_id"], summary.get("experiment_id", "")
    base = uri if uri.startswith("http") else "http://127.0.0.1:5000"
    return f"{base}/#/experiments/{eid}/runs/{rid}"


def differences_markdown(metrics: dict, defense: str | None = None) -> str:
    diffs = differences(metrics, defense)
    if not diffs:
        return ""
    body = "\n".join(f"| {label} | {' | '.join(difference_line(d))} |" for label, d in diffs)
    return ("| paired difference | points | 95% interval | McNemar | verdict |\n|---|---|---|---|---|\n"
            f"{body}\n\n")


def headline_markdown(summary: dict, tracker=None) -> str:
    from ttt_pipeline.evaluation.robustness import flat_metrics

    defense = summary.get("default_defense")
    rows = "\n".join(f"| {label} | {fmt(summary[key])} |" for key, label in ROWS if key in summary)
    flat = flat_metrics(summary)
    rows += "\n\n" + differences_markdown(flat, defense)
    worst = worst_cases(flat, summary)
    if worst:
        rows += ("| defense | worst paired change | 95% interval | on | harm |\n|---|---|---|---|---|\n" + "".join(
            f"| {tag} | {100 * w['delta']:+.2f} | [{100 * w['ci_low']:+.2f}, {100 * w['ci_high']:+.2f}] | "
            f"{w.get('set', '-')} | {'HARM: ' + ', '.join(w.get('harmed_sets') or []) if w['harm'] else 'no'} |\n"
            for tag, w in worst) + "\n")
    reg = summary.get("registry") or {}
    registry = (f"Model registry: `{reg.get('model_name')}` version {reg.get('version')} {reg.get('decision', '')} "
                f"on {reg.get('metric')} ({reg.get('reason', '')})\n\n" if reg else "")
    lead = f"Default defense: `{defense}` (evaluation.default_defense)\n\n" if defense else ""
    report = (f"\nReport of the reviews the noise flipped, fixed and broke: [report.html]({summary['report']}) "
              "(the run's artifact)\n" if summary.get("report") else "")
    return (f"# TTT pipeline run\n\n{lead}| metric | value |\n|---|---|\n{rows}\n\n"
            f"Cached tasks: {summary.get('cached_tasks', 0)}/{len(summary.get('cached') or {}) or 5} · "
            f"wall time {summary.get('wall_s', 0):.1f} s\n\n"
            f"{registry}MLflow run: [{summary['mlflow_run_id']}]({run_link(summary, tracker)})\n{report}")
