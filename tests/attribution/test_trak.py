"""TRAK attribution (ttt_pipeline.evaluation.attribution) on a tiny random BERT: the cut-out tail reproduces the model,
scores are deterministic for a seed, a planted copy of a target review ranks first for it, targets are drawn
from stored predictions as documented, and the pipeline step caches its output."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from ttt_pipeline.evaluation import attribution as A

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "data" / "demo" / "reviews.jsonl"
LABELS = ["1", "2", "3", "4", "5"]


@pytest.fixture(scope="module")
def reviews() -> pd.DataFrame:
    return pd.read_json(DEMO, lines=True)


def _predict(model, tok, texts: list[str]) -> list[int]:
    enc = tok(texts, truncation=True, max_length=48, padding=True, return_tensors="pt")
    with torch.no_grad():
        return model(enc["input_ids"], enc["attention_mask"]).argmax(-1).tolist()


@pytest.mark.parametrize("params", ["head", "head+last1", "head+last2"])
def test_tail_reproduces_the_models_logits(tiny_star_clf, reviews, params):
    model, tok = tiny_star_clf
    n = A.tail_size(params)
    enc = A.Encoded.of(tok, reviews["text"][:6].tolist(), 48)
    for _, ids, am in enc.batches(6):
        tail = A.Tail(model, n)
        logits = tail(A.boundary_states(model, ids, am, n), am)
        assert torch.allclose(logits, model(ids, am), atol=1e-5)
        assert sum(p.numel() for p in tail.parameters()) == sum(p.numel() for p in model.head.parameters()) + sum(
            p.numel() for layer in list(A.encoder_layers(model))[2 - n:] if n for p in layer.parameters())


def test_params_beyond_the_encoder_are_a_config_error(tiny_star_clf):
    from ttt_pipeline.errors import ConfigError

    with pytest.raises(ConfigError, match="attribution.params"):
        A.Tail(tiny_star_clf[0], 3)
    with pytest.raises(ValueError):
        A.tail_size("last2")


def test_margin_is_the_multiclass_margin():
    logits = torch.tensor([[2.0, 1.0, 0.0], [0.0, 0.0, 3.0]])
    m = A.margins(logits, torch.tensor([0, 1]))
    expected = [2.0 - np.log(np.exp(1.0) + np.exp(0.0)), 0.0 - np.log(np.exp(0.0) + np.exp(3.0))]
    assert m.tolist() == pytest.approx(expected, abs=1e-6)


def _scores(clf, reviews, seed: int, params: str = "head+last1", models=None):
    model, tok = clf
    train = reviews.iloc[:64]
    targets = reviews["text"].iloc[100:103].tolist()
    return A.trak_scores(models or [model], tok, train["text"].tolist(), (train["rating"] - 1).tolist(), targets,
                         _predict(model, tok, targets), params=params, proj_dim=32, max_length=48, batch_size=32,
                         seed=seed)


def test_scores_are_deterministic_for_a_seed(tiny_star_clf, reviews):
    a, b, c = _scores(tiny_star_clf, reviews, 0), _scores(tiny_star_clf, reviews, 0), _scores(tiny_star_clf, reviews, 1)
    assert a.scores.shape == (3, 64) and np.isfinite(a.scores).all()
    assert np.array_equal(a.scores, b.scores)  # bit for bit
    assert not np.allclose(a.scores, c.scores)  # the seed draws the projection
    assert a.proj_dim == 32 and a.n_models == 1 and a.projector == "basic-normal"
    assert a.grad_dim == sum(p.numel() for p in A.Tail(tiny_star_clf[0], 1).parameters())
    # the stored margins are the model's own margins of the attributed classes
    model, tok = tiny_star_clf
    texts = reviews["text"].iloc[100:103].tolist()
    enc = tok(texts, truncation=True, max_length=48, padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(enc["input_ids"], enc["attention_mask"])
    expected = A.margins(logits, logits.argmax(-1)).numpy()
    assert a.target_margins[:, 0] == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize("params,seed", [("head+last1", 0), ("head+last1", 1), ("head+last2", 0)])
def test_a_planted_duplicate_ranks_first(tiny_star_clf, reviews, params, seed):
    """Each target's exact copy, planted in the training set with the attributed label, is its top supporter.
    (Gradients of a random tiny model's head alone, 613 numbers, do not single the copy out reliably: its top
    layer's do.)"""
    model, tok = tiny_star_clf
    targets = reviews["text"].iloc[200:204].tolist()
    attributed = _predict(model, tok, targets)
    train = reviews.iloc[:80]
    texts, labels = train["text"].tolist(), (train["rating"] - 1).tolist()
    planted = [7, 23, 41, 66]
    for pos, text, label in zip(planted, targets, attributed):
        texts[pos], labels[pos] = text, label
    res = A.trak_scores([model], tok, texts, labels, targets, attributed, params=params, proj_dim=32,
                        max_length=48, batch_size=32, seed=seed)
    assert res.scores.argmax(1).tolist() == planted


def test_an_ensemble_averages_its_checkpoints(tiny_star_clf, reviews, make_tiny_clf):
    """Two checkpoints (one loaded lazily) give scores that differ from either alone: TRAK averages them."""
    other, _ = make_tiny_clf(LABELS, head_dropout=0.0, seed=1)
    both = _scores(tiny_star_clf, reviews, 0, models=[tiny_star_clf[0], lambda: other.eval()])
    one = _scores(tiny_star_clf, reviews, 0)
    assert both.n_models == 2 and both.target_margins.shape == (3, 2)
    assert not np.allclose(both.scores, one.scores)


def _preds() -> pd.DataFrame:
    """Clean, one corrupted set and one shifted set, 6 reviews; methods none and masked_ttt (two mask seeds)."""
    label = [0, 1, 2, 0, 1, 2]
    rows = []

    def add(kind, name, method, seed, pred):
        for i, (y, p) in enumerate(zip(label, pred)):
            rows.append({"kind": kind, "set": name, "family": "keyboard" if kind == "corrupted" else None,
                         "severity": 3 if kind == "corrupted" else None, "method": method, "mask_seed": seed,
                         "index": i, "label": y, "pred": p, "probs": [0.0, 0.0, 0.0]})

    add("clean", "clean", "none", None, [0, 1, 2, 0, 1, 0])           # review 5 wrong on clean text
    add("clean", "clean", "masked_ttt", 0, [0, 1, 2, 0, 1, 2])        # ... fixed by TTT
    add("clean", "clean", "masked_ttt", 1, [0, 1, 2, 0, 1, 0])
    add("corrupted", "keyboard-3", "none", None, [0, 2, 2, 1, 1, 0])  # 1 and 3 flipped right -> wrong
    add("corrupted", "keyboard-3", "masked_ttt", 0, [0, 1, 0, 1, 1, 0])  # 1 fixed, 2 broken
    add("corrupted", "keyboard-3", "masked_ttt", 1, [1, 1, 1, 1, 1, 1])  # a later seed: ignored
    add("shift", "shift_books", "none", None, [0, 1, 2, 0, 1, 2])
    add("shift", "shift_books", "masked_ttt", 0, [0, 1, 2, 0, 1, 2])
    frame = pd.DataFrame(rows)
    frame["severity"] = frame["severity"].astype("Int64")
    frame["mask_seed"] = frame["mask_seed"].astype("Int64")
    return frame


def test_targets_are_flips_fixes_and_breaks():
    targets = A.select_targets(_preds(), max_targets=10)
    got = {(t["set"], t["index"]): sorted(t["reasons"]) for t in targets}
    assert got == {("clean", 5): ["fixed"], ("keyboard-3", 1): ["fixed", "flip"], ("keyboard-3", 2): ["broke"],
                   ("keyboard-3", 3): ["flip"]}
    flip = next(t for t in targets if t["set"] == "keyboard-3" and t["index"] == 1)
    assert flip["pred"] == 2 and flip["label"] == 1 and flip["pred_clean"] == 1
    assert flip["methods"] == {"masked_ttt": 1} and flip["kind"] == "corrupted" and flip["severity"] == 3


def test_target_draw_is_capped_round_robin_and_seeded():
    preds = _preds()
    two = A.select_targets(preds, max_targets=2, seed=0)
    assert len(two) == 2
    assert {r for t in two for r in t["reasons"]} >= {"flip", "fixed"}  # one per reason before a second flip
    assert two == A.select_targets(preds, max_targets=2, seed=0)
    only_breaks = A.select_targets(preds, reasons=["broke"], max_targets=5)
    assert [(t["set"], t["index"]) for t in only_breaks] == [("keyboard-3", 2)]


def test_explain_lists_supporting_and_opposing_reviews(tiny_star_clf, reviews):
    model, tok = tiny_star_clf
    preds = _preds()
    texts = {name: reviews["text"].iloc[300 + 10 * k:306 + 10 * k].tolist()
             for k, name in enumerate(["clean", "keyboard-3", "shift_books"])}
    train = reviews.iloc[:48]
    result, scores = A.explain(preds, lambda s, i: texts[s][i], [model], tok, train["text"].tolist(),
                               (train["rating"] - 1).tolist(), LABELS, top_k=3, proj_dim=16, max_train=40,
                               batch_size=32, max_length=48)
    assert result["n_train"] == 40 and result["n_targets"] == 4 and scores.shape == (4, 40)
    assert result["train_index"] == sorted(result["train_index"]) and len(set(result["train_index"])) == 40
    for j, t in enumerate(result["targets"]):
        sup, opp = [e["score"] for e in t["supporting"]], [e["score"] for e in t["opposing"]]
        assert len(sup) == len(opp) == 3
        assert sup == sorted(sup, reverse=True) and opp == sorted(opp)
        assert sup[0] == pytest.approx(scores[j].max()) and opp[0] == pytest.approx(scores[j].min())
        top = t["supporting"][0]
        assert top["label"] == LABELS[int(train["rating"].iloc[top["train_index"]]) - 1]
        assert t["text"] == texts[t["set"]][t["index"]] and t["attributed"] == t["pred"]
    rows = A.table_rows(result)
    assert len(rows) == 4 * 2 * 3 and {r["direction"] for r in rows} == {"supporting", "opposing"}
    text = A.format_target(result["targets"][0], 2)
    assert "supporting training reviews" in text and "opposing training reviews" in text


def test_explain_picks_the_example_or_says_which_exist():
    from ttt_pipeline.errors import PipelineError
    from ttt_pipeline.io.explain import pick

    result = {"targets": [{"set": "clean", "index": 5}, {"set": "keyboard-3", "index": 5},
                          {"set": "keyboard-3", "index": 2}]}
    assert len(pick(result, 5)) == 2 and pick(result, 5, "clean") == [result["targets"][0]]
    with pytest.raises(PipelineError, match="keyboard-3:2"):
        pick(result, 9)


def test_config_section_is_validated_at_the_edge():
    from ttt_pipeline.config import load_config
    from ttt_pipeline.errors import ConfigError

    cfg = load_config("demo")
    assert cfg.attribution.enabled is False  # off in the demo
    assert load_config("mdsd-electronics").attribution.enabled is True
    for bad, field in (("attribution.params=last1", "attribution.params"), ("attribution.top_k=0", "attribution.top_k"),
                       ("attribution.reasons=[typo]", "attribution.reasons")):
        with pytest.raises(ConfigError, match=field):
            load_config("demo", [bad])


# ---- the pipeline step on the tiny pipeline ------------------------------------------------------------------


@pytest.fixture(scope="module")
def upstream(tmp_path_factory, tiny_bert_dir):
    """download -> tokenise -> finetune and corrupt of the tiny configuration (no Prefect), and an evaluate
    output holding chosen predictions: the tiny random model predicts one class for every review, so it would
    flip nothing."""
    from tiny_config import tiny_config

    from ttt_pipeline import steps
    from ttt_pipeline.config import PipelineConfig
    from ttt_pipeline.storage import StepStore

    tmp = tmp_path_factory.mktemp("attr")
    cfg = PipelineConfig.model_validate(tiny_config(
        tmp, tiny_bert_dir, finetune={"epochs": 1}, corruption={"families": ["keyboard"], "severities": [3]},
        attribution={"enabled": True, "proj_dim": 16, "top_k": 3, "max_targets": 4, "batch_size": 32}))
    store = StepStore(cfg.store)
    data = steps.download(cfg, store)
    tokens = steps.tokenise(cfg, data, store)
    model = steps.finetune(cfg, data, tokens, store)
    corrupted = steps.corrupt(cfg, data, store)
    n = corrupted.meta["sets"]["keyboard-3"]["n"]
    labels = [i % 5 for i in range(n)]

    def build(tmp_dir: Path) -> dict:
        rows = []
        for kind, name, method, seed, flip in (("clean", "clean", "none", None, set()),
                                               ("corrupted", "keyboard-3", "none", None, {1, 4, 7}),
                                               ("corrupted", "keyboard-3", "masked_ttt", 0, {4, 9})):
            for i, y in enumerate(labels):
                rows.append({"kind": kind, "set": name, "family": "keyboard" if kind == "corrupted" else None,
                             "severity": 3 if kind == "corrupted" else None, "method": method, "mask_seed": seed,
                             "index": i, "label": y, "pred": (y + 1) % 5 if i in flip else y, "probs": [0.2] * 5})
        frame = pd.DataFrame(rows)
        frame["severity"] = frame["severity"].astype("Int64")
        frame["mask_seed"] = frame["mask_seed"].astype("Int64")
        frame.to_parquet(tmp_dir / "predictions.parquet", index=False)
        return {}

    evaluation = store.run("evaluate", {"test": "chosen predictions", "n": n}, build)
    return cfg, store, data, model, corrupted, evaluation


def test_attribute_step_writes_explanations_and_is_cached(upstream):
    from ttt_pipeline import steps

    cfg, store, data, model, corrupted, evaluation = upstream
    out = steps.attribute(cfg, data, model, corrupted, [evaluation], store)
    assert not out.cached and out.wall_s > 0
    result = json.loads((Path(out.path) / "attribution.json").read_text())
    scores = np.load(Path(out.path) / "scores.npy")
    assert result["n_train"] == out.meta["n_train"] == len(result["train_index"])
    assert result["n_targets"] == 4 and scores.shape == (4, result["n_train"])
    got = {(t["set"], t["index"]): sorted(t["reasons"]) for t in result["targets"]}
    # flips 1, 4, 7; TTT fixed 1 and 7 (its seed-0 prediction is right there) and broke 9; 4 stays wrong
    assert got == {("keyboard-3", 1): ["fixed", "flip"], ("keyboard-3", 4): ["flip"],
                   ("keyboard-3", 7): ["fixed", "flip"], ("keyboard-3", 9): ["broke"]}
    texts = steps.read_set(corrupted, "keyboard-3")
    names = cfg.data.label_names
    for t in result["targets"]:
        assert t["text"] == texts[t["index"]] and len(t["supporting"]) == len(t["opposing"]) == 3
        assert t["label"] == names[t["index"] % 5]
        assert t["pred"] == t["attributed"] == (names[(t["index"] + 1) % 5] if "flip" in t["reasons"]
                                                else t["label"])
        for e in t["supporting"] + t["opposing"]:
            assert e["label"] in names and np.isfinite(e["score"])
    again = steps.attribute(cfg, data, model, corrupted, [evaluation], store)
    assert again.cached and again.digest == out.digest
    # the key ignores `enabled` only: any other setting is a new entry
    other = cfg.model_copy(update={"attribution": cfg.attribution.model_copy(update={"seed": 1})})
    assert steps.attribute_inputs(other, data, model, corrupted, [evaluation]) != steps.attribute_inputs(
        cfg, data, model, corrupted, [evaluation])
    off = cfg.model_copy(update={"attribution": cfg.attribution.model_copy(update={"enabled": False})})
    assert steps.attribute_inputs(off, data, model, corrupted, [evaluation]) == steps.attribute_inputs(
        cfg, data, model, corrupted, [evaluation])


def test_disabled_attribution_leaves_the_other_steps_keys_alone(upstream):
    """Enabling attribution changes no upstream cache key: a run with it off is the same run as before."""
    from ttt_pipeline import steps

    cfg, store, data, model, corrupted, evaluation = upstream
    off = cfg.model_copy(update={"attribution": cfg.attribution.model_copy(update={"enabled": False})})
    for a, b in ((cfg, off),):
        assert steps.download_inputs(a) == steps.download_inputs(b)
        assert steps.corrupt_inputs(a, data) == steps.corrupt_inputs(b, data)
        assert steps.evaluate_inputs(a, data, model, corrupted) == steps.evaluate_inputs(b, data, model, corrupted)


def test_attribute_stage_is_logged_and_explained(upstream, monkeypatch, capsys):
    """The stage's MLflow child run (table artifact, full result), its Prefect table, and `ttt-pipeline explain`
    reading them back through MLflow."""
    import prefect.artifacts
    from mlflow.tracking import MlflowClient

    from ttt_pipeline import steps
    from ttt_pipeline.cli.main import main
    from ttt_pipeline.io.tracking import Tracker
    from ttt_pipeline.tasks.step_tasks import log_step_task

    cfg, store, data, model, corrupted, evaluation = upstream
    out = steps.attribute(cfg, data, model, corrupted, [evaluation], store)
    tables = []
    monkeypatch.setattr(prefect.artifacts, "create_table_artifact", lambda rows, **kw: tables.append((rows, kw)))
    tracker = Tracker.from_config(cfg.tracking)
    parent = tracker.start("pipeline")
    logged = log_step_task.fn(cfg, "attribute", [out.to_dict()], parent, True)
    client = MlflowClient(tracker.uri)
    child = client.get_run(logged["run_id"])
    assert child.info.run_name == "attribute" and child.data.tags["mlflow.parentRunId"] == parent
    assert child.data.tags["cache_hit"] == "true"
    assert child.data.metrics["n_targets"] == 4 and child.data.metrics["n_targets/flip"] == 3
    assert child.data.params["attribution.params"] == "head+last1"
    names = {a.path for a in client.list_artifacts(child.info.run_id)}
    assert {"attribution.json", "attribution_targets.json"} <= names
    table = json.loads(Path(client.download_artifacts(child.info.run_id, "attribution.json")).read_text())
    assert len(table["data"]) == 4 * 2 * 3 and "train_text" in table["columns"]
    (rows, kw), = tables
    assert kw["key"] == "attribution" and len(rows) == 4 * 2 * 3

    assert main(["explain", parent, "--example", "4", "--tracking-uri", tracker.uri, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    (t,) = shown["targets"]
    assert (t["set"], t["index"], t["reasons"]) == ("keyboard-3", 4, ["flip"]) and len(t["supporting"]) == 3
    assert main(["explain", logged["run_id"], "--example", "4", "--tracking-uri", tracker.uri, "--top", "2"]) == 0
    text = capsys.readouterr().out
    assert "example 4 of keyboard-3 (flip)" in text and "supporting training reviews" in text
    assert main(["explain", parent, "--example", "5", "--tracking-uri", tracker.uri]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: example 5 was not explained") and "keyboard-3:4" in err and "hint:" in err
    bare = tracker.start("pipeline without attribution")
    assert main(["explain", bare, "--example", "4", "--tracking-uri", tracker.uri]) == 2
    assert "no attribute stage" in capsys.readouterr().err
