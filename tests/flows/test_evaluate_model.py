"""`ttt-pipeline evaluate --model`: a classifier fine-tuned elsewhere, scored like the pipeline's own.

Tiny random BERT, DistilBERT and RoBERTa sequence classifiers are saved the way users save theirs
(tests/hf_models.py; nothing from the hub). The unit tests check the import (labels, order, MLM head, the logits
against transformers' own forward); the bad inputs go through the real CLI in this process (exit 2, `error:` and
`hint:`, nothing registered); the slow tests run the whole flow on each family, an MLflow `transformers` model, a
hub id from a local cache, and the consistency of a pipeline-trained model evaluated through `--model`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from hf_models import FAMILIES, save_classifier, save_encoder_only, save_generative, save_masked_lm

from ttt_pipeline.config import load_config
from ttt_pipeline.errors import ConfigError
from ttt_pipeline.modeling.hf_classifier import SequenceClassifier, Source, match_labels

REVIEWS = ["Great sound and the battery lasts all day.", "Stopped working after a week. Very disappointed.",
           "It is fine, nothing special", "terrible, returned it"]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """One classifier per family (BERT's and RoBERTa's fine-tuned from a masked-LM base saved beside them)."""
    root = tmp_path_factory.mktemp("hf-models")
    out = {}
    for family in FAMILIES:
        base = save_masked_lm(root / f"{family}-base", family)
        out[f"{family}-base"] = base
        out[family] = save_classifier(root / family, family, base=base if family != "distilbert" else None)
    out["swapped"] = save_classifier(root / "swapped", "bert", labels=("POSITIVE", "Negative"), base=out["bert-base"])
    out["generic"] = save_classifier(root / "generic", "bert", labels=None)
    return out


def import_to(folder: Path, tmp: Path, *overrides: str):
    """The import step on the demo data (its labels: negative, positive), then the stored model loaded back."""
    from ttt_pipeline import steps
    from ttt_pipeline.modeling.loading import load_model
    from ttt_pipeline.storage import StepStore

    cfg = load_config("demo", [f"store={tmp / 'store'}", *overrides])
    store = StepStore(cfg.store)
    data = steps.download(cfg, store)
    out = steps.import_model(cfg, data, Source(str(folder), str(folder), str(folder)), store)
    model, tokenizer = load_model(Path(out.path) / "model")
    return out, model, tokenizer


def hf_logits(folder: Path, texts: list[str]) -> torch.Tensor:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    with torch.inference_mode():
        return model(**tok(texts, padding=True, truncation=True, max_length=128, return_tensors="pt")).logits


def test_labels_match_by_name_in_the_datas_order_whatever_their_case():
    assert match_labels(["NEGATIVE", "positive"], ["negative", "positive"], None) == [0, 1]
    assert match_labels(["POSITIVE", "Negative"], ["negative", "positive"], None) == [1, 0]
    assert match_labels(["LABEL_0", "LABEL_1"], ["negative", "positive"], {"LABEL_0": "positive",
                                                                           "LABEL_1": "negative"}) == [1, 0]


@pytest.mark.parametrize("model_labels, label_map, words", [
    (["LABEL_0", "LABEL_1"], None, ["generic (LABEL_0, LABEL_1)", "model.label_map={LABEL_0: negative"]),
    (["neg", "pos"], None, ["['neg', 'pos'] do not match", "model.label_map={neg: negative, pos: positive}"]),
    (["a", "b", "c"], None, ["3 labels", "2 ['negative', 'positive']", "data.label_names"]),
    (["LABEL_0", "LABEL_1"], {"LABEL_0": "negative"}, ["['negative', 'LABEL_1'] do not match"]),
])
def test_labels_that_do_not_match_stop_with_both_sets_and_the_map_to_set(model_labels, label_map, words):
    with pytest.raises(ConfigError) as err:
        match_labels(model_labels, ["negative", "positive"], label_map)
    text = f"{err.value.message} {err.value.hint}"
    assert all(w in text for w in words), text


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_scores_as_transformers_does_in_the_datas_label_order(models, tmp_path, family):
    out, model, tokenizer = import_to(models[family], tmp_path)
    assert isinstance(model, SequenceClassifier) and out.meta["model_type"] == family
    assert model.meta.label_names == ["negative", "positive"] and out.meta["order"] == [0, 1]
    enc = tokenizer(REVIEWS, padding=True, return_tensors="pt")
    with torch.inference_mode():
        mine = model(enc["input_ids"], enc["attention_mask"])
    torch.testing.assert_close(mine, hf_logits(models[family], REVIEWS), rtol=1e-5, atol=1e-5)


def test_a_model_with_the_labels_the_other_way_round_gives_the_datas_order(models, tmp_path):
    _, model, tokenizer = import_to(models["swapped"], tmp_path)
    enc = tokenizer(REVIEWS, padding=True, return_tensors="pt")
    with torch.inference_mode():
        mine = model(enc["input_ids"], enc["attention_mask"])
    torch.testing.assert_close(mine, hf_logits(models["swapped"], REVIEWS).flip(-1), rtol=1e-5, atol=1e-5)


def test_mlm_from_puts_the_base_checkpoints_head_on_the_classifiers_encoder(models, tmp_path):
    """The classifier was fine-tuned from the base (here: not at all, so its encoder is the base's): the imported
    model's masked-LM loss is the base model's own, and the decoder is tied to the classifier's embeddings."""
    from transformers import AutoModelForMaskedLM

    out, model, tokenizer = import_to(models["bert"], tmp_path, f"ttt.mlm_from={models['bert-base']}")
    assert out.meta["mlm_head"] and "ttt.mlm_from" in out.meta["mlm_note"]
    assert model.mlm_model.get_output_embeddings().weight is model.encoder.get_input_embeddings().weight
    enc = tokenizer(REVIEWS, padding=True, return_tensors="pt")
    mask = torch.zeros_like(enc["input_ids"], dtype=torch.bool)
    mask[:, 2] = True
    ids = enc["input_ids"].masked_fill(mask, tokenizer.mask_token_id)
    base = AutoModelForMaskedLM.from_pretrained(models["bert-base"]).eval()
    with torch.inference_mode():
        mine = model.mlm_cross_entropy(model.encode(ids, enc["attention_mask"]), enc["input_ids"], mask)
        theirs = torch.nn.functional.cross_entropy(base(input_ids=ids, attention_mask=enc["attention_mask"]).logits[
            mask], enc["input_ids"][mask])
    torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)


