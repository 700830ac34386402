"""Plots: the numbers drawn are the numbers given, files are PNGs of the expected size, and stage logging puts
them under `plots/` of the stage run and of its pipeline run."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ttt_pipeline.io import plots

LABELS = ["neg", "neu", "pos"]


def row(kind, set_, method, acc, confusion, family=None, severity=None):
    m = np.asarray(confusion)
    rec = (np.diag(m) / m.sum(1)).tolist()
    return {"kind": kind, "set": set_, "family": family, "severity": severity, "method": method, "acc": acc,
            "macro_f1": acc - 0.05, "recall": rec, "confusion": m.tolist(), "n": int(m.sum()), "wall_s": 0.1,
            "samples_per_s": 123.456}


@pytest.fixture()
def rows():
    eye = [[4, 0, 0], [0, 4, 0], [0, 0, 4]]
    return [
        row("clean", "clean", "none", 0.90, [[9, 1, 0], [1, 8, 1], [0, 0, 10]]),
        row("clean", "clean", "masked_ttt", 0.88, [[8, 2, 0], [1, 8, 1], [0, 0, 10]]),
        row("corrupted", "keyboard-3", "none", 0.50, [[2, 2, 0], [1, 2, 1], [1, 1, 2]], "keyboard", 3),
        row("corrupted", "keyboard-1", "none", 0.75, eye, "keyboard", 1),
        row("corrupted", "keyboard-3", "masked_ttt", 0.60, [[3, 1, 0], [1, 2, 1], [1, 0, 3]], "keyboard", 3),
        row("corrupted", "keyboard-1", "masked_ttt", 0.80, eye, "keyboard", 1),
        row("corrupted", "tutorial-3", "none", 0.40, [[1, 3, 0], [0, 4, 0], [0, 4, 0]], "tutorial", 3),
        row("corrupted", "tutorial-3", "masked_ttt", 0.45, [[2, 2, 0], [0, 4, 0], [0, 4, 0]], "tutorial", 3),
        row("shift", "shift_kitchen", "none", 0.70, eye),
    ]


def history(warmup=0, dapt=0, joint=True):
    epochs = []
    for e in range(1, 4):
        r = {"epoch": e, "train_loss": 1.5 - 0.3 * e, "lr": 1e-4, "epoch_s": 1.0, "samples_per_s": 10.0,
             "val_loss": 1.4 - 0.2 * e, "val_acc": 0.4 + 0.1 * e, "val_macro_f1": 0.3 + 0.1 * e}
        if joint:
            r["train_mlm_loss"] = 5.0 - e
        epochs.append(r)
    return {"epochs": epochs, "mlm_warmup": list(np.linspace(9, 3, warmup)), "dapt": list(np.linspace(4, 2, dapt))}


def visible_axes(fig):
    return [ax for ax in fig.axes if ax.get_visible() and ax.get_label() != "<colorbar>"]


def test_aggregate_confusion_pools_sets_and_recall_follows(rows):
    m = plots.aggregate_confusion(rows, "corrupted", "none")
    expected = (np.array([[2, 2, 0], [1, 2, 1], [1, 1, 2]]) + np.eye(3, dtype=int) * 4
                + np.array([[1, 3, 0], [0, 4, 0], [0, 4, 0]]))
    assert (m == expected).all()
    assert plots.aggregate_confusion(rows, "corrupted", "tent") is None
    rec = plots.recall_from_confusion(m)
    assert rec == pytest.approx(np.diag(expected) / expected.sum(1))
    rec0 = plots.recall_from_confusion(np.array([[2, 0], [0, 0]]))
    assert rec0[0] == 1.0 and np.isnan(rec0[1])  # a class with no examples has no recall, not 0


def test_severity_series_groups_and_sorts(rows):
    s = plots.severity_series(rows)
    assert set(s) == {"keyboard", "tutorial"}
    # (severity, accuracy, interval): rows without an interval are drawn without bars
    assert s["keyboard"]["none"] == [(1, 0.75, 0.75, 0.75), (3, 0.50, 0.50, 0.50)]
    assert s["keyboard"]["masked_ttt"] == [(1, 0.80, 0.80, 0.80), (3, 0.60, 0.60, 0.60)]
    assert s["tutorial"]["masked_ttt"] == [(3, 0.45, 0.45, 0.45)]


def test_severity_series_averages_mask_seeds_and_keeps_intervals(rows):
    seeded = [{**r, "mask_seed": seed, "acc": r["acc"] + d, "acc_ci_low": 0.1, "acc_ci_high": 0.9}
              for r in rows if r["method"] == "masked_ttt" for seed, d in ((0, -0.05), (1, 0.05))]
    s = plots.severity_series([r for r in rows if r["method"] == "none"] + seeded)
    assert s["keyboard"]["masked_ttt"] == [(1, pytest.approx(0.80), 0.1, 0.9), (3, pytest.approx(0.60), 0.1, 0.9)]


def test_accuracy_vs_severity_draws_the_given_values(rows):
    fig = plots.accuracy_vs_severity(rows)
    axes = visible_axes(fig)
    assert [ax.get_title() for ax in axes] == ["keyboard", "tutorial"]
    kb = axes[0]
    lines = {ln.get_label(): ln for ln in kb.get_lines()}
    lines.update({c.get_label(): c.lines[0] for c in kb.containers})  # error-bar series: their data line
    assert list(lines["no adaptation"].get_ydata()) == [0.75, 0.50]
    assert list(lines["masked TTT"].get_ydata()) == [0.80, 0.60]
    assert np.round(lines["no adaptation"].get_xdata()).tolist() == [1, 3]
    # clean accuracy as horizontal reference lines
    assert lines["clean, no adaptation"].get_ydata()[0] == pytest.approx(0.90)
    assert lines["clean, masked TTT"].get_ydata()[0] == pytest.approx(0.88)
    # equal values stay distinguishable: the methods are drawn side by side
    assert lines["no adaptation"].get_xdata()[0] != lines["masked TTT"].get_xdata()[0]


@pytest.mark.parametrize("warmup,dapt,joint,panels", [(0, 0, False, 2), (0, 0, True, 3), (50, 0, True, 4),
                                                      (50, 30, True, 5)])
def test_training_curves_panels(warmup, dapt, joint, panels):
    h = history(warmup, dapt, joint)
    fig = plots.training_curves(h)
    axes = visible_axes(fig)
    assert len(axes) == panels
    losses = {ln.get_label(): ln for ln in axes[0].get_lines()}
    assert list(losses["train"].get_ydata()) == pytest.approx([1.2, 0.9, 0.6])
    assert list(losses["validation"].get_xdata()) == [1, 2, 3]
    scores = {ln.get_label(): ln for ln in axes[1].get_lines()}
    assert list(scores["validation accuracy"].get_ydata()) == pytest.approx([0.5, 0.6, 0.7])
    if warmup:
        warm = axes[3 if joint else 2]
        assert "warm-up" in warm.get_title() and f"{warmup} steps" in warm.get_title()
        per_step = [ln for ln in warm.get_lines() if ln.get_label() == "per step"][0]
        assert len(per_step.get_ydata()) == warmup and per_step.get_ydata()[0] == pytest.approx(9.0)


def test_confusion_matrices_are_row_normalised_with_counts(rows):
    fig = plots.confusion_matrices(rows, LABELS)
    axes = [ax for ax in visible_axes(fig) if ax.get_images()]
    assert [ax.get_title().splitlines()[0] for ax in axes] == ["clean", "corrupted", "corrupted + masked TTT"]
    img = axes[0].get_images()[0].get_array()
    assert np.asarray(img).sum(1) == pytest.approx([1, 1, 1])
    assert np.asarray(img)[0, 0] == pytest.approx(0.9)
    assert "acc 0.900, n=30" in axes[0].get_title()
    counts = [t.get_text() for t in axes[0].texts]
    assert counts[:3] == ["9", "1", "0"] and len(counts) == 9


def test_per_class_recall_bars(rows):
    fig = plots.per_class_recall(rows, LABELS)
    ax = visible_axes(fig)[0]
    heights = [p.get_height() for p in ax.patches]
    assert len(heights) == 3 * 3  # clean, corrupted, corrupted + TTT for 3 classes
    clean = plots.recall_from_confusion(plots.aggregate_confusion(rows, "clean", "none"))
    assert heights[:3] == pytest.approx(clean)
    assert [t.get_text() for t in ax.get_xticklabels()] == LABELS


def test_grid_table_is_flat_and_rounded(rows):
    t = plots.grid_table(rows)
    assert len(t) == len(rows)
    assert "confusion" not in t[0] and "recall" not in t[0]
    kb = [r for r in t if r["set"] == "keyboard-3" and r["method"] == "masked_ttt"][0]
    assert kb == {"kind": "corrupted", "set": "keyboard-3", "family": "keyboard", "severity": 3,
                  "method": "masked_ttt", "mask_seeds": "", "acc": 0.6, "macro_f1": 0.55, "vs_none": "",
                  "ci_low": "", "ci_high": "", "p_mcnemar": "", "verdict": "", "n": 12, "samples_per_s": 123.5}
    diff = {"comparison": "method", "set": "keyboard-3", "method": "masked_ttt", "delta": 0.1, "ci_low": -0.02,
            "ci_high": 0.21234, "p_mcnemar": 0.3, "significant": False}
    kb = [r for r in plots.grid_table(rows, [diff]) if r["set"] == "keyboard-3" and r["method"] == "masked_ttt"][0]
    assert (kb["vs_none"], kb["ci_low"], kb["ci_high"], kb["verdict"]) == (0.1, -0.02, 0.2123, "not significant")
    assert t[0]["family"] == "" and t[0]["severity"] == ""
    json.dumps(t)  # table artifacts need plain JSON


def test_png_files(tmp_path, rows):
    ft = plots.write_finetune_plots(history(40, 0), tmp_path)
    ev = plots.write_evaluation_plots({"rows": rows, "label_names": LABELS}, tmp_path)
    assert sorted(p.name for p in ft) == sorted(plots.FINETUNE_PLOTS)
    assert sorted(p.name for p in ev) == sorted(plots.EVALUATION_PLOTS)
    w, h = plots.png_size(tmp_path / "training_curves.png")
    assert (w, h) == (3 * 480, 2 * 360)  # 4 panels in rows of 3 at 100 dpi
    w, h = plots.png_size(tmp_path / "accuracy_vs_severity.png")
    assert (w, h) == (2 * 460, 360)
    for p in ft + ev:
        assert p.stat().st_size > 10_000  # drawn, not blank
    (tmp_path / "nope.png").write_text("not a png")
    with pytest.raises(ValueError):
        plots.png_size(tmp_path / "nope.png")


def test_empty_inputs_still_draw(tmp_path):
    plots.save(plots.accuracy_vs_severity([]), tmp_path / "a.png")
    plots.save(plots.confusion_matrices([], LABELS), tmp_path / "b.png")
    plots.save(plots.training_curves({"epochs": [], "mlm_warmup": [], "dapt": []}), tmp_path / "c.png")
    assert all(plots.png_size(tmp_path / f"{n}.png")[0] > 100 for n in "abc")


def test_step_logging_puts_plots_on_stage_and_parent_runs(tmp_path, rows):
    from ttt_pipeline.io import step_logging
    from ttt_pipeline.io.tracking import Tracker

    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db", "plots", str(tmp_path / "mlruns"))
    parent = tracker.start("pipeline")
    child = tracker.start("evaluate", parent=parent)
    names = step_logging.log_plots(tracker, child, lambda d: plots.write_evaluation_plots(
        {"rows": rows, "label_names": LABELS}, d))
    assert sorted(names) == sorted(plots.EVALUATION_PLOTS)
    for run_id in (child, parent):
        logged = {f.path for f in tracker.client.list_artifacts(run_id, "plots")}
        assert logged == {f"plots/{n}" for n in plots.EVALUATION_PLOTS}

    def broken(d):
        raise RuntimeError("no fonts")

    assert step_logging.log_plots(tracker, child, broken) == []  # a failing plot never fails the stage
    assert tracker.client.get_run(child).data.tags["plots_error"] == "RuntimeError: no fonts"
