"""The Python API (`ttt_pipeline.load_classifier`), the MLflow Model it is logged as (pyfunc with our loader),
its registration, and loading it back by run id and `models:/` URI."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from serving_helpers import LABELS, TEXTS, same_predictions

from ttt_pipeline.classifier import inference_config, softmax
from ttt_pipeline.config import TTTConfig
from ttt_pipeline.errors import ConfigError, PipelineError
from ttt_pipeline.io.mlflow_model import load_classifier


@pytest.fixture(scope="module")
def clf(tiny_model_dir):
    return load_classifier(tiny_model_dir, device="cpu")


def test_import_stays_light():
    code = ("import sys, ttt_pipeline; from ttt_pipeline import load_classifier, Classifier; "
            "print(sorted(m for m in ('torch', 'mlflow', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_predict_is_the_evaluate_code_path(clf, tiny_model_dir):
    from ttt_pipeline.evaluation.scoring import predict_texts

    assert clf.label_names == LABELS and clf.method == "none"
    for method, settings in (("none", TTTConfig()), ("masked_ttt", TTTConfig(steps=2, lr=1e-3, batch_size=2))):
        want = softmax(predict_texts(clf.model, clf.tokenizer, TEXTS, method, settings, 48, settings.batch_size))
        got = clf.predict_proba(TEXTS, method, steps=settings.steps, lr=settings.lr, batch_size=settings.batch_size)
        np.testing.assert_array_equal(got, want)
    records = clf.predict(TEXTS, "none")
    probs = clf.predict_proba(TEXTS, "none")
    assert len(records) == len(TEXTS)
    for rec, row in zip(records, probs):
        assert list(rec["probabilities"]) == LABELS
        assert rec["label"] == LABELS[int(row.argmax())] and rec["probability"] == pytest.approx(float(row.max()))
        assert sum(rec["probabilities"].values()) == pytest.approx(1.0, abs=1e-5)
    assert clf.predict([], "none") == []
    assert same_predictions(clf.predict(TEXTS[0], "none"), records[:1])  # one string is one text


def test_settings_are_validated_and_named(clf):
    plain = clf.predict_proba(TEXTS, "none")
    adapted = clf.predict_proba(TEXTS, "masked_ttt", steps=3, lr=1e-2)
    assert np.abs(plain - adapted).max() > 1e-4  # TTT changed the predictions...
    np.testing.assert_array_equal(clf.predict_proba(TEXTS, "none"), plain)  # ...and the weights came back
    with pytest.raises(ConfigError, match=r"ttt\.steps"):
        clf.predict(TEXTS, "masked_ttt", steps=0)
    with pytest.raises(ConfigError, match="unknown method 'nope'"):
        clf.predict(TEXTS, "nope")
    with pytest.raises(ConfigError, match="bogus"):
        clf.predict(TEXTS, bogus=1)
    # a defense's own settings by their flat name; a key from before they moved names the new one
    tented = clf.predict_proba(TEXTS, "tent", **{"tent.lr": 1e-1, "tent.steps": 3})
    assert np.abs(tented - clf.predict_proba(TEXTS, "tent")).max() > 1e-5
    with pytest.raises(ConfigError, match=r"ttt\.tent\.steps"):
        clf.predict(TEXTS, "tent", **{"tent.steps": 0})
    with pytest.raises(ConfigError, match="tent_lr is now tent.lr"):
        clf.predict(TEXTS, "tent", tent_lr=1e-1)
    with pytest.raises(PipelineError, match="text 1 is NoneType"):
        clf.predict([TEXTS[0], None])
    configured = load_classifier(clf.source, device="cpu", method="masked_ttt", steps=2)
    assert configured.method == "masked_ttt" and configured.config["steps"] == 2


def test_concurrent_ttt_calls_match_sequential_ones(clf):
    """Masked TTT adapts the shared weights in place: concurrent callers are serialised and restored."""
    import torch

    before = {k: v.clone() for k, v in clf.model.state_dict().items()}
    jobs = [TEXTS[i % 5:] + TEXTS[:i % 5] for i in range(8)]  # different batches per caller
    sequential = [clf.predict(j, "masked_ttt", steps=2, lr=1e-2, batch_size=2) for j in jobs]
    results: dict[int, list] = {}

    def call(i: int) -> None:
        results[i] = clf.predict(jobs[i], "masked_ttt", steps=2, lr=1e-2, batch_size=2)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [results[i] for i in range(len(jobs))] == sequential
    after = clf.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


# ----------------------------------------------------------------------------- the MLflow Model


@pytest.fixture(scope="module")
def mlflow_model_dir(tiny_model_dir, tmp_path_factory) -> Path:
    from ttt_pipeline.defenses.vocabulary import training_vocabulary
    from ttt_pipeline.io.mlflow_model import save_classifier_model

    config = inference_config(TTTConfig(steps=2, lr=1e-2, batch_size=2), "masked_ttt")
    return save_classifier_model(tiny_model_dir, tmp_path_factory.mktemp("mlflow-model") / "model", config,
                                 training_vocabulary(TEXTS * 2))


def test_mlflow_model_is_self_contained(mlflow_model_dir):
    """The loader module ships in code/ (MLflow's code_paths), the weights are data files, and requirements.txt
    pins exact versions, torch as its CPU build from PyTorch's CPU index (no CUDA wheels on a CPU-only host), and no
    package of the project's name."""
    import yaml
    from packaging.requirements import Requirement

    from ttt_pipeline import __version__

    spec = yaml.safe_load((mlflow_model_dir / "MLmodel").read_text())
    pyfunc = spec["flavors"]["python_function"]
    assert pyfunc["loader_module"] == "ttt_pipeline.io.mlflow_model" and pyfunc["code"] == "code"
    assert pyfunc["config"]["method"] == "masked_ttt" and pyfunc["config"]["steps"] == 2
    assert spec["metadata"]["label_names"] == LABELS and spec["metadata"]["ttt_pipeline_version"] == __version__
    params = {p["name"]: p for p in json.loads(spec["signature"]["params"])}
    assert {"method", "steps", "lr", "mask_prob", "seed", "batch_size", "spell.max_edit_distance", "tent.lr"} <= set(params)
    assert all(p["default"] is None for p in params.values())  # None: the model config decides
    files = {p.relative_to(mlflow_model_dir).as_posix() for p in mlflow_model_dir.rglob("*") if p.is_file()}
    assert not [f for f in files if f.endswith((".pkl", ".pickle", ".pt", ".bin", ".cloudpickle", ".pyc"))]
    assert {"data/model/head.safetensors", "data/model/vocabulary.json", "data/model/meta.json",
            "requirements.txt", "input_example.json", "serving_input_example.json",
            "code/ttt_pipeline/__init__.py", "code/ttt_pipeline/io/mlflow_model.py",
            "code/ttt_pipeline/classifier.py"} <= files
    assert not [f for f in files if f.startswith("code/") and not f.startswith("code/ttt_pipeline/")]
    assert json.loads((mlflow_model_dir / "serving_input_example.json").read_text())["inputs"]
    lines = [line for line in (mlflow_model_dir / "requirements.txt").read_text().splitlines() if line.strip()]
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in lines
    reqs = [Requirement(line) for line in lines if not line.startswith("-")]
    pins = {r.name: str(r.specifier) for r in reqs if r.name != "torch"}
    assert {"mlflow", "transformers", "tokenizers", "safetensors", "symspellpy", "rapidfuzz"} <= set(pins)
    for name, spec_ in pins.items():
        assert spec_.startswith("==") and "+" not in spec_, (name, spec_)  # exact public versions
    assert not [n for n in pins if "ttt" in n]
    torch = {str(r.marker): str(r.specifier) for r in reqs if r.name == "torch"}
    public = torch['sys_platform == "darwin"']  # macOS: PyTorch's wheels there are CPU-only, without a label
    assert public.startswith("==") and "+" not in public and torch['sys_platform != "darwin"'] == f"{public}+cpu"


def served(records: list[dict], method: str) -> list[dict]:
    """The served model's answers: Classifier.predict's, plus the method that ran and the truncation flag."""
    return [{**r, "method": method, "truncated": False} for r in records]


def test_pyfunc_predicts_with_the_model_config_and_per_request_params(mlflow_model_dir, clf):
    import mlflow.pyfunc
    from mlflow.exceptions import MlflowException
    from mlflow.models.utils import _validate_serving_input
    from mlflow.pyfunc.scoring_server import invocations

    model = mlflow.pyfunc.load_model(str(mlflow_model_dir))
    configured = clf.predict(TEXTS, "masked_ttt", steps=2, lr=1e-2, batch_size=2)
    assert model.predict(TEXTS) == served(configured, "masked_ttt")  # the logged default: masked_ttt, its settings
    assert model.predict(TEXTS, params={"method": "none"}) == served(clf.predict(TEXTS, "none", batch_size=2), "none")
    assert model.predict(TEXTS, params={"steps": 1}) == served(clf.predict(TEXTS, "masked_ttt", lr=1e-2, batch_size=2),
                                                                "masked_ttt")
    schema = model.metadata.get_input_schema()
    for body in ({"inputs": TEXTS}, {"dataframe_records": [{"text": t} for t in TEXTS]}):
        r = invocations(json.dumps(body), "application/json", model, schema)
        assert r.status == 200 and json.loads(r.response) == {"predictions": served(configured, "masked_ttt")}
    r = invocations(json.dumps({"inputs": TEXTS[:2], "params": {"method": "none"}}), "application/json", model, schema)
    assert json.loads(r.response)["predictions"] == served(clf.predict(TEXTS[:2], "none", batch_size=2), "none")
    with pytest.raises(MlflowException, match=r"ttt\.steps") as bad:
        model.predict(TEXTS, params={"steps": 0})
    assert bad.value.error_code == "INVALID_PARAMETER_VALUE"
    with pytest.raises(MlflowException, match="text is missing"):
        invocations(json.dumps({"dataframe_records": [{"text": None}]}), "application/json", model, schema)
    _validate_serving_input(str(mlflow_model_dir), (mlflow_model_dir / "serving_input_example.json").read_text())
    # a load-time model_config overrides the logged one, as MLflow documents
    plain = mlflow.pyfunc.load_model(str(mlflow_model_dir), model_config={"method": "none"})
    assert plain.predict(TEXTS) == served(clf.predict(TEXTS, "none", batch_size=2), "none")
    # and the Python API reads the same folder without MLflow
    local = load_classifier(mlflow_model_dir, device="cpu")
    assert local.method == "masked_ttt" and local.vocabulary and local.predict(TEXTS) == configured


def test_vocabulary_repairs_like_the_training_texts():
    from ttt_pipeline.defenses.spell import SpellRepair
    from ttt_pipeline.defenses.vocabulary import training_vocabulary

    train = ["The Sennheiser HD-25 is great.", "sennheiser again, don't buy the Zune", "zune ZUNE once"]
    vocab = training_vocabulary(train)
    assert vocab == {"zune": 3, "sennheiser": 2, "the": 2}
    assert training_vocabulary(train, min_count=3) == {"zune": 3}
    noisy = ["my senheiser broke", "the zume is grate", "Sennhiser and zunee"]
    assert SpellRepair(2, vocab).repair_all(noisy) == SpellRepair(2, train).repair_all(noisy)
    assert SpellRepair(2, vocab).repair_all(noisy)[0] == "my sennheiser broke"


def test_vocabulary_file_round_trip(tmp_path):
    from ttt_pipeline.defenses.vocabulary import read_vocabulary, training_vocabulary, write_vocabulary

    vocab = training_vocabulary(["b a a b c", "a"])
    write_vocabulary(vocab, tmp_path / "vocabulary.json")
    assert read_vocabulary(tmp_path / "vocabulary.json") == vocab == {"a": 3, "b": 2}
    assert list(read_vocabulary(tmp_path / "vocabulary.json")) == ["a", "b"]
    assert read_vocabulary(tmp_path / "missing.json") is None


# ----------------------------------------------------------------------------- logged, registered, loaded back


@pytest.fixture(scope="module")
def registered(tiny_model_dir, tmp_path_factory):
    from ttt_pipeline.io import model_registry as registry
    from ttt_pipeline.io.mlflow_model import log_classifier_model
    from ttt_pipeline.io.tracking import Tracker

    tmp = tmp_path_factory.mktemp("logged")
    tracker = Tracker(f"sqlite:///{tmp}/mlflow.db", "serving", str(tmp / "mlruns"))
    parent = tracker.start("pipeline")
    tracker.metrics(parent, {"acc_ttt": 0.5})
    child = tracker.start("finetune", tags={"stage": "finetune"}, parent=parent)
    model_id = log_classifier_model(tracker.client, child, tiny_model_dir, inference_config(method="none"),
                                    {"sennheiser": 4})
    tracker.end(child)
    tracker.end(parent)
    result = registry.register_run(tracker.client, parent, "serving-classifier", "acc_ttt")
    return {"tmp": tmp, "tracker": tracker, "parent": parent, "child": child, "model_id": model_id,
            "result": result}


def test_fine_tune_run_lists_the_logged_model_and_the_registry_points_at_it(registered):
    client, model_id = registered["tracker"].client, registered["model_id"]
    run = client.get_run(registered["child"])
    assert [o.model_id for o in run.outputs.model_outputs] == [model_id]
    lm = client.get_logged_model(model_id)
    assert lm.source_run_id == registered["child"] and str(lm.status) == "READY"
    assert lm.params["inference.method"] == "none"
    res = registered["result"]
    assert (res.decision, res.version, res.model_id) == ("promoted", "1", model_id)
    mv = client.get_model_version_by_alias("serving-classifier", "champion")
    assert mv.source == lm.artifact_location and mv.run_id == registered["child"]
    linked = json.loads(client.get_logged_model(model_id).tags["mlflow.modelVersions"])
    assert linked == [{"name": "serving-classifier", "version": "1"}]


def test_load_by_alias_version_and_run_ids(registered, clf):
    uri = f"sqlite:///{registered['tmp']}/mlflow.db"
    want = clf.predict(TEXTS, "none")
    for source in ("models:/serving-classifier@champion", "models:/serving-classifier/1",
                   "models:/serving-classifier/latest", registered["parent"], registered["child"],
                   f"models:/{registered['model_id']}"):
        got = load_classifier(source, device="cpu", tracking_uri=uri)
        assert got.source == source and got.vocabulary == {"sennheiser": 4}
        assert got.predict(TEXTS) == want, source


def test_reevaluation_finds_the_classifier_in_the_registered_model(registered, tmp_path):
    import mlflow.artifacts

    from ttt_pipeline.io.nights import model_root as _model_root

    mv = registered["tracker"].client.get_model_version("serving-classifier", "1")
    local = mlflow.artifacts.download_artifacts(artifact_uri=mv.source, dst_path=str(tmp_path),
                                                tracking_uri=registered["tracker"].uri)
    assert (_model_root(Path(local)) / "head.safetensors").is_file()


def test_unknown_references_are_user_errors(registered, tmp_path, monkeypatch):
    uri = f"sqlite:///{registered['tmp']}/mlflow.db"
    with pytest.raises(PipelineError, match="not found in the MLflow registry"):
        load_classifier("models:/no-such-model@champion", tracking_uri=uri)
    with pytest.raises(PipelineError, match="not found in the MLflow registry"):
        load_classifier("models:/serving-classifier/7", tracking_uri=uri)
    with pytest.raises(PipelineError, match="run 0123456789abcdef0123456789abcdef not found"):
        load_classifier("0123456789abcdef0123456789abcdef", tracking_uri=uri)
    with pytest.raises(PipelineError, match="no such folder"):
        load_classifier(str(tmp_path / "nothing-here"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PipelineError, match="no MLflow database"):
        load_classifier("models:/x@champion", tracking_uri="sqlite:///absent.db")
    assert not (tmp_path / "absent.db").exists()


def test_a_method_the_model_cannot_run_is_refused_and_answers_say_what_ran(make_tiny_clf):
    """Masked TTT on a model without an MLM head is a 400 naming why (never a plain prediction under its name);
    each served answer names the method that ran and whether the model read only the text's head."""
    from mlflow.exceptions import MlflowException

    from ttt_pipeline.classifier import Classifier
    from ttt_pipeline.errors import ConfigError
    from ttt_pipeline.io.mlflow_model import PyfuncClassifier

    model, tok = make_tiny_clf(("neg", "pos"), max_length=16)
    model.mlm_head = None  # as a Hugging Face classifier brought without ttt.mlm_from
    clf = Classifier(model, tok, {"method": "spell"})
    with pytest.raises(ConfigError, match="masked_ttt adapts on an MLM head, and this model has none") as err:
        clf.predict(["fine"], "masked_ttt")
    assert "spell" in err.value.hint and "masked_ttt" not in err.value.hint.split(";")[0]
    pyfunc = PyfuncClassifier(clf)
    with pytest.raises(MlflowException, match="MLM head") as bad:
        pyfunc.predict(["fine"], params={"method": "spell+masked_ttt"})
    assert bad.value.error_code == "INVALID_PARAMETER_VALUE"
    answers = pyfunc.predict(["fine", " ".join(["long"] * 40)])
    assert [(a["method"], a["truncated"]) for a in answers] == [("spell", False), ("spell", True)]
    assert pyfunc.predict(["fine"], params={"method": "none"})[0]["method"] == "none"
    huge = "fine " * 400_000  # 2 MB: cut to data.max_text_chars as the data step cuts reviews, and said
    [answer] = pyfunc.predict([huge])
    assert answer["truncated"] is True and answer["label"] == pyfunc.predict([huge[:20_000]])[0]["label"]