def test_without_an_mlm_head_masked_ttt_is_left_out_with_the_reason(models, tmp_path):
    from ttt_pipeline import steps

    out, model, _ = import_to(models["distilbert"], tmp_path)
    assert model.mlm_head is None and not out.meta["mlm_head"]
    cfg = load_config("demo")
    scored, notes = steps.evaluated_config(cfg, out)
    assert scored.ttt.methods == ["none", "spell", "mask_ensemble"]
    assert notes == [f"masked_ttt, spell+masked_ttt: {out.meta['mlm_note']}"] and "ttt.mlm_from" in notes[0]
    with pytest.raises(ConfigError, match="default_defense spell\\+masked_ttt adapts on an MLM head"):
        steps.evaluated_config(load_config("demo", ["evaluation.default_defense=spell+masked_ttt"]), out)


def test_max_length_is_capped_at_the_models_own_limit(models, tmp_path):
    out, model, _ = import_to(models["roberta"], tmp_path, "model.max_length=512")
    assert out.meta["max_length"] == model.meta.max_length == 257  # 258 positions less RoBERTa's padding offset (0 + 1)


# ---------------------------------------------------------------------- bad input, through the CLI


@pytest.fixture(scope="module")
def bad(models, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bad-models")
    no_config = shutil.copytree(models["bert"], root / "no-config")
    (no_config / "config.json").unlink()
    no_tokenizer = save_classifier(root / "no-tokenizer", "bert", tokenizer=False)
    remote = shutil.copytree(models["bert"], root / "remote-code")
    cfg = json.loads((remote / "config.json").read_text())
    (remote / "config.json").write_text(json.dumps({**cfg, "auto_map": {"AutoModel": "modeling_x.XModel"}}))
    return {"no-config": no_config, "no-tokenizer": no_tokenizer, "remote-code": remote,
            "encoder": save_encoder_only(root / "encoder"), "generative": save_generative(root / "gpt2"),
            "three-labels": save_classifier(root / "three", "bert", labels=("neg", "neutral", "pos"))}


def cli(tmp: Path, capsys, model: str, *sets: str, tracking: str | None = None) -> tuple[int, str]:
    from ttt_pipeline.cli.main import main

    uri = tracking or f"sqlite:///{tmp / 'mlflow.db'}"
    rc = main(["evaluate", "--model", model, "--config", "demo", "--set", f"store={tmp / 'store'}",
               "--set", f"tracking.tracking_uri={uri}", "--set", f"tracking.artifact_root={tmp / 'mlruns'}",
               *[a for s in sets for a in ("--set", s)]])
    return rc, capsys.readouterr().err


def registered(tmp: Path) -> list[str]:
    from mlflow.tracking import MlflowClient

    db = tmp / "mlflow.db"
    return [m.name for m in MlflowClient(f"sqlite:///{db}").search_registered_models()] if db.exists() else []


@pytest.mark.parametrize("case, sets, words", [
    ("no-config", [], ["no config.json", "save_pretrained"]),
    ("encoder", [], ["BertModel has no sequence-classification head"]),
    ("generative", [], ["GPT2LMHeadModel has no sequence-classification head"]),
    ("no-tokenizer", [], ["no tokenizer in", "tokenizer.save_pretrained"]),
    ("three-labels", [], ["3 labels ['neg', 'neutral', 'pos']", "data.label_names"]),
    ("generic", [], ["generic (LABEL_0, LABEL_1)", "--set 'model.label_map={LABEL_0: negative, LABEL_1: positive}'"]),
    ("swapped", ["model.label_map={POSITIVE: good}"], ["['good', 'Negative'] do not match"]),
    ("remote-code", [], ["auto_map", "model.trust_remote_code=true"]),
    ("distilbert", ["ttt.mlm_from=BERT_BASE"], ["ttt.mlm_from", "does not match the classifier's"]),
    ("models:/no-such-model@champion", [], ["models:/no-such-model@champion: not found in the MLflow registry"]),
    ("./not/a/folder", [], ["model.classifier '", "not/a/folder", "does not exist"]),
])
def test_bad_input_stops_in_seconds_with_error_and_hint_and_registers_nothing(models, bad, tmp_path, capsys, case,
                                                                              sets, words):
    model = str(bad.get(case) or models.get(case) or case)
    rc, err = cli(tmp_path, capsys, model, *[s.replace("BERT_BASE", str(models["bert-base"])) for s in sets])
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert lines[0].startswith("error: ") and lines[1].startswith("hint: ") and "Traceback" not in err
    assert all(w in err for w in words), err
    assert registered(tmp_path) == []


def test_an_unreachable_registry_stops_before_anything_is_written(models, tmp_path, capsys):
    from netutil import free_port

    rc, err = cli(tmp_path, capsys, "models:/reviews@champion", tracking=f"http://127.0.0.1:{free_port()}")
    assert rc == 2 and "unreachable" in err and "hint:" in err, err


# ---------------------------------------------------------------------- the whole flow


def run_evaluate(tmp: Path, model: str, *sets: str, env: dict | None = None, args: tuple = (), rc: int = 0) -> dict:
    """`ttt-pipeline evaluate ... --json` in a subprocess on 40 demo test reviews (`args` added), exiting `rc`; its
    JSON summary."""
    import os
    import subprocess
    import sys

    command = [sys.executable, "-m", "ttt_pipeline.cli.main", "evaluate", "--model", model, "--config", "demo",
               "--json", *args,
               *[a for s in (f"store={tmp / 'store'}", f"tracking.tracking_uri=sqlite:///{tmp / 'mlflow.db'}",
                             f"tracking.artifact_root={tmp / 'mlruns'}", "data.max_test_samples=40", *sets)
                 for a in ("--set", s)]]
    run = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=tmp,
                         env={**os.environ, "PREFECT_HOME": str(tmp / "prefect"), "HF_HUB_OFFLINE": "1",
                              "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180", **(env or {})})
    assert run.returncode == rc, run.stdout[-3000:] + run.stderr[-3000:]
    return {**json.loads(run.stdout.strip().splitlines()[-1]), "stdout": run.stdout}


