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

from ttt_pipeline.config import flatten
from ttt_pipeline.evaluation.scoring import headline, metric_name
from ttt_pipeline.io.tracking import Tracker
from ttt_pipeline.storage import StepOutput


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
                             "dropped_by_label_map": m.get("dropped_by_label_map", 0),
                             "truncated_texts": m.get("truncated_texts", 0)})
    for split in m["sizes"]:
        tracker.dataset(run_id, f"reviews-{split}", m["content_digest"], cfg.data.path, split)
    tracker.artifact(run_id, Path(out.path) / "labels.json")
    tracker.dict(run_id, m["class_counts"], "class_counts.json")
    parent = tracker.client.get_run(run_id).data.tags.get("mlflow.parentRunId")
    if parent:  # what `compare` reads to tell runs of different tasks, and runs scored on the same reviews
        tracker.tags(parent, {"task": cfg.task_key(m["label_names"]), "task.labels": json.dumps(m["label_names"]),
                              "task.data_digest": m["content_digest"],
                              "default_defense": cfg.evaluation.defense})
        for split in m["sizes"]:  # the run page's Datasets: the reviews the whole run read, not only its step's
            tracker.dataset(parent, f"reviews-{split}", m["content_digest"], cfg.data.path, split)


def log_tokenise(tracker: Tracker, run_id: str, out: StepOutput, cfg) -> None:
    _common(tracker, run_id, out)
    tracker.params(run_id, {"model.name": cfg.model.name, "model.max_length": cfg.model.max_length})
    tracker.metrics(run_id, {"mean_tokens": out.meta["mean_tokens"], "truncated_share": out.meta["truncated_share"]})


def log_finetune(tracker: Tracker, run_id: str, out: StepOutput, cfg, log_model: bool = True,
                 data: StepOutput | None = None) -> None:
    """Params, curves, history and plots; with `log_model`, the classifier as an MLflow Model (`data`, the
    download step's output, gives spell its training vocabulary)."""
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
    if m.get("precision"):  # what `precision: auto` resolved to on this machine, and why
        tracker.tags(run_id, {"precision": m["precision"], "precision_reason": m["precision_reason"]})
    if m.get("oom_halved_batch_size"):  # the CUDA OOM fallback changed the recipe: say so
        tracker.params(run_id, {k: m[k] for k in ("oom_halved_batch_size", "oom_original_batch_size") if k in m})
    tracker.artifact(run_id, Path(out.path) / "history.json")
    log_plots(tracker, run_id, lambda d: _plots().write_finetune_plots(hist, d))
    if log_model:
        log_classifier(tracker, run_id, out, cfg, data)


def log_import(tracker: Tracker, run_id: str, out: StepOutput, cfg, log_model: bool = True,
               data: StepOutput | None = None) -> None:
    """A classifier brought with `evaluate --model`: where it came from, how its labels were matched, whether
    masked TTT has an MLM head; with `log_model`, the classifier as this project's MLflow Model (as fine-tune
    logs its own), so it is registered, served and re-evaluated alike."""
    _common(tracker, run_id, out)
    m = out.meta
    tracker.params(run_id, {"model.classifier": cfg.model.classifier, "model.label_map": json.dumps(cfg.model.label_map),
                            "ttt.mlm_from": cfg.ttt.mlm_from, "model_labels": json.dumps(m["model_labels"]),
                            "label_order": json.dumps(m["order"]), "max_length": m["max_length"]})
    tracker.tags(run_id, {"kind": m["kind"], "mlm_head": str(m["mlm_head"]).lower(), "mlm_note": m["mlm_note"],
                          **({"architecture": m["architecture"]} if "architecture" in m else {})})
    if log_model:
        log_classifier(tracker, run_id, out, cfg, data)


def log_classifier(tracker: Tracker, run_id: str, out: StepOutput, cfg, data: StepOutput | None = None) -> str:
    """The fine-tuned classifier as an MLflow Model, output of the finetune run (`ttt_pipeline.io.mlflow_model`):
    inference configuration = the run's recommended defense (`evaluation.default_defense`; `none` when it is
    null) with its ttt.* settings; spell's vocabulary = the training texts' words seen
    twice. Returns the model id."""
    from ttt_pipeline.classifier import inference_config
    from ttt_pipeline.io.mlflow_model import log_classifier_model

    vocabulary = None
    if data is not None:
        from ttt_pipeline.data.prepare import load_prepared
        from ttt_pipeline.defenses.vocabulary import training_vocabulary

        reviews = load_prepared(data.path)[0]
        if "train" in reviews:  # unlabelled reviews (data.label_column null) have none: no training vocabulary
            vocabulary = training_vocabulary(reviews["train"]["text"])
    model_id = log_classifier_model(tracker.client, run_id, Path(out.path) / "model",
                                    inference_config(cfg.ttt, cfg.evaluation.defense), vocabulary)
    tracker.tags(run_id, {"logged_model_id": model_id})
    return model_id


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


