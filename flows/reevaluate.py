"""`nightly-reevaluation`: is the registered champion still robust?

Every night: load the model version at alias `champion` of `registry.model_name` (MLflow registry), draw the
corruption suite with that night's seed (from the date) and with the fixed reference seed, score both
without and with masked TTT, log one MLflow run tagged with the model version, and compare it with the
previous night's run. Robust accuracy is the corrupted-set accuracy with TTT on the *reference* suite (the
same texts every night, so a drop is the model's or the code's, not the seed's); the night's fresh suite is
logged beside it (a gap between the two means the reference suite stopped being representative).

A drop of more than `threshold` fails the flow run, flags a Prefect markdown artifact and ends the MLflow run
as FAILED with tag `regression=true`.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

from tasks import corrupt_task, download_task, evaluate_task
from ttt_pipeline import steps
from ttt_pipeline.config import PipelineConfig
from ttt_pipeline.errors import PipelineError
from ttt_pipeline.evaluate import headline, metric_name
from ttt_pipeline.remote_store import open_store
from ttt_pipeline.tracking import Tracker

from flows.stages import _run, evaluate_on_gpu, portable

RUN_KIND = "nightly-reevaluation"
ALIAS = "champion"


class RobustnessRegression(Exception):
    """Robust accuracy fell by more than the threshold since the previous night."""


def night_of(scheduled: dt.datetime | None = None) -> str:
    """The night's date (YYYY-MM-DD): the scheduled start's own date, else today's."""
    when = scheduled or dt.datetime.now().astimezone()
    return when.date().isoformat()


def seed_for(night: str) -> int:
    """A different, reproducible corruption seed each night: 2025-01-31 -> 20250131."""
    return int(night.replace("-", ""))


def load_champion(client, name: str):
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(name, ALIAS)
    except MlflowException:
        raise PipelineError(f"registered model {name!r} has no version at alias {ALIAS!r}",
                            "run ttt-pipeline with registry.enabled=true first (it registers and promotes "
                            "the champion), or set registry.model_name") from None


def _model_root(folder: Path) -> Path:
    for meta in sorted(Path(folder).rglob("meta.json"), key=lambda p: len(p.parts)):
        if (meta.parent / "head.safetensors").is_file():
            return meta.parent
    raise PipelineError(f"no saved classifier (meta.json + head.safetensors) under {folder}",
                        "the champion's source must be the `model` artifact logged by the fine-tune stage")


def fetch_champion(tracker: Tracker, store, mv) -> dict:
    """The champion's model folder as a StepOutput in the store (downloaded once per model version)."""
    import mlflow.artifacts

    inputs = {"model_name": mv.name, "version": str(mv.version), "run_id": mv.run_id, "source": mv.source}

    def build(tmp: Path) -> dict:
        dl = tmp.parent / f".{tmp.name}.download"
        dl.mkdir()
        try:
            try:
                got = mlflow.artifacts.download_artifacts(artifact_uri=mv.source, dst_path=str(dl),
                                                          tracking_uri=tracker.uri)
            except Exception:
                if not mv.run_id:
                    raise
                got = tracker.client.download_artifacts(mv.run_id, "model", str(dl))
            _model_root(Path(got)).rename(tmp / "model")
        finally:
            import shutil

            shutil.rmtree(dl, ignore_errors=True)
        return dict(inputs)

    return store.run("champion", inputs, build, "1").to_dict()


def previous_night(tracker: Tracker, model_name: str, night: str):
    runs = tracker.client.search_runs(
        [tracker.experiment_id],
        f"tags.ttt_run_kind = '{RUN_KIND}' and tags.registered_model = '{model_name}'",
        order_by=["attribute.start_time DESC"], max_results=50)
    for r in runs:
        if r.data.tags.get("night", "") < night and "robust_acc_ref" in r.data.metrics:
            return r
    return None