@pytest.mark.slow
def test_each_family_runs_to_a_summary_with_intervals_and_a_registered_model(models, tmp_path):
    """BERT with ttt.mlm_from scores masked TTT; DistilBERT has no MLM head and leaves it out, saying why; RoBERTa
    (a BPE tokenizer) runs too. Each is registered under its own name, loads back and predicts. The CI gate reads
    the real figures: rules that cannot hold exit 0, one that must exits 3, each job summary says which."""
    from ttt_pipeline.io.mlflow_model import load_classifier

    bert = run_evaluate(tmp_path, str(models["bert"]), f"ttt.mlm_from={models['bert-base']}")
    assert {"masked_ttt", "spell", "mask_ensemble", "spell+masked_ttt"} <= set(bert["gains"])
    # the demo preset splits its test reviews off the file the stand-in models may have seen: only that note
    assert [n for n in bert["notes"] if "the 40 test reviews are 30% of" not in n] == []
    gain = bert["defense_gain"]
    assert gain["method"] == "spell" and gain["ci_low"] <= gain["delta"] <= gain["ci_high"]
    step_summary = tmp_path / "step-summary.md"
    distil = run_evaluate(tmp_path, str(models["distilbert"]), env={"GITHUB_STEP_SUMMARY": str(step_summary)},
                          args=("--fail-if", "drop.ci_low > 100pt", "--fail-if", "acc_clean > 1"))
    assert distil["gate"]["passed"] and [r["holds"] for r in distil["gate"]["rules"]] == [False, False]
    assert distil["gate"]["rules"][1]["value"] == distil["acc_clean"]
    assert distil["gate"]["rules"][0]["value"] == distil["corruption_drop"]["ci_low"]
    assert "## ttt-pipeline gate: passed" in step_summary.read_text()
    assert set(distil["gains"]) == {"spell", "mask_ensemble"}
    assert "note: masked_ttt, spell+masked_ttt: masked TTT left out" in distil["stdout"]
    roberta = run_evaluate(tmp_path, str(models["roberta"]), args=("--fail-if", "acc_clean >= 0", "--fail-if",
                                                                  "harm/default > 1", "--gate-summary", "gate.md"), rc=3)
    assert roberta["gate"]["held"] == ["acc_clean >= 0"]
    assert "gate: HOLDS: acc_clean >= 0" in roberta["stdout"]
    assert "failed: 1 of 2 rules hold" in (tmp_path / "gate.md").read_text()
    names = {r["registry"]["model_name"] for r in (bert, distil, roberta)}
    assert names == {f"ttt-demo-reviews-negative-positive-{f}" for f in FAMILIES}
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    clf = load_classifier("models:/ttt-demo-reviews-negative-positive-bert@champion", tracking_uri=uri)
    assert clf.method == "spell" and clf.label_names == ["negative", "positive"]
    probs = clf.predict_proba(REVIEWS, method="none", precision="fp32")
    expected = torch.softmax(hf_logits(models["bert"], REVIEWS), -1).numpy()
    np.testing.assert_allclose(probs, expected, rtol=1e-4, atol=1e-5)
    night = reevaluate(tmp_path, str(models["distilbert"]))
    assert night["verdict"] == "ok" and night["model_name"] == "ttt-demo-reviews-negative-positive-distilbert"