def evaluation_statistics(outs: list[StepOutput], results: dict, cfg, reference_rows: list[dict] | None = None) -> dict:
    """Paired statistics of the stored predictions (ttt_pipeline.evaluation.robustness): the run's contract objects, the
    per-set comparisons and the scalar headline."""
    from ttt_pipeline.evaluation import robustness
    from ttt_pipeline.evaluation.signal import signal_headline
    from ttt_pipeline.steps import read_predictions

    ev = cfg.evaluation
    kw = dict(resamples=ev.resamples, confidence=ev.confidence, seed=ev.seed)
    preds = read_predictions(outs)
    n = len(results["label_names"])
    stats = robustness.run_statistics(results["rows"], preds, cfg.ttt.seeds(), reference_rows, n,
                                      default_defense=cfg.evaluation.default_defense,
                                      augment_families=cfg.finetune.augment.families if cfg.finetune.augment else None,
                                      **kw)
    per_set = robustness.comparisons(preds, n, **kw)
    # the accuracies, then the self-supervised signal TTT adapts on (the MLM head's perplexity, held-out change)
    head = {**headline(results["rows"], cfg.evaluation.default_defense), **signal_headline(results["rows"], preds)}
    return {"stats": stats, "comparisons": per_set, "headline": head, "predictions": preds}


def evaluated_model_id(tracker: Tracker, run_id: str) -> str | None:
    """The MLflow Model an evaluate run scores: the one its pipeline run's finetune run logged (None when it
    logged none). The headline is logged with that model id, so the logged models rank by it."""
    from ttt_pipeline.io.model_registry import find_model_run, logged_model_id

    parent = tracker.client.get_run(run_id).data.tags.get("mlflow.parentRunId")
    model_run = find_model_run(tracker.client, parent) if parent else None
    return logged_model_id(tracker.client, model_run.info.run_id) if model_run is not None else None


def log_evaluate(tracker: Tracker, run_id: str, outs: list[StepOutput], results: dict, cfg,
                 reference_rows: list[dict] | None = None) -> dict:
    """Accuracy per set and method (mean over mask seeds, and per seed), the paired statistics with their
    interval companions, the per-review predictions and the plots; returns the headline and statistics, and
    every metric logged ("metrics")."""
    from ttt_pipeline.evaluation import robustness
    from ttt_pipeline.evaluation.scoring import seed_means
    from ttt_pipeline.evaluation.signal import signal_metrics

    for out in outs:
        _common(tracker, run_id, out)
    if outs and outs[0].meta.get("precision"):  # what ttt.precision resolved to for a plain forward here, and why
        tracker.tags(run_id, {"precision": outs[0].meta["precision"], "precision_reason": outs[0].meta["precision_reason"]})
    tracker.params(run_id, flatten(cfg.ttt.model_dump(mode="json"), "ttt."))  # ttt.spell.max_edit_distance, ...
    tracker.params(run_id, {f"evaluation.{k}": v for k, v in cfg.evaluation.model_dump(mode="json").items()})
    rows = results["rows"]
    metrics = {}
    for r in seed_means(rows):
        metrics[f"acc/{metric_name(r)}"] = r["acc"]
        metrics[f"macro_f1/{metric_name(r)}"] = r["macro_f1"]
        if r["method"] != "none":
            metrics[f"samples_per_s/{r['method'].replace('+', '-')}"] = r["samples_per_s"]
    for r in rows:
        if r.get("mask_seed") is not None:
            metrics[f"acc/{metric_name(r)}/seed_{r['mask_seed']}"] = r["acc"]
    metrics.update(signal_metrics(rows, metric_name))
    ev = evaluation_statistics(outs, results, cfg, reference_rows)
    head = ev["headline"]
    flat = robustness.flat_metrics(ev["stats"], ev["comparisons"])
    logged = {**metrics, **head, **flat}
    tracker.metrics(run_id, {k: v for k, v in logged.items() if k not in head})
    tracker.metrics(run_id, {k: logged[k] for k in head}, model_id=evaluated_model_id(tracker, run_id))
    tracker.dict(run_id, results, "evaluation.json")
    tracker.dict(run_id, {**ev["stats"], "comparisons": ev["comparisons"]}, "statistics.json")
    with tempfile.TemporaryDirectory(prefix="ttt-preds-") as tmp:  # one table, however many evaluate shares
        ev["predictions"].to_parquet(Path(tmp) / "predictions.parquet", index=False)
        tracker.artifact(run_id, Path(tmp) / "predictions.parquet")
    if results["samples"]:
        cols = sorted({k for s in results["samples"] for k in s})
        tracker.client.log_table(run_id, data={c: [s.get(c, "") for s in results["samples"]] for c in cols},
                                 artifact_file="sample_predictions.json")
    log_plots(tracker, run_id, lambda d: _plots().write_evaluation_plots(results, d,
                                                                      cfg.evaluation.default_defense))
    return {"headline": head, "stats": {k: ev["stats"][k] for k in robustness.CONTRACT if k in ev["stats"]},
            "gains": ev["stats"]["gains"], "comparisons": ev["comparisons"], "flat": flat, "metrics": logged}


