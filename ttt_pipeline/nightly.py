"""The nightly check's decisions, with no Prefect and no MLflow: which night and seed, which configuration scores the
champion, the figures and the verdict. `flows/reevaluate.py` wires them to the tasks, `io/nights.py` reads and
writes the nights in MLflow, `reports/nightly.py` renders them.

Robust accuracy is the corrupted-set accuracy under the recommended defense on the *reference* suite (the same texts
every night, so a drop is the model's or the code's, not the seed's); the night's fresh suite is logged beside it.
Only a paired change whose whole interval lies below -threshold is a regression.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from ttt_pipeline.config import PipelineConfig, absolute_paths
from ttt_pipeline.errors import PipelineError
from ttt_pipeline.evaluation.scoring import headline
from ttt_pipeline.evaluation.stats import min_detectable_drop
from ttt_pipeline.steps import model_length


def night_of(scheduled: dt.datetime | None = None) -> str:
    """The night's date (YYYY-MM-DD): the scheduled start's own date, else today's."""
    when = scheduled or dt.datetime.now().astimezone()
    return when.date().isoformat()


def seed_for(night: str) -> int:
    """A different, reproducible corruption seed each night: the date's digits (YYYY-MM-DD -> YYYYMMDD)."""
    return int(night.replace("-", ""))


def nightly_config(config: PipelineConfig) -> PipelineConfig:
    """The night scores `none` and the recommended defense only (clean too: the new reviews' baseline)."""
    cfg = absolute_paths(config)
    defense = cfg.evaluation.defense
    cfg.evaluation.default_defense = None  # reassigned below, once ttt.methods holds it
    cfg.ttt.methods = list(dict.fromkeys(["none", defense]))
    cfg.evaluation.default_defense = None if defense == "none" else defense
    return cfg


def suite_config(cfg: PipelineConfig, seed: int) -> PipelineConfig:
    """The configuration of one suite: the night's or the reference corruption seed."""
    c = cfg.model_copy(deep=True)
    c.corruption.seed = seed
    return c


def scored_config(cfg: PipelineConfig, model_folder: Path) -> PipelineConfig:
    """The champion is scored at the length it was evaluated at (`steps.model_length`, the evaluate step's rule)."""
    meta = json.loads((Path(model_folder) / "meta.json").read_text())
    length = model_length(meta, cfg)
    if length == cfg.model.max_length:
        return cfg
    cfg = cfg.model_copy(deep=True)
    cfg.model.max_length = length
    return cfg


def check_labels(model_folder: Path, data_folder: Path) -> None:
    """The champion must have been trained on the data's label set, in the same order."""
    trained_on = json.loads((Path(model_folder) / "labels.json").read_text())
    scored_on = json.loads((Path(data_folder) / "labels.json").read_text())
    if list(trained_on.values()) != [scored_on[str(i)] for i in range(len(scored_on))]:
        raise PipelineError(f"the champion's labels {list(trained_on.values())} differ from the data's "
                            f"{list(scored_on.values())}", "pass the config (data section) the champion was trained with")


def figures(results: dict, defense: str) -> dict:
    """Tonight's accuracies from both suites' result rows."""
    h_night, h_ref = headline(results["night"], defense), headline(results["ref"], defense)
    return {"acc_clean": h_night.get("acc_clean"), "acc_clean_ttt": h_night.get("acc_clean_default"),
            "acc_corrupted_night": h_night.get("acc_corrupted"), "robust_acc_night": h_night.get("acc_default"),
            "acc_corrupted_ref": h_ref.get("acc_corrupted"), "robust_acc_ref": h_ref.get("acc_default")}


def against_previous(now: dict, previous: dict | None, check: dict | None) -> None:
    """Adds to `now` the changes since the previous night's metrics and the paired check's figures."""
    if previous is not None:
        now["robust_acc_drop"] = previous["robust_acc_ref"] - now["robust_acc_ref"]
        if "robust_acc_night" in previous and now.get("robust_acc_night") is not None:
            now["robust_acc_night_drop"] = previous["robust_acc_night"] - now["robust_acc_night"]
    if check is not None:
        now.update({"robust_acc_change": check["delta"], "robust_acc_change_ci_low": check["ci_low"],
                    "robust_acc_change_ci_high": check["ci_high"], "robust_acc_change_p_mcnemar": check["p_mcnemar"]})


def difference(d: dict | None) -> dict | None:
    keep = ("delta", "ci_low", "ci_high", "p_mcnemar", "helped", "hurt", "n", "against", "significant")
    return None if d is None else {k: d[k] for k in keep if k in d}


def extra_figures(check: dict | None, reference_n: int, new: dict | None, threshold: float,
                  confidence: float) -> dict:
    """The JSON contract's figures: reference and new-review changes, the alarm's power."""
    extra = {"reference": difference(check), "reference_n": reference_n,
             "min_detectable_drop": min_detectable_drop(reference_n, threshold, confidence)}
    if new is not None:
        w = new["with_defense"]
        extra["new_data"] = {**{k: w[k] for k in ("delta", "ci_low", "ci_high", "acc", "acc_reference")},
                             "n": new["n"], "source": new["source"], "without_defense": new["without_defense"],
                             "with_defense": w, "drift": new["drift"]}
    return extra


def summary(night: str, defense: str, mv, run_id: str, threshold: float, seeds: tuple[int, int], prev_run_id,
            extra: dict, now: dict, regression: bool) -> dict:
    """The night's result, as the flow returns it and `ttt-pipeline reevaluate --json` prints it."""
    return {"night": night, "defense": defense, "verdict": "regression" if regression else "ok",
            "model_name": mv.name, "model_version": str(mv.version), "mlflow_run_id": run_id,
            "threshold": threshold, "night_seed": seeds[0], "reference_seed": seeds[1],
            "regression": regression, "previous_run_id": prev_run_id,
            **{k: v for k, v in extra.items() if k != "reference_n"}, "reference_n": extra["reference_n"], **now}


def no_champion_summary(night: str, defense: str, name: str, exc: PipelineError) -> dict:
    return {"night": night, "defense": defense, "verdict": "no_champion", "model_name": name,
            "reference": None, "min_detectable_drop": None, "message": exc.message, "hint": exc.hint}


def event_payload(summary: dict) -> dict:
    """What the outcome's event carries: the figures an alert needs."""
    payload = {k: summary.get(k) for k in ("night", "defense", "model_name", "model_version", "reference",
                                           "min_detectable_drop", "mlflow_run_id", "robust_acc_ref")}
    if summary.get("new_data"):
        payload["new_data"] = {k: summary["new_data"][k] for k in ("delta", "ci_low", "ci_high", "n")}
    return payload


def regression_message(summary: dict, check: dict, threshold: float) -> str:
    return (f"robust accuracy of {summary['model_name']} v{summary['model_version']} under {summary['defense']} on "
            f"the reference suite fell to {summary['robust_acc_ref']:.3f} ({summary['night']}) against "
            f"{check['against']}: change {100 * check['delta']:+.2f} points, 95% paired interval "
            f"[{100 * check['ci_low']:+.2f}, {100 * check['ci_high']:+.2f}] lies below -{100 * threshold:.2f}")