def reevaluate(tmp: Path, model: str) -> dict:
    """`ttt-pipeline reevaluate --model MODEL --json` with run_evaluate's store and MLflow: its outcome."""
    import os
    import subprocess
    import sys

    args = [sys.executable, "-m", "ttt_pipeline.cli.main", "reevaluate", "--model", model, "--config", "demo", "--json",
            *[a for s in (f"store={tmp / 'store'}", f"tracking.tracking_uri=sqlite:///{tmp / 'mlflow.db'}",
                          f"tracking.artifact_root={tmp / 'mlruns'}", "data.max_test_samples=40") for a in ("--set", s)]]
    run = subprocess.run(args, capture_output=True, text=True, timeout=900, cwd=tmp,
                         env={**os.environ, "PREFECT_HOME": str(tmp / "prefect"), "HF_HUB_OFFLINE": "1",
                              "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180"})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_an_mlflow_transformers_model_and_a_hub_id_are_evaluated_like_a_folder(models, tmp_path):
    """The same DistilBERT three ways: its folder, `models:/` of an MLflow transformers pipeline, and a hub id
    served from a local Hugging Face cache (HF_HUB_OFFLINE): identical accuracies, one evaluation, one registered
    model (the first spelling's name), which `reevaluate --model` of another spelling judges."""
    import mlflow
    from transformers import pipeline

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    try:
        with mlflow.start_run():
            mlflow.transformers.log_model(pipeline("text-classification", model=str(models["distilbert"])),
                                          name="model", registered_model_name="shop-sentiment",
                                          pip_requirements=["transformers", "torch"])
    finally:
        mlflow.set_tracking_uri(None)
    folder = run_evaluate(tmp_path, str(models["distilbert"]))
    logged = run_evaluate(tmp_path, "models:/shop-sentiment/1")
    hub = tmp_path / "hf-home" / "hub" / "models--acme--tiny-distilbert"
    snapshot = hub / "snapshots" / ("0" * 40)
    shutil.copytree(models["distilbert"], snapshot)
    (hub / "refs").mkdir()
    (hub / "refs" / "main").write_text("0" * 40)
    from_hub = run_evaluate(tmp_path, "acme/tiny-distilbert", env={"HF_HOME": str(tmp_path / "hf-home")})
    for other in (logged, from_hub):
        assert other["acc_clean"] == folder["acc_clean"] and other["acc_default"] == folder["acc_default"]
        # one model, one name: the same weights make the same imported model, scored once, registered once more
        assert other["registry"]["model_name"] == "ttt-demo-reviews-negative-positive-distilbert"
        assert other["model_path"] != folder["model_path"] and other["cached"]["evaluate"] is True
    assert [r["registry"]["version"] for r in (folder, logged, from_hub)] == ["1", "2", "3"]
    assert from_hub["registry"]["champion_after"] == "1"  # a tie keeps the first
    night = reevaluate(tmp_path, "models:/shop-sentiment/1")  # the spelling finds the name it was registered under
    assert night["verdict"] == "ok" and night["model_name"] == "ttt-demo-reviews-negative-positive-distilbert"
    plugin_equals_the_command_line(tmp_path, "models:/shop-sentiment/1")