def _report(night: str, mv, now: dict, prev, threshold: float, regression: bool, run_link: str) -> str:
    def f(v):
        return "-" if v is None else f"{v:.3f}"

    head = (f"# ❌ REGRESSION — robust accuracy fell by more than {threshold:.3f}\n\n" if regression else
            "# ✅ Nightly re-evaluation: no regression\n\n")
    rows = [("clean accuracy", "acc_clean"), ("clean accuracy with TTT", "acc_clean_ttt"),
            ("reference suite, corrupted", "acc_corrupted_ref"), ("reference suite, with TTT (robust)", "robust_acc_ref"),
            ("tonight's suite, corrupted", "acc_corrupted_night"), ("tonight's suite, with TTT", "robust_acc_night")]
    pm = prev.data.metrics if prev is not None else {}
    table = "\n".join(f"| {label} | {f(now.get(k))} | {f(pm.get(k))} |" for label, k in rows)
    prev_line = (f"Previous night: {prev.data.tags.get('night')} (MLflow run `{prev.info.run_id}`)" if prev is not None
                 else "No previous night to compare with (first run).")
    return (f"{head}Model `{mv.name}` version {mv.version} (alias `{ALIAS}`, source run `{mv.run_id}`), "
            f"night {night}.\n\n| metric | tonight | previous night |\n|---|---|---|\n{table}\n\n{prev_line}\n\n"
            f"Drop of robust accuracy: {f(now.get('robust_acc_drop'))} (threshold {threshold:.3f}).\n\n"
            f"MLflow run: {run_link}\n")


