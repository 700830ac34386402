"""Worst case beside the mean, and the external generators apart from the own suite: on hand-made predictions."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from ttt_pipeline.evaluation import robustness
from ttt_pipeline.evaluation.scoring import headline
from ttt_pipeline.reports.run import headline_markdown, headline_table, worst_cases

N = 300


def _frame(set_name, kind, family, severity, method, labels, preds):
    return pd.DataFrame({"kind": kind, "set": set_name, "family": family, "severity": severity, "method": method,
                         "mask_seed": None, "index": range(len(labels)), "label": labels, "pred": preds})


def _row(kind, set_name, family, severity, method, acc):
    return {"kind": kind, "set": set_name, "family": family, "severity": severity, "method": method, "acc": acc,
            "mask_seed": None, "macro_f1": acc, "n": N}


def _grid():
    """clean 0.9; keyboard-3 0.6 and ext:ocr-3 0.7 without defense. `spell` wins back 0.1 on both corrupted sets
    and costs nothing on clean; `tent` wins 0.05 on keyboard-3 but loses 0.2 on clean and on ext:ocr-3."""
    y = np.random.default_rng(0).integers(0, 2, N)

    def wrong_on(preds, idx):
        p = preds.copy()
        p[idx] = 1 - y[idx]
        return p

    frames, rows = [], []

    def add(kind, name, family, method, preds):
        frames.append(_frame(name, kind, family, 3 if family else None, method, y, preds))
        rows.append(_row(kind, name, family, 3 if family else None, method, float((preds == y).mean())))

    clean = wrong_on(y, np.arange(30))
    add("clean", "clean", None, "none", clean)
    add("clean", "clean", None, "spell", clean)
    add("clean", "clean", None, "tent", wrong_on(clean, np.arange(30, 90)))
    for name, family, n_wrong in (("keyboard-3", "keyboard", 120), ("ext:ocr-3", "ext:ocr", 90)):
        base = wrong_on(y, np.arange(n_wrong))
        add("corrupted", name, family, "none", base)
        add("corrupted", name, family, "spell", wrong_on(y, np.arange(n_wrong - 30)))
        add("corrupted", name, family, "tent", wrong_on(y, np.arange(n_wrong - 15)) if family == "keyboard"
            else wrong_on(base, np.arange(n_wrong, n_wrong + 60)))
    return pd.concat(frames, ignore_index=True), rows


def test_external_sets_are_reported_apart_from_the_own_suite():
    preds, rows = _grid()
    stats = robustness.run_statistics(rows, preds, [0], default_defense="spell", resamples=400, seed=0)
    assert abs(stats["corruption_drop"]["delta"] - 0.3) < 1e-12  # own suite only (keyboard-3)
    assert abs(stats["external_drop"]["delta"] - (0.9 - 0.7)) < 1e-12
    assert abs(stats["defense_gain"]["delta"] - 0.1) < 1e-12 and stats["defense_gain"]["method"] == "spell"
    assert abs(stats["defense_external_gain"]["delta"] - 0.1) < 1e-12
    assert abs(stats["gains"]["tent"]["external"]["delta"] + 0.2) < 1e-12
    assert list(stats["mce"]["spell"] and stats["methods"]["spell"]["ce"]) == ["keyboard"]  # mCE: own suite
    head = headline(rows, "spell")
    assert abs(head["acc_corrupted"] - 0.6) < 1e-12 and abs(head["acc_external"] - 0.7) < 1e-12
    assert abs(head["acc_external_default"] - 0.8) < 1e-12


def test_worst_case_is_the_lowest_paired_change_and_harm_flags_an_interval_below_zero():
    preds, rows = _grid()
    stats = robustness.run_statistics(rows, preds, [0], default_defense="spell", resamples=400, seed=0)
    worst = stats["worst_case"]
    assert worst["spell"]["delta"] == 0.0 and worst["spell"]["set"] == "clean" and not worst["spell"]["harm"]
    assert worst["spell"]["n_sets"] == 3
    b = worst["tent"]
    assert abs(b["delta"] + 0.2) < 1e-12 and b["ci_high"] < 0 and b["harm"]
    assert sorted(b["harmed_sets"]) == ["clean", "ext:ocr-3"]
    flat = robustness.flat_metrics(stats)
    assert flat["harm/tent"] == 1.0 and flat["harm/spell"] == 0.0
    assert abs(flat["worst/tent"] + 0.2) < 1e-12 and flat["worst/tent_ci_high"] < 0
    assert abs(flat["gain/spell/external"] - 0.1) < 1e-12


def test_report_shows_worst_case_and_external_rows():
    preds, rows = _grid()
    stats = robustness.run_statistics(rows, preds, [0], default_defense="spell", resamples=400, seed=0)
    summary = {**headline(rows, "spell"), **stats, "default_defense": "spell", "mlflow_run_id": "r"}
    text = headline_table(summary)
    assert re.search(r"external generators' drop \(clean - ext: sets, no defense\)\s+\+20\.00", text)
    assert re.search(r"default defense \(spell\) - none, external generators\s+\+10\.00", text)
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("tent") and "HARM" in ln)
    assert "-20.00" in line and "HARM on" in line and "ext:ocr-3" in line and "clean" in line
    assert any(ln.strip().startswith("spell") and "no harm shown" in ln for ln in text.splitlines())
    # from MLflow's flat metrics alone (ttt-pipeline report): the figures and the flag, without the set names
    assert [(tag, w["harm"]) for tag, w in worst_cases(robustness.flat_metrics(stats))] == [("spell", False),
                                                                                             ("tent", True)]
    assert "| tent | -20.00 |" in headline_markdown(summary)


def test_console_summary_has_external_rows_and_worst_case():
    from ttt_pipeline.cli.console import summary_table

    preds, rows = _grid()
    stats = robustness.run_statistics(rows, preds, [0], default_defense="spell", resamples=400, seed=0)
    text = summary_table({**headline(rows, "spell"), **stats})
    assert "external generators, no defense" in text and "external, spell (default defense)" in text
    assert "worst case per defense" in text and "HARM on" in text
