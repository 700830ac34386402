"""The nightly re-evaluation's own tasks: the champion on new labelled reviews (`nightly.data_path`), and the
Prefect event that tells the outcome (`ttt.nightly.ok`, `ttt.nightly.regression`, `ttt.nightly.no-champion`)."""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from ttt_pipeline.config import PipelineConfig

EVENTS = {"ok": "ttt.nightly.ok", "regression": "ttt.nightly.regression", "no_champion": "ttt.nightly.no-champion"}


def _correct(clf, texts: list[str], labels: list[int], method: str):
    import numpy as np

    return (clf.predict_logits(texts, method=method).argmax(-1) == np.asarray(labels)).astype(float)


@task(name="score-new-data", cache_policy=NO_CACHE, retries=0)
def new_data_task(cfg: PipelineConfig, data: dict, model: dict, defense: str) -> dict:
    """The champion on the new reviews and on its own test split, without and with its defense (the same code
    path for both, so the change is the data's): the change of the defended accuracy against the test accuracy
    with its Newcombe interval, the undefended one beside it, and the drift summary."""
    from ttt_pipeline.classifier import from_folder, inference_config
    from ttt_pipeline.data.newdata import read_new_reviews
    from ttt_pipeline.data.prepare import load_prepared
    from ttt_pipeline.defenses.vocabulary import training_vocabulary
    from ttt_pipeline.evaluation.drift import accuracy_change, drift_summary

    dataset, names = load_prepared(data["path"])
    names = [names[str(i)] for i in range(len(names))]
    frame, source = read_new_reviews(cfg.nightly.data_path, cfg.data, names, Path(cfg.store) / "nightly-raw")
    train, test = dataset["train"], dataset["test"]
    clf = from_folder(Path(model["path"]) / "model", inference_config(cfg.ttt, defense),
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
    get_run_logger().info("new data %s: %d reviews, %s accuracy %.3f vs test %.3f", source, len(new_texts), defense,
                          out["with_defense"]["acc"], out["with_defense"]["acc_reference"])
    return out


def emit_outcome(verdict: str, model_name: str | None, payload: dict) -> dict:
    """Emits the night's outcome as a Prefect event (resource: the registered model); returns its name and id
    (id None when no events client is configured)."""
    from prefect.events import emit_event

    name = EVENTS[verdict]
    resource = {"prefect.resource.id": f"ttt.registered-model.{model_name or 'none'}",
                "prefect.resource.name": model_name or "none"}
    event = emit_event(event=name, resource=resource, payload=payload)
    return {"name": name, "id": str(event.id) if event is not None else None}
