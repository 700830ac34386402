"""Issue 38: one recommended defense runs the operation; one registered model per task; the alarm's power; new
reviews and their drift. Fast checks of the pure pieces (the flows are tested in tests/ops/)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from ttt_pipeline.classifier import inference_config
from ttt_pipeline.config import load_config, task_of
from ttt_pipeline.errors import ConfigError, DataError
from ttt_pipeline.evaluation.drift import accuracy_change, drift_summary
from ttt_pipeline.evaluation.stats import min_detectable_drop


def test_each_task_has_its_own_registered_model_and_the_champion_metric_is_the_defense_accuracy():
    demo, mdsd = load_config("demo"), load_config("mdsd-electronics")
    assert demo.model_name() == "ttt-demo-reviews-negative-positive"
    assert mdsd.model_name() == "ttt-mdsd-electronics-1-2-4-5"
    assert load_config("mdsd-robustness").model_name() == mdsd.model_name()  # same data and labels: one task
    assert demo.evaluation.defense == "spell" and demo.registry.metric == "acc_default"
    assert demo.registry.metric_key(demo.evaluation.defense) == "acc_corrupted_spell"
    other = load_config("demo", ["registry.metric=acc_ttt", "registry.task=shop-reviews"])
    assert other.registry.metric_key("spell") == "acc_ttt" and other.model_name() == "ttt-shop-reviews-negative-positive"
    assert load_config("demo", ["registry.model_name=mine"]).model_name() == "mine"
    assert load_config("demo", ["evaluation.default_defense=null"]).registry.metric_key("none") == "acc_corrupted"


def test_task_names_of_every_source_kind_and_long_label_sets():
    assert task_of("data/demo/reviews.jsonl") == "demo-reviews" and task_of("/x/mdsd/electronics") == "mdsd-electronics"
    assert task_of("hf://amazon_polarity") == "hf-amazon_polarity" and task_of("gdown://abc") == "gdown-abc"
    cfg = load_config("demo", ["data.label_names=null"])
    with pytest.raises(ConfigError, match="needs the label set"):
        cfg.model_name()
    long = [f"category number {i}" for i in range(12)]
    assert cfg.model_name(long).startswith("ttt-demo-reviews-12class-") and len(cfg.model_name(long)) < 50


def test_the_served_default_method_is_the_recommended_defense():
    cfg = load_config("demo")
    assert inference_config(cfg.ttt, cfg.evaluation.defense)["method"] == "spell"
    assert inference_config()["method"] == "none"  # no list-order rule: nothing recommended, nothing applied


def test_unknown_nightly_keys_are_errors_and_data_path_is_optional():
    assert load_config("demo").nightly.data_path is None
    with pytest.raises(ConfigError, match="nightly.datapath"):
        load_config("demo", ["nightly.datapath=x.jsonl"])


@pytest.mark.parametrize("n,threshold,expected", [(129, 0.02, 0.0909), (129, 0.0, 0.0574), (400, 0.02, 0.0507),
                                                  (1000, 0.02, 0.0366), (16, 0.05, 0.3919)])
def test_min_detectable_drop(n, threshold, expected):
    """The demo's 129 test reviews cannot see a 2-point regression: 9.1 points at 80% power."""
    mdd = min_detectable_drop(n, threshold)
    assert mdd == pytest.approx(expected, abs=5e-4)
    # at that drop the alarm's rule is met exactly: d - threshold = (z_.975 + z_.8) * sqrt(d (1 - d) / n)
    assert mdd - threshold == pytest.approx((1.959964 + 0.841621) * np.sqrt(mdd * (1 - mdd) / n), abs=1e-5)
    assert min_detectable_drop(n, threshold, power=0.5) < mdd  # less power: a smaller drop suffices


def test_min_detectable_drop_edge_cases():
    assert min_detectable_drop(0) is None and min_detectable_drop(10, 1.0) is None
    assert min_detectable_drop(5, 0.02) > 0.6  # five reviews see only a collapse


def test_accuracy_change_of_new_reviews_is_unpaired_with_newcombe_interval():
    new, ref = np.r_[np.ones(60), np.zeros(40)], np.r_[np.ones(80), np.zeros(20)]
    d = accuracy_change(new, ref)
    assert d["delta"] == pytest.approx(-0.20) and d["acc"] == 0.6 and d["acc_reference"] == 0.8
    # Newcombe's interval from the Wilson intervals [0.5020, 0.6906] and [0.7112, 0.8666], by hand:
    # -0.2 - sqrt(0.0980^2 + 0.0666^2) and -0.2 + sqrt(0.0906^2 + 0.0888^2)
    assert d["ci_low"] == pytest.approx(-0.3185, abs=2e-4) and d["ci_high"] == pytest.approx(-0.0731, abs=2e-4)
    assert d["significant"] and d["n"] == 100 and d["n_reference"] == 100


def test_drift_summary_label_shares_length_and_unseen_words():
    train = ["good battery", "bad screen", "good sound good"]
    test = ["good screen"]
    new = ["sharp knife", "good knife blade dull"]
    d = drift_summary(train, [1, 0, 1], test, new, [0, 0], ["neg", "pos"])
    assert d["label_shares"] == {"train": {"neg": 1 / 3, "pos": 2 / 3}, "new": {"neg": 1.0, "pos": 0.0}}
    assert d["label_share_shift"] == pytest.approx(2 / 3)
    assert d["mean_words"] == {"train": pytest.approx(7 / 3), "new": pytest.approx(3.0)}
    assert d["unseen_word_share"] == {"test": 0.0, "new": pytest.approx(5 / 6)}  # all but "good"


def test_new_reviews_come_from_the_newest_file_of_a_folder(tmp_path):
    from ttt_pipeline.data.newdata import read_new_reviews, resolve

    cfg = load_config("demo")
    drop = tmp_path / "drop"
    drop.mkdir()
    (drop / "a.jsonl").write_text(json.dumps({"text": "old", "rating": 1}) + "\n")
    (drop / "b.jsonl").write_text("".join(json.dumps({"text": f"t{i}", "rating": r}) + "\n"
                                          for i, r in enumerate([1, 2, 3, 4, 5])))
    (drop / "notes.txt").write_text("ignored: not a data file")
    os.utime(drop / "a.jsonl", (1_000_000, 1_000_000))
    assert resolve(str(drop)) == str(drop / "b.jsonl")
    frame, source = read_new_reviews(str(drop), cfg.data, ["negative", "positive"], tmp_path / "raw")
    assert source.endswith("b.jsonl") and frame["label"].tolist() == [0, 0, 1, 1]  # 3 stars dropped by label_map
    with pytest.raises(DataError, match="nightly.data_path"):
        resolve(str(tmp_path / "missing"))


def test_reevaluate_checks_nightly_data_path_before_any_scoring(capsys, tmp_path):
    from ttt_pipeline.cli.main import main

    code = main(["reevaluate", "--set", f"nightly.data_path={tmp_path / 'missing.jsonl'}", "--set",
                 f"store={tmp_path / 'store'}"])
    err = capsys.readouterr().err
    assert code == 2 and "missing.jsonl: no such file or folder" in err and "hint: check nightly.data_path" in err