@flow(name="nightly-reevaluation")
def nightly_reevaluation(config: PipelineConfig = PipelineConfig(), threshold: float = 0.02,
                         reference_seed: int = 42, night: str | None = None) -> dict:
    """Re-evaluate the `champion` on tonight's and the reference corruption suites; fail on a robustness drop."""
    from prefect.runtime import flow_run

    t0 = time.perf_counter()
    logger = get_run_logger()
    cfg = portable(config)
    if "none" not in cfg.ttt.methods or "masked_ttt" not in cfg.ttt.methods:
        cfg.ttt.methods = list(dict.fromkeys(["none", "masked_ttt", *cfg.ttt.methods]))
    night = night or night_of(flow_run.get_scheduled_start_time() if flow_run.get_id() else None)
    night_seed = seed_for(night)
    tracker = Tracker.from_config(cfg.tracking)
    tracker.check()
    mv = load_champion(tracker.client, cfg.registry.model_name)
    logger.info("champion: %s version %s (run %s); night %s, seed %d; reference seed %d",
                mv.name, mv.version, mv.run_id, night, night_seed, reference_seed)
    store = open_store(cfg.store)
    model = fetch_champion(tracker, store, mv)
    data, _ = _run(download_task, cfg)
    trained_on = json.loads((Path(model["path"]) / "model" / "labels.json").read_text())
    scored_on = json.loads((Path(data["path"]) / "labels.json").read_text())
    if list(trained_on.values()) != [scored_on[str(i)] for i in range(len(scored_on))]:
        raise PipelineError(f"the champion's labels {list(trained_on.values())} differ from the data's "
                            f"{list(scored_on.values())}", "pass the config (data section) the champion was trained with")

    results = {}
    for suite, seed, with_clean in (("night", night_seed, True), ("ref", reference_seed, False)):
        c = cfg.model_copy(deep=True)
        c.corruption.seed = seed
        corrupted, _ = _run(corrupt_task, c, data)
        families = None if with_clean else list(c.corruption.families)
        if c.execution.mode == "deployments":
            shares = ([["clean"]] if with_clean else []) + [[fam] for fam in c.corruption.families]
            outs, _ = evaluate_on_gpu(c, data, model, corrupted, shares)
        else:
            outs = [_run(evaluate_task, c, data, model, corrupted, families)[0]]
        results[suite] = steps.load_results([steps.StepOutput(**o) for o in outs])["rows"]

    h_night, h_ref = headline(results["night"]), headline(results["ref"])
    now = {"acc_clean": h_night.get("acc_clean"), "acc_clean_ttt": h_night.get("acc_clean_ttt"),
           "acc_corrupted_night": h_night.get("acc_corrupted"), "robust_acc_night": h_night.get("acc_ttt"),
           "acc_corrupted_ref": h_ref.get("acc_corrupted"), "robust_acc_ref": h_ref.get("acc_ttt")}
    prev = previous_night(tracker, mv.name, night)
    if prev is not None:
        now["robust_acc_drop"] = prev.data.metrics["robust_acc_ref"] - now["robust_acc_ref"]
        if "robust_acc_night" in prev.data.metrics and now["robust_acc_night"] is not None:
            now["robust_acc_night_drop"] = prev.data.metrics["robust_acc_night"] - now["robust_acc_night"]
    regression = prev is not None and now["robust_acc_drop"] > threshold

    run_id = tracker.start(f"nightly-{night}", tags={
        "ttt_run_kind": RUN_KIND, "night": night, "registered_model": mv.name, "model_version": str(mv.version),
        "model_alias": ALIAS, "model_source_run_id": mv.run_id or "", "model_source": mv.source or "",
        "prefect.flow_run_id": str(flow_run.get_id() or ""), "previous_run_id": prev.info.run_id if prev else "",
        "regression": str(regression).lower()})
    tracker.params(run_id, {"night_seed": night_seed, "reference_seed": reference_seed, "threshold": threshold,
                            **{f"corruption.{k}": v for k, v in cfg.corruption.model_dump(mode="json").items()
                               if k != "seed"},
                            **{f"ttt.{k}": v for k, v in cfg.ttt.model_dump(mode="json").items()}})
    per_set = {f"{suite}/acc/{metric_name(r)}": r["acc"] for suite, rows in results.items() for r in rows}
    tracker.metrics(run_id, {**now, **per_set, "wall_s": time.perf_counter() - t0})
    tracker.dict(run_id, results, "nightly_results.json")
    try:
        tracker.client.set_model_version_tag(mv.name, mv.version, "nightly.last_run_id", run_id)
        tracker.client.set_model_version_tag(mv.name, mv.version, "nightly.last_robust_acc_ref",
                                             f"{now['robust_acc_ref']:.4f}")
    except Exception as exc:  # tagging the version is a convenience; the run carries the link anyway
        logger.warning("could not tag model version %s/%s: %s", mv.name, mv.version, exc)
    exp_link = f"experiment {tracker.experiment_id}, run {run_id}"
    if tracker.uri.startswith("http"):
        exp_link = f"{tracker.uri}/#/experiments/{tracker.experiment_id}/runs/{run_id}"
    create_markdown_artifact(_report(night, mv, now, prev, threshold, regression, exp_link),
                             key="nightly-reevaluation",
                             description=("REGRESSION: " if regression else "") + f"champion re-evaluation {night}")
    tracker.end(run_id, "FAILED" if regression else "FINISHED")
    summary = {"mlflow_run_id": run_id, "night": night, "night_seed": night_seed, "reference_seed": reference_seed,
               "model_name": mv.name, "model_version": str(mv.version), "regression": regression,
               "previous_run_id": prev.info.run_id if prev else None, **now}
    if regression:
        raise RobustnessRegression(
            f"robust accuracy of {mv.name} v{mv.version} on the reference suite fell from "
            f"{prev.data.metrics['robust_acc_ref']:.3f} ({prev.data.tags.get('night')}) to "
            f"{now['robust_acc_ref']:.3f} ({night}): drop {now['robust_acc_drop']:.3f} > threshold {threshold:.3f}")
    logger.info("robust accuracy (reference) %.3f, tonight's suite %.3f; %s", now["robust_acc_ref"],
                now["robust_acc_night"], "no previous night" if prev is None else
                f"drop {now['robust_acc_drop']:+.3f} vs {prev.data.tags.get('night')}")
    return summary
