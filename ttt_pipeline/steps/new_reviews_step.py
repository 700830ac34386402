"""new-reviews: the champion on labelled reviews that arrived since training (`nightly.data_path`), against its own
test split, without and with its defense (the same code path for both, so the change is the data's): the change of
the defended accuracy against the test accuracy with its Newcombe interval, the undefended one beside it, and the
drift summary. Keyed by the newest file's content, so a night without a new export re-reads the stored result."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from ttt_pipeline.config import PipelineConfig
from ttt_pipeline.steps.guards import guarded
from ttt_pipeline.steps.keys import new_reviews_inputs, version
from ttt_pipeline.storage import StepOutput, StepStore

log = logging.getLogger(__name__)
RESULT = "new_reviews.json"


def _correct(clf, texts: list[str], labels: list[int], method: str):
    import numpy as np

    return (clf.predict_logits(texts, method=method).argmax(-1) == np.asarray(labels)).astype(float)


def _score(cfg: PipelineConfig, data: StepOutput, model: StepOutput, defense: str) -> dict:
    from ttt_pipeline.classifier import from_folder, inference_config
    from ttt_pipeline.data.newdata import read_new_reviews
    from ttt_pipeline.data.prepare import load_prepared
    from ttt_pipeline.defenses.vocabulary import training_vocabulary
    from ttt_pipeline.evaluation.drift import accuracy_change, drift_summary

    dataset, names = load_prepared(data.path)
    names = [names[str(i)] for i in range(len(names))]
    frame, source = read_new_reviews(cfg.nightly.data_path, cfg.data, names, Path(cfg.store) / "nightly-raw")
    train, test = dataset["train"], dataset["test"]
    clf = from_folder(Path(model.path) / "model", inference_config(cfg.ttt, defense),
                      vocabulary=training_vocabulary(train["text"]))
    new_texts, new_labels = frame["text"].tolist(), frame["label"].tolist()
    out = {"source": source, "n": len(new_texts)}
    for method in dict.fromkeys(["none", defense]):
        change = accuracy_change(_correct(clf, new_texts, new_labels, method),
                                 _correct(clf, list(test["text"]), list(test["label"]), method),
                                 cfg.evaluation.confidence)
        out["without_defense" if method == "none" else "with_defense"] = change
    out.setdefault("with_defense", out["without_defense"])
    out["drift"] = drift_summary(train["text"], train["label"], test["text"], new_texts, new_labels, names)
    log.info("new reviews %s: %d reviews, %s accuracy %.3f vs test %.3f", source, len(new_texts), defense,
             out["with_defense"]["acc"], out["with_defense"]["acc_reference"])
    return out


def score_new_reviews(cfg: PipelineConfig, data: StepOutput, model: StepOutput, defense: str,
                      store: StepStore) -> StepOutput:
    """The stored result (`new_reviews.json`, also the output's meta) for `nightly.data_path`'s newest reviews."""

    def build(tmp: Path) -> dict:
        out = _score(cfg, data, model, defense)
        (tmp / RESULT).write_text(json.dumps(out, indent=1))
        return out

    return store.run("new-reviews", new_reviews_inputs(cfg, data, model, defense),
                     guarded(cfg, "evaluate", build), version("new-reviews"))
