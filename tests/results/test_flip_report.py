"""The run's HTML report (reports/flips.py, steps.flip_report): the lists of reviews the noise flipped and the
recommended defense fixed or broke, computed from the predictions, counted whole, capped, escaped, with the
changed words marked; and the report of a real tiny run, logged to its parent run, against predictions.parquet."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from ttt_pipeline.reports.flips import flips, marked, render, set_section

LABELS = ["negative", "positive"]


def _rows(set_name, kind, method, preds, labels, seed=None):
    return [{"kind": kind, "set": set_name, "family": None, "severity": None, "method": method, "mask_seed": seed,
             "index": i, "label": y, "pred": p, "probs": np.eye(2)[p] * 0.8 + 0.1} for i, (p, y) in
            enumerate(zip(preds, labels))]


LAB = [0, 1, 0, 1, 0, 1]
PREDS = pd.DataFrame(_rows("clean", "clean", "none", [0, 1, 0, 1, 1, 1], LAB)
                     + _rows("keyboard_4", "corrupted", "none", [1, 1, 1, 0, 1, 1], LAB)
                     + _rows("keyboard_4", "corrupted", "spell", [0, 1, 1, 1, 1, 0], LAB))
PREDS["mask_seed"] = PREDS["mask_seed"].astype("Int64")


def test_the_lists_follow_their_definitions():
    found = flips(PREDS, "keyboard_4", "spell")
    assert found["flipped"] == [0, 2, 3]  # review 4 is wrong on both sides: not flipped
    assert found["fixed"] == [0, 3]  # wrong without a defense (0, 2, 3, 4), right under spell
    assert found["broke"] == [5]  # right without a defense, wrong under spell
    assert "fixed" not in flips(PREDS, "keyboard_4", "none")
    assert flips(PREDS[PREDS["set"] != "clean"], "keyboard_4", "spell") is None


def test_the_changed_words_are_marked_and_every_text_escaped():
    before, after = marked("Great <b>sound</b>, battery lasts", "Graet <b>sound</b>, battery lasts")
    assert before == "<mark>Great</mark> &lt;b&gt;sound&lt;/b&gt;, battery lasts"
    assert after.startswith("<mark>Graet</mark> &lt;b&gt;")


def test_a_section_counts_every_review_and_shows_up_to_the_cap():
    clean = [f"review {i} is fine" for i in range(6)]
    noisy = [f"reveiw {i} is fine" for i in range(6)]
    section = set_section(PREDS, "keyboard_4", clean, noisy, LABELS, "spell", cap=2)
    assert re.findall(r'<h3 id="(\w+)">\w+: <span class="count">(\d+)</span>', section) == [
        ("flipped", "3"), ("fixed", "2"), ("broke", "1")]
    assert "(2 of 3 shown)" in section and section.count("<tr><td>") == 2 + 2 + 1
    assert '<span class="wrong">positive 0.90</span>' in section  # review 0 corrupted, no defense
    page = render("Report <x>", [("accuracy, clean", "0.900")], [section])
    assert page.startswith("<!doctype html>") and "Report &lt;x&gt;" in page
    assert not re.search(r"(src|href)=\"?https?:", page)  # self-contained: nothing fetched from elsewhere


def test_a_tiny_runs_report_lists_exactly_the_reviews_its_predictions_flipped(two_runs):
    from mlflow.tracking import MlflowClient

    summary = two_runs["a"]
    path = Path(summary["report"].removeprefix("file://"))
    page = path.read_text(encoding="utf-8")
    client = MlflowClient(two_runs["uri"])
    [child] = client.search_runs([summary["experiment_id"]], f"tags.mlflow.parentRunId = '{summary['mlflow_run_id']}'"
                                 " and attributes.run_name = 'evaluate'")
    preds = pd.read_parquet(client.download_artifacts(child.info.run_id, "predictions.parquet", str(path.parent)))
    for name in dict.fromkeys(preds.loc[preds["kind"] == "corrupted", "set"]):
        section = page.split(f'data-set="{name}"', 1)[1].split("</section>", 1)[0]
        clean = preds[(preds["set"] == "clean") & (preds["method"] == "none")].sort_values("index")
        noisy = preds[(preds["set"] == name) & (preds["method"] == "none")].sort_values("index")
        flipped = int((clean["pred"].to_numpy() != noisy["pred"].to_numpy()).sum())
        assert f'<h3 id="flipped">flipped: <span class="count">{flipped}</span>' in section
    assert "accuracy, clean" in page and f"{summary['acc_clean']:.3f}" in page


def test_the_run_page_has_the_headline_as_its_description_and_the_reviews_as_datasets(two_runs):
    from mlflow.tracking import MlflowClient

    summary = two_runs["a"]
    run = MlflowClient(two_runs["uri"]).get_run(summary["mlflow_run_id"])
    note = run.data.tags["mlflow.note.content"]
    assert f"- accuracy, clean: {summary['acc_clean']:.3f}" in note and "report.html" in note
    assert {d.dataset.name for d in run.inputs.dataset_inputs} >= {"reviews-train", "reviews-test"}


def test_the_defenses_lists_show_the_repaired_review_with_the_repairs_changes_marked():
    clean = [f"review {i} is fine" for i in range(6)]
    noisy = [f"reveiw {i} is fine" for i in range(6)]
    asked = []

    def repair(texts):
        asked.append(list(texts))
        return [t.replace("reveiw", "review") for t in texts]

    section = set_section(PREDS, "keyboard_4", clean, noisy, LABELS, "spell", repair=repair)
    assert asked == [[noisy[0], noisy[3], noisy[5]]]  # only the reviews the fixed and broke lists show
    fixed = section.split('<table class="fixed">', 1)[1].split("</table>", 1)[0]
    assert "<th>repaired review</th>" in fixed and "<td><mark>review</mark> 0 is fine</td>" in fixed
    flipped = section.split('<table class="flipped">', 1)[1].split("</table>", 1)[0]
    assert "repaired review" not in flipped
