"""The run's report: one self-contained HTML page (no script, no font or style from elsewhere) with the headline
and its intervals and, for each corrupted set, the reviews the noise flipped (clean beside corrupted, the changed
words marked, the prediction and its probability on each), the ones the recommended defense fixed and the ones
it broke. Each list is counted whole and shown up to `cap` rows.

flipped: the prediction without a defense differs between the clean review and its corrupted copy; fixed: wrong
on the corrupted copy without a defense, right under the recommended defense; broke: the other way round.
"""

from __future__ import annotations

import difflib
import html
from typing import Callable

import numpy as np
import pandas as pd

LISTS = ("flipped", "fixed", "broke")
CAP = 50


def _first_seed(preds: pd.DataFrame, set_name: str, method: str) -> pd.DataFrame | None:
    """One set's rows under one method, by review index (a masked method's first mask seed)."""
    rows = preds[(preds["set"] == set_name) & (preds["method"] == method)]
    if rows.empty:
        return None
    if rows["mask_seed"].notna().any():
        rows = rows[rows["mask_seed"] == rows["mask_seed"].min()]
    return rows.sort_values("index").set_index("index")


def flips(preds: pd.DataFrame, set_name: str, default: str | None) -> dict[str, list[int]] | None:
    """The review indices of each list (LISTS) for one corrupted set; None when its clean scores are missing."""
    clean, noisy = _first_seed(preds, "clean", "none"), _first_seed(preds, set_name, "none")
    if clean is None or noisy is None:
        return None
    out = {"flipped": noisy.index[(clean.loc[noisy.index, "pred"] != noisy["pred"]).to_numpy()].tolist()}
    fixed = _first_seed(preds, set_name, default) if default and default != "none" else None
    if fixed is not None:
        was_wrong = (noisy["pred"] != noisy["label"]).to_numpy()
        now_right = (fixed.loc[noisy.index, "pred"] == noisy["label"]).to_numpy()
        out["fixed"] = noisy.index[was_wrong & now_right].tolist()
        out["broke"] = noisy.index[~was_wrong & ~now_right].tolist()
    return out


def marked(before: str, after: str) -> tuple[str, str]:
    """Both texts HTML-escaped, the words that differ between them in <mark>."""
    a, b = before.split(), after.split()
    left, right = [], []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        for words, out in ((a[i1:i2], left), (b[j1:j2], right)):
            text = html.escape(" ".join(words))
            if words:
                out.append(text if op == "equal" else f"<mark>{text}</mark>")
    return " ".join(left), " ".join(right)


def _answer(row, label_names: list[str]) -> str:
    pred = int(row["pred"])
    prob = float(np.asarray(row["probs"])[pred])
    ok = "right" if pred == int(row["label"]) else "wrong"
    return f'<span class="{ok}">{html.escape(label_names[pred])} {prob:.2f}</span>'


def _table(kind: str, indices: list[int], texts: dict[str, list[str] | dict[int, str]], rows: dict,
           label_names: list[str], default: str | None, cap: int) -> str:
    """One list's table: per review the clean and corrupted text (changed words marked), the predictions and,
    for the defense's lists when it repairs text, the repaired text (what the repair changed marked)."""
    repaired = texts.get("repaired") if kind != "flipped" else None
    heads = ["#", "label", "clean review", "no defense", "corrupted review", "no defense"]
    heads += ["repaired review"] if repaired is not None else []
    heads += [html.escape(default or "")] if "default" in rows else []
    body = []
    for i in indices[:cap]:
        clean_text, noisy_text = marked(texts["clean"][i], texts["noisy"][i])
        cells = [str(i), html.escape(label_names[int(rows["noisy"].loc[i, "label"])]), clean_text,
                 _answer(rows["clean"].loc[i], label_names), noisy_text, _answer(rows["noisy"].loc[i], label_names)]
        if repaired is not None:
            cells.append(marked(texts["noisy"][i], repaired[i])[1])
        if "default" in rows:
            cells.append(_answer(rows["default"].loc[i], label_names))
        body.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    shown = f"{min(cap, len(indices))} of {len(indices)} shown" if len(indices) > cap else f"all {len(indices)}"
    return (f'<h3 id="{kind}">{kind}: <span class="count">{len(indices)}</span> reviews ({shown})</h3>\n'
            f'<table class="{kind}"><tr>' + "".join(f"<th>{h}</th>" for h in heads) + "</tr>\n"
            + "\n".join(body) + "</table>")


