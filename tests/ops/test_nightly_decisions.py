"""The nightly check's decisions (`ttt_pipeline.nightly`) and its report (`reports/nightly.py`), without Prefect or
MLflow: the night's seed, the configuration that scores the champion, the figures, the verdict's message and the
event's payload."""

from __future__ import annotations

import datetime as dt
import json
import sys
from types import SimpleNamespace

import pytest

from ttt_pipeline import nightly
from ttt_pipeline.config import load_config
from ttt_pipeline.errors import NoChampion, PipelineError
from ttt_pipeline.reports.nightly import change_line, night_report, no_champion_report

NIGHT = dt.date(2031, 7, 4).isoformat()
BEFORE = dt.date(2031, 7, 3).isoformat()


def test_the_decisions_import_neither_prefect_nor_mlflow():
    assert "ttt_pipeline.nightly" in sys.modules
    for name in ("ttt_pipeline.nightly", "ttt_pipeline.reports.nightly"):
        source = open(sys.modules[name].__file__, encoding="utf-8").read()
        assert "prefect" not in source and "import mlflow" not in source


def test_the_night_and_its_seed_come_from_the_date():
    when = dt.datetime(2031, 7, 4, 1, 30, tzinfo=dt.timezone.utc)
    assert nightly.night_of(when) == NIGHT
    assert nightly.seed_for(NIGHT) == 20310704


def test_the_night_scores_none_and_the_default_defense_only():
    cfg = nightly.nightly_config(load_config("demo", ["ttt.methods=[none, spell, masked_ttt, tent]"]))
    assert cfg.ttt.methods == ["none", "spell"] and cfg.evaluation.default_defense == "spell"
    plain = nightly.nightly_config(load_config("demo", ["evaluation.default_defense=null"]))
    assert plain.ttt.methods == ["none"] and plain.evaluation.default_defense is None
    assert nightly.suite_config(cfg, 7).corruption.seed == 7 and cfg.corruption.seed != 7


def test_the_champion_is_scored_at_its_own_length(tmp_path):
    cfg = load_config("demo", [])
    (tmp_path / "meta.json").write_text(json.dumps({"max_length": cfg.model.max_length // 2}))
    assert nightly.scored_config(cfg, tmp_path).model.max_length == cfg.model.max_length // 2
    (tmp_path / "meta.json").write_text(json.dumps({"max_length": cfg.model.max_length}))
    assert nightly.scored_config(cfg, tmp_path) is cfg


def test_labels_in_another_order_are_refused(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "d").mkdir()
    (tmp_path / "m" / "labels.json").write_text(json.dumps({"0": "negative", "1": "positive"}))
    (tmp_path / "d" / "labels.json").write_text(json.dumps({"0": "negative", "1": "positive"}))
    nightly.check_labels(tmp_path / "m", tmp_path / "d")
    (tmp_path / "d" / "labels.json").write_text(json.dumps({"0": "positive", "1": "negative"}))
    with pytest.raises(PipelineError, match="differ from the data's"):
        nightly.check_labels(tmp_path / "m", tmp_path / "d")


def _rows(kind_acc: dict) -> list[dict]:
    return [{"kind": kind, "set": kind if kind == "clean" else f"{kind}-1", "family": None if kind == "clean" else
             "keyboard", "severity": None if kind == "clean" else 1, "method": method, "mask_seed": None, "acc": acc,
             "macro_f1": acc, "n": 100} for (kind, method), acc in kind_acc.items()]


CHECK = {"delta": -0.05, "ci_low": -0.08, "ci_high": -0.03, "p_mcnemar": 0.001, "helped": 1, "hurt": 6, "n": 100,
         "against": f"previous night {BEFORE} (MLflow run r0)", "significant": True, "regression": True}


def test_figures_changes_and_the_regression_message():
    results = {"night": _rows({("clean", "none"): 0.9, ("clean", "spell"): 0.89, ("corrupted", "none"): 0.7,
                               ("corrupted", "spell"): 0.8}),
               "ref": _rows({("corrupted", "none"): 0.72, ("corrupted", "spell"): 0.81})}
    now = nightly.figures(results, "spell")
    assert now["acc_clean"] == 0.9 and now["robust_acc_night"] == 0.8 and now["robust_acc_ref"] == 0.81
    nightly.against_previous(now, {"robust_acc_ref": 0.86, "robust_acc_night": 0.8}, CHECK)
    assert now["robust_acc_drop"] == pytest.approx(0.05) and now["robust_acc_night_drop"] == pytest.approx(0.0)
    assert now["robust_acc_change_ci_high"] == -0.03
    extra = nightly.extra_figures(CHECK, 100, None, 0.02, 0.95)
    assert extra["reference"]["against"] == CHECK["against"] and "regression" not in extra["reference"]
    assert extra["min_detectable_drop"] is not None and extra["min_detectable_drop"] > 0.02
    mv = SimpleNamespace(name="ttt-demo", version=3, run_id="r3")
    s = nightly.summary(NIGHT, "spell", mv, "run-9", 0.02, (20310704, 42), "r0", extra, now, True)
    assert s["verdict"] == "regression" and s["model_version"] == "3" and s["reference_n"] == 100
    assert set(nightly.event_payload(s)) == {"night", "defense", "model_name", "model_version", "reference",
                                             "min_detectable_drop", "mlflow_run_id", "robust_acc_ref"}
    msg = nightly.regression_message(s, CHECK, 0.02)
    assert f"fell to 0.810 ({NIGHT})" in msg and "[-8.00, -3.00] lies below -2.00" in msg
    assert change_line(now, 0.02, CHECK).endswith("it does.")
    report = night_report(NIGHT, mv, now, None, 0.02, True, "run 9", "spell", extra)
    assert report.startswith("# ❌ REGRESSION") and "| reference suite, with spell (robust) | 0.810 | - |" in report


def test_no_champion_says_what_to_do():
    exc = NoChampion("registered model 'x' has no version at alias 'champion'", "run the ttt-pipeline deployment once")
    s = nightly.no_champion_summary(NIGHT, "spell", "x", exc)
    assert s["verdict"] == "no_champion" and s["hint"] == exc.hint
    text = no_champion_report(exc.message, exc.hint, "sqlite:///mlflow.db", NIGHT)
    assert "**What to do:** Run the ttt-pipeline deployment once." in text