def _plots():
    from ttt_pipeline.io import plots  # matplotlib is imported only when a run logs plots

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


def reference_rows(tracker: Tracker, reference: str | None) -> list[dict] | None:
    """The `none` rows of a reference run's evaluation (evaluation.reference): an MLflow run id (pipeline run
    or its evaluate stage) or models:/<name>@<alias> / models:/<name>/<version> (the version's source run)."""
    from ttt_pipeline.errors import ConfigError
    from ttt_pipeline.io.runs import get_pipeline_run

    if not reference:
        return None
    client = tracker.client
    run_id = reference
    if reference.startswith("models:/"):
        name, _, rest = reference[len("models:/"):].partition("@")
        try:
            mv = (client.get_model_version_by_alias(name, rest) if rest else
                  client.get_model_version(*reference[len("models:/"):].split("/", 1)))
        except Exception as exc:
            raise ConfigError(f"evaluation.reference {reference!r} names no model version ({type(exc).__name__})",
                              "give a run id, models:/<name>@<alias> or models:/<name>/<version>") from None
        run_id = mv.run_id
    parent = get_pipeline_run(client, run_id, tracker.uri)
    children = client.search_runs([parent.info.experiment_id],
                                  f"tags.mlflow.parentRunId = '{parent.info.run_id}' and attributes.run_name = 'evaluate'")
    if not children:
        raise ConfigError(f"evaluation.reference {reference!r}: run {parent.info.run_id} has no evaluate stage",
                          "reference a finished pipeline run")
    with tempfile.TemporaryDirectory(prefix="ttt-ref-") as tmp:
        path = client.download_artifacts(children[0].info.run_id, "evaluation.json", tmp)
        rows = json.loads(Path(path).read_text())["rows"]
    return [r for r in rows if r["method"] == "none"]


def log_attribute(tracker: Tracker, run_id: str, out: StepOutput, cfg, result: dict) -> None:
    """TRAK attribution (ttt_pipeline.evaluation.attribution): its settings, sizes and timings, the table `attribution.json`
    (one row per explained prediction x supporting/opposing x rank) and the full result
    `attribution_targets.json` (what `ttt-pipeline explain` reads)."""
    from ttt_pipeline.evaluation.attribution import table_rows

    _common(tracker, run_id, out)
    tracker.params(run_id, {f"attribution.{k}": v for k, v in cfg.attribution.model_dump(mode="json").items()})
    tracker.params(run_id, {"attribution.projector": result.get("projector"),
                            "attribution.proj_dim_used": result.get("proj_dim")})
    tracker.metrics(run_id, {"n_train": result["n_train"], "n_targets": result["n_targets"],
                             "grad_dim": result.get("grad_dim"), "n_models": result.get("n_models"),
                             **{f"attribution_{k}": v for k, v in (result.get("timings") or {}).items()},
                             **{f"n_targets/{r}": sum(r in t["reasons"] for t in result["targets"])
                                for r in ("flip", "fixed", "broke")}})
    rows = table_rows(result)
    if rows:
        tracker.client.log_table(run_id, data={c: [r[c] for r in rows] for c in rows[0]},
                                 artifact_file="attribution.json")
    tracker.dict(run_id, result, "attribution_targets.json")


REPORT = "report.html"


def log_report(tracker: Tracker, run_id: str, page: str) -> str:
    """The run's HTML report (steps.flip_report) as the artifact `report.html` of `run_id`; returns its URI."""
    with tempfile.TemporaryDirectory(prefix="ttt-report-") as tmp:
        path = Path(tmp) / REPORT
        path.write_text(page, encoding="utf-8")
        tracker.artifact(run_id, path)
    return f"{tracker.client.get_run(run_id).info.artifact_uri.rstrip('/')}/{REPORT}"