def set_section(preds: pd.DataFrame, set_name: str, clean_texts: list[str], noisy_texts: list[str],
                label_names: list[str], default: str | None, cap: int = CAP,
                repair: Callable[[list[str]], list[str]] | None = None) -> str:
    """One corrupted set's three lists as HTML ('' when the set has no clean scores to compare with). `repair`:
    the recommended defense's text repair, applied to the corrupted reviews its lists show."""
    found = flips(preds, set_name, default)
    if found is None:
        return ""
    rows = {"clean": _first_seed(preds, "clean", "none"), "noisy": _first_seed(preds, set_name, "none")}
    texts: dict = {"clean": clean_texts, "noisy": noisy_texts}
    if "fixed" in found:
        rows["default"] = _first_seed(preds, set_name, default)
        if repair is not None:
            shown = sorted(set(found["fixed"][:cap]) | set(found["broke"][:cap]))
            texts["repaired"] = dict(zip(shown, repair([noisy_texts[i] for i in shown]))) if shown else {}
    parts = [_table(kind, found[kind], texts, rows, label_names, default, cap) for kind in LISTS if kind in found]
    return (f'<section class="set" data-set="{html.escape(set_name)}"><h2>{html.escape(set_name)}</h2>\n'
            + "\n".join(parts) + "</section>")


STYLE = """body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;max-width:1400px}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:3px 6px;vertical-align:top}
th{background:#f3f3f3;text-align:left}mark{background:#ffe08a}.wrong{color:#b00020}.right{color:#0a6b2d}
.count{font-variant-numeric:tabular-nums}"""


def render(title: str, headline_rows: list[tuple[str, str]], sections: list[str]) -> str:
    """The page: the headline as a two-column table, then each set's section."""
    head = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in headline_rows)
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{STYLE}</style></head><body>\n<h1>{html.escape(title)}</h1>\n"
            f'<table class="headline">{head}</table>\n' + "\n".join(s for s in sections if s) + "\n</body></html>\n")


def headline_rows(summary: dict) -> list[tuple[str, str]]:
    """The headline (a run summary's, or its headline and statistics merged): accuracies, the drop, the
    recommended defense's gain, and each defense's worst case over every scored set, differences in points with
    their 95% interval."""
    from ttt_pipeline.evaluation.stats import format_difference

    default = (summary.get("defense_gain") or {}).get("method") or summary.get("default_defense")
    rows = [(label, f"{summary[key]:.3f}") for key, label in (
        ("acc_clean", "accuracy, clean"), ("acc_corrupted", "accuracy, corrupted, no defense"),
        ("acc_default", f"accuracy, corrupted, {default}"), ("acc_shift", "accuracy, shifted domains, no defense"))
        if isinstance(summary.get(key), (int, float))]
    if summary.get("corruption_drop"):
        rows.append(("drop (clean - corrupted), points", format_difference(summary["corruption_drop"])))
    if summary.get("defense_gain"):
        rows.append((f"{default} gain on corrupted, points", format_difference(summary["defense_gain"])))
    for method, w in (summary.get("worst_case") or {}).items():
        if "ci_low" in w:
            harm = f"; harms {', '.join(w['harmed_sets'])}" if w.get("harm") else ""
            rows.append((f"{method}: worst set of {w['n_sets']}", f"{format_difference(w)} on {w['set']}{harm}"))
    return rows


def run_description(summary: dict) -> str:
    """The headline in a few lines of markdown: the MLflow run page's description."""
    lines = [f"- {label}: {value}" for label, value in headline_rows(summary)]
    if summary.get("report"):
        lines.append("- the reviews the noise flipped, fixed and broke: the artifact `report.html`")
    return "\n".join(lines)
