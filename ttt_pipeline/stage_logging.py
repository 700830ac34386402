"""What each stage records in its MLflow child run: params, metrics, dataset inputs and artifacts.

Logging reads the stage's stored output (manifest metadata and files), so a stage served from cache is
logged exactly like a fresh one, tagged `cache_hit=true`.
"""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path
from typing import Callable

from .evaluate import headline, metric_name
from .storage import StepOutput
from .tracking import Tracker


def _common(tracker: Tracker, run_id: str, out: StepOutput) -> None:
    tracker.tags(run_id, {"stage": out.step, "cache_hit": str(out.cached).lower(), "step_key": out.key,
                          "output_digest": out.digest, "output_path": out.path})
    tracker.metrics(run_id, {"stage_wall_s": out.wall_s})


def log_download(tracker: Tracker, run_id: str, out: StepOutput, cfg) -> None:
    _common(tracker, run_id, out)
    m = out.meta
    tracker.params(run_id, {f"data.{k}": v for k, v in cfg.data.model_dump(mode="json").items()})
    tracker.params(run_id, {"label_names": json.dumps(m["label_names"]), "content_digest": m["content_digest"]})
    tracker.metrics(run_id, {**{f"n_{s}": n for s, n in m["sizes"].items()},
                             "dropped_empty_text": m.get("dropped_empty_text", 0),
                             "dropped_missing_label": m.get("dropped_missing_label", 0),
                             "truncated_texts": m.get("truncated_texts", 0)})
    for split, n in m["sizes"].items():
        tracker.dataset(run_id, f"reviews-{split}", m["content_digest"], cfg.data.path, split)
    tracker.artifact(run_id, Path(out.path) / "labels.json")
    tracker.dict(run_id, m["class_counts"], "class_counts.json")


def log_tokenise(tracker: Tracker, run_id: str, out: StepOutput, cfg) -> None:
    _common(tracker, run_id, out)
    tracker.params(run_id, {"model.name": cfg.model.name, "model.max_length": cfg.model.max_length})
    tracker.metrics(run_id, {"mean_tokens": out.meta["mean_tokens"], "truncated_share": out.meta["truncated_share"]})


def log_finetune(tracker: Tracker, run_id: str, out: StepOutput, cfg, log_model: bool = True) -> None:
    _common(tracker, run_id, out)
    tracker.params(run_id, {f"finetune.{k}": v for k, v in cfg.finetune.model_dump(mode="json").items()})
    tracker.params(run_id, {f"model.{k}": v for k, v in cfg.model.model_dump(mode="json").items()})
    hist = json.loads((Path(out.path) / "history.json").read_text())
    for row in hist["epochs"]:
        tracker.metrics(run_id, {k: v for k, v in row.items() if k != "epoch"}, step=row["epoch"])
    if hist["mlm_warmup"]:
        tracker.series(run_id, "mlm_warmup_loss", hist["mlm_warmup"])
    if hist["dapt"]:
        tracker.series(run_id, "dapt_mlm_loss", hist["dapt"])
    m = out.meta
    tracker.metrics(run_id, {"best_epoch": m["best_epoch"], "best_val_macro_f1": m["best_val_macro_f1"],
                             "train_samples_per_s": m["train_samples_per_s"], "epochs_run": m["epochs_run"],
                             "mlm_warmup_steps": m["mlm_warmup_steps"],
                             "mlm_warmup_final_loss": m["mlm_warmup_final_loss"]})
    if m.get("oom_halved_batch_size"):  # the CUDA OOM fallback changed the recipe: say so
        tracker.params(run_id, {k: m[k] for k in ("oom_halved_batch_size", "oom_original_batch_size") if k in m})
    tracker.artifact(run_id, Path(out.path) / "history.json")
    log_plots(tracker, run_id, lambda d: _plots().write_finetune_plots(hist, d))
    if log_model:
        tracker.artifact(run_id, Path(out.path) / "model", "model")


def log_corrupt(tracker: Tracker, run_id: str, out: StepOutput, cfg) -> None:
    _common(tracker, run_id, out)
    tracker.params(run_id, {f"corruption.{k}": v for k, v in cfg.corruption.model_dump(mode="json").items()})
    metrics, table = {}, {"set": [], "original": [], "corrupted": []}
    for name, s in out.meta["sets"].items():
        metrics[f"edit_rate/{s['family']}/{s['severity']}"] = s["realised_edit_rate"]
        tracker.dataset(run_id, f"corrupted-{name}", s["digest"], out.path, "test")
        for a, b in s["examples"][:3]:
            table["set"].append(name)
            table["original"].append(a)
            table["corrupted"].append(b)
    tracker.metrics(run_id, metrics)
    tracker.dict(run_id, {n: {k: v for k, v in s.items() if k != "examples"} for n, s in out.meta["sets"].items()},
                 "corruption_sets.json")
    tracker.client.log_table(run_id, data=table, artifact_file="corruption_examples.json")


def log_evaluate(tracker: Tracker, run_id: str, outs: list[StepOutput], results: dict, cfg) -> dict:
    for out in outs:
        _common(tracker, run_id, out)
    tracker.params(run_id, {f"ttt.{k}": v for k, v in cfg.ttt.model_dump(mode="json").items()})
    rows = results["rows"]
    metrics = {}
    for r in rows:
        metrics[f"acc/{metric_name(r)}"] = r["acc"]
        metrics[f"macro_f1/{metric_name(r)}"] = r["macro_f1"]
        if r["method"] != "none":
            metrics[f"samples_per_s/{r['method']}"] = r["samples_per_s"]
    head = headline(rows)
    tracker.metrics(run_id, {**metrics, **head})
    tracker.dict(run_id, results, "evaluation.json")
    if results["samples"]:
        cols = sorted({k for s in results["samples"] for k in s})
        tracker.client.log_table(run_id, data={c: [s.get(c, "") for s in results["samples"]] for c in cols},
                                 artifact_file="sample_predictions.json")
    log_plots(tracker, run_id, lambda d: _plots().write_evaluation_plots(results, d))
    return head


def _plots():
    from . import plots  # matplotlib is imported only when a run logs plots

    return plots


def log_plots(tracker: Tracker, run_id: str, write: Callable[[Path], list[Path]], to_parent: bool = True) -> list[str]:
    """PNG plots under `plots/` of the stage's run and of its pipeline (parent) run. A plot that cannot be
    drawn never fails the stage: it is logged as a warning and the run is tagged `plots_error`."""
    try:
        with tempfile.TemporaryDirectory(prefix="ttt-plots-") as tmp:
            paths = write(Path(tmp))
            tracker.artifact(run_id, tmp, "plots")
            parent = tracker.client.get_run(run_id).data.tags.get("mlflow.parentRunId") if to_parent else None
            if parent:
                tracker.artifact(parent, tmp, "plots")
        return [p.name for p in paths]
    except Exception as exc:  # noqa: BLE001 - plots are for people; the numbers are logged already
        logging.getLogger(__name__).warning("plots for run %s failed: %s: %s", run_id, type(exc).__name__, exc)
        tracker.tags(run_id, {"plots_error": f"{type(exc).__name__}: {exc}"[:500]})
        return []