def plugin_equals_the_command_line(tmp: Path, model: str) -> None:
    """mlflow.models.evaluate(..., evaluators=["ttt_robustness"]) on 40 demo reviews as a DataFrame gives the
    metrics `ttt-pipeline evaluate --set data.test_path=` logs for the same reviews as a file (its own store)."""
    import mlflow
    import pandas as pd

    from ttt_pipeline.config import load_config

    frame = pd.read_json(load_config("demo").data.path, lines=True)
    frame = frame.loc[frame["rating"] != 3, ["text", "rating"]].head(40).reset_index(drop=True)
    frame.to_parquet(tmp / "reviews.parquet", index=False)
    methods = ["none", "spell", "mask_ensemble"]  # a repair and an engine: the grid's two kinds, in less time
    cli = run_evaluate(tmp, model, f"data.test_path={tmp / 'reviews.parquet'}", "data.max_test_samples=null",
                       f"ttt.methods=[{', '.join(methods)}]")
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    child = client.search_runs([cli["experiment_id"]], f"tags.mlflow.parentRunId = '{cli['mlflow_run_id']}' and "
                               "attributes.run_name = 'evaluate'")[0]
    mlflow.set_tracking_uri(uri)
    try:
        with mlflow.start_run():
            result = mlflow.models.evaluate(model, frame, targets="rating", model_type="classifier",
                                            evaluators=["ttt_robustness"],
                                            evaluator_config={"ttt_robustness": {"store": str(tmp / "plugin-store"),
                                                                              "ttt.methods": methods}})
    finally:
        mlflow.set_tracking_uri(None)
    assert len(result.metrics) > 40 and result.metrics["acc_clean"] == cli["acc_clean"]
    assert result.metrics == {k: child.data.metrics[k] for k in result.metrics}


@pytest.mark.slow
def test_a_pipeline_trained_model_through_model_predicts_as_the_pipelines_evaluate(tiny_bert_dir, tmp_path):
    """Consistency: the tiny pipeline's own model, evaluated through `--model` (its MLflow Model by run id),
    gives the pipeline evaluate step's predictions review for review."""
    import yaml
    from tiny_config import tiny_config

    from ttt_pipeline import steps
    from ttt_pipeline.cli.main import main
    from ttt_pipeline.storage import StepStore

    # no calibration suite: its own evaluate outputs would sit beside the two compared here
    cfg = tiny_config(tmp_path, tiny_bert_dir, ttt={"methods": ["none", "spell", "masked_ttt"], "batch_size": 8},
                      evaluation={"default_defense": "spell"}, registry={"enabled": False},
                      monitoring={"calibration_families": []})
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(cfg))
    assert main(["run", "--config", str(config)]) == 0
    from mlflow.tracking import MlflowClient

    client = MlflowClient(cfg["tracking"]["tracking_uri"])
    runs = client.search_runs([client.get_experiment_by_name("tests").experiment_id], "tags.stage = 'finetune'")
    assert main(["evaluate", "--config", str(config), "--model", f"runs:/{runs[0].info.run_id}/model-missing"]) == 2
    assert main(["evaluate", "--config", str(config), "--model", runs[0].info.run_id]) == 0
    store = StepStore(cfg["store"])
    evals = sorted((Path(cfg["store"]) / "evaluate").glob("*/manifest.json"), key=lambda p: p.stat().st_mtime)
    assert len(evals) == 2
    own, brought = (steps.read_predictions([store.load("evaluate", p.parent.name)]) for p in evals)
    assert len(own) == len(brought) > 0
    assert own["pred"].tolist() == brought["pred"].tolist() and own["method"].tolist() == brought["method"].tolist()
