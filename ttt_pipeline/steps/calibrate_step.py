"""calibrate: the label-free drop forecast fitted on the run's own corrupted sets (issue 69).

Each corrupted set (family x severity, the external `ext:` generators' included) and the clean test set are
described as a window of traffic would be in production (evaluation.descriptors): the per-review text measures with
the default defense's text repair, the share of predictions that defense changed, the mean top-class probability
and the predicted label shares under `none`. Their accuracy under `none` is measured (the evaluate step's
predictions), so each set is a calibration point whose drop is known; `evaluation.forecast.fit_calibration` fits the
forecast on them. The output, `calibration.json`, is what a monitor of unlabelled traffic reads back (through MLflow:
ttt_pipeline.io.calibration_store):

    {"calibration": Calibration.to_dict(), "defense": the default defense,
     "reference": {"descriptors": the clean window, "label_shares", "label_names": the classes of label_shares
                   in order, "accuracy": the clean test accuracy, "n"},
     "sets": [{"set", "family", "severity", "descriptors", "accuracy", "drop", "forecast", "baselines"}, ...]}

`drop` is the measured clean - set accuracy under `none`, `forecast` the chosen model's held-out forecast of it (fitted
without the set's family), `baselines` the confidence-only forecasts (AC, DoC, ATC) of the same drop.

Skipped, with the reason (`calibration_skip_reason`), when the forecast cannot be calibrated: a default defense that repairs no
text (an engine, or null) leaves repaired_words_share undefined, and fewer than two corruption families leave no
family to hold out. A run whose own suite is that small (the demo's one keyboard set) is calibrated on a suite of its
own instead (`calibration_suite`: monitoring.calibration_families), which the flows score for this step alone.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from ttt_pipeline.config import PipelineConfig
from ttt_pipeline.steps.keys import calibrate_inputs, version
from ttt_pipeline.steps.outputs import load_results, read_predictions, read_set
from ttt_pipeline.storage import StepOutput, StepStore

ARTIFACT = "calibration.json"
CONFIDENCE = 0.90  # the forecast interval's level
MIN_FAMILIES = 2  # each family is held out in turn: one leaves none to fit on
MIN_SETS = 6  # fewer held-out points leave the interval's width to a handful of residuals
_ROUNDING = 1e-12  # coverage: a drop on the interval's edge is inside, whatever the last bit of the product
log = logging.getLogger(__name__)


def _defense_reason(cfg: PipelineConfig) -> str | None:
    """Why the default defense gives the forecast nothing to read, or None when it repairs text."""
    from ttt_pipeline.defenses.registry import parse

    defense = cfg.evaluation.default_defense
    if defense is None:
        return ("evaluation.default_defense is null: without its text repair there is no repaired_words_share to "
                "forecast from (set a default defense with a repair, e.g. spell)")
    if not parse(defense).repairs:
        return (f"the default defense {defense} repairs no text: without a repair there is no repaired_words_share to "
                "forecast from (choose a default defense with a repair, e.g. spell)")
    return None


def calibration_suite(cfg: PipelineConfig, corrupt_out: StepOutput) -> PipelineConfig | None:
    """The configuration of the forecast's own calibration suite, for a run whose corrupted sets are too few to
    calibrate on (fewer than MIN_FAMILIES families or MIN_SETS sets, as the demo's one keyboard set): the same data,
    model, corruption seed and scoring settings, the families and severities of monitoring.calibration_families and
    calibration_severities, and only what calibrate reads scored: ttt.methods none and the default defense, at its
    first mask seed, without the MLM signal. Its corrupt and evaluate outputs feed the calibrate step only, never
    the run's summary, grid or results. None when the run's own sets suffice, when the default defense leaves
    nothing to calibrate anyway (`calibration_skip_reason`), or when monitoring.calibration_families is []."""
    if _defense_reason(cfg) is not None or not cfg.monitoring.calibration_families:
        return None
    sets = list(corrupt_out.meta["sets"].values())
    if len({m["family"] for m in sets}) >= MIN_FAMILIES and len(sets) >= MIN_SETS:
        return None
    raw = cfg.model_dump(mode="json")
    raw["corruption"] = {"families": cfg.monitoring.calibration_families,
                         "severities": cfg.monitoring.calibration_severities, "seed": cfg.corruption.seed}
    raw["ttt"] = {**raw["ttt"], "methods": ["none", cfg.evaluation.default_defense],
                  "mask_seeds": cfg.ttt.seeds()[:1]}
    raw["evaluation"] = {**raw["evaluation"], "signal_reviews": 0}
    return PipelineConfig.model_validate(raw)


def calibration_skip_reason(cfg: PipelineConfig, corrupt_out: StepOutput) -> str | None:
    """Why this run's forecast cannot be calibrated on the sets of `corrupt_out`, or None when it can."""
    reason = _defense_reason(cfg)
    if reason is not None:
        return reason
    families = sorted({m["family"] for m in corrupt_out.meta["sets"].values()})
    if len(families) < 2:
        return (f"the forecast is calibrated on corruption families held out one at a time, and this run has "
                f"{len(families)} ({', '.join(families) or 'none'}): add a family to corruption.families")
    return None


def calibrate(cfg: PipelineConfig, data: StepOutput, model_out: StepOutput, corrupt_out: StepOutput,
              eval_outs: list[StepOutput], store: StepStore) -> StepOutput | None:
    """The forecast calibrated on the clean and corrupted sets the evaluate outputs `eval_outs` scored (every set
    under `none`, the default defense on the corrupted ones at least): `calibration.json` (module docstring), its
    summary in the output's meta (`calibration_summary`). None, with the reason logged, when `calibration_skip_reason` gives
    one. `model_out` keys the output (the predictions are that model's)."""
    reason = calibration_skip_reason(cfg, corrupt_out)
    if reason is not None:
        log.info("calibrate: skipped: %s", reason)
        return None
    inputs = calibrate_inputs(cfg, data, model_out, corrupt_out, eval_outs)

    def build(tmp: Path) -> dict:
        payload = calibration_payload(cfg, data, corrupt_out, eval_outs)
        (tmp / ARTIFACT).write_text(json.dumps(payload, indent=1))
        return {"defense": cfg.evaluation.default_defense, **calibration_summary(payload)}

    return store.run("calibrate", inputs, build, version("calibrate"))


def read_calibration(out: StepOutput) -> dict:
    """The stored `calibration.json` of a calibrate output."""
    return json.loads((Path(out.path) / ARTIFACT).read_text())


def calibration_summary(payload: dict) -> dict:
    """{model, loo_mae, coverage, n_sets}: the chosen model, its mean absolute leave-one-family-out error, the share
    of the sets whose measured drop lies in the interval around their held-out forecast, and the sets' number."""
    cal = payload["calibration"]
    held = cal["held_out"]
    inside = [abs(p["drop"] - p["forecast"]) <= cal["half_width"] * (p["forecast"] + cal["scale_floor"]) + _ROUNDING
              for p in held]
    return {"model": cal["model"], "loo_mae": float(cal["held_out_errors"][cal["model"]]),
            "coverage": sum(inside) / len(inside) if inside else None, "n_sets": len(payload["sets"])}


def calibration_payload(cfg: PipelineConfig, data: StepOutput, corrupt_out: StepOutput,
                        eval_outs: list[StepOutput]) -> dict:
    """What `calibration.json` holds (module docstring), computed from the stored outputs."""
    from ttt_pipeline.data.prepare import load_prepared
    from ttt_pipeline.defenses.vocabulary import training_vocabulary
    from ttt_pipeline.evaluation import forecast as fc
    from ttt_pipeline.evaluation import grid
    from ttt_pipeline.evaluation.descriptors import training_scripts, window_descriptors

    defense = cfg.evaluation.default_defense
    ds, _ = load_prepared(data.path)
    train = list(ds["train"]["text"])
    # the evaluate step's own construction (grid.build_repairs): the same repair, trusting the same training words
    repairs = grid.build_repairs(cfg.ttt, lambda: train)[defense]
    vocabulary, scripts = training_vocabulary(train), training_scripts(train)
    predictions = read_predictions(eval_outs)
    measured = [_measure(meta, texts, predictions, defense, repairs, vocabulary, scripts)
                for meta, texts in _sets(ds, corrupt_out, predictions)]
    (_, clean), *corrupted = measured
    threshold = fc.atc_threshold(clean["confidences"], clean["accuracy"])
    clean_window = window_descriptors(*clean["window"], threshold=threshold)
    windows = [window_descriptors(*m["window"], reference_label_shares=clean_window["label_shares"],
                                  threshold=threshold) for _, m in corrupted]
    points = [fc.CalibrationPoint(meta["family"], int(meta["severity"]), w, m["accuracy"])
              for (meta, m), w in zip(corrupted, windows)]
    cal = fc.fit_calibration(points, fc.CleanReference(clean_window, clean["accuracy"], clean["confidences"]),
                             CONFIDENCE)
    held = {(p["family"], p["severity"]): p["forecast"] for p in cal.held_out}
    sets = [{"set": meta["set"], "family": meta["family"], "severity": int(meta["severity"]), "descriptors": w,
             "accuracy": m["accuracy"], "drop": clean["accuracy"] - m["accuracy"],
             "forecast": held[(meta["family"], int(meta["severity"]))], "baselines": fc.baseline_drops(cal, w)}
            for (meta, m), w in zip(corrupted, windows)]
    return {"calibration": cal.to_dict(), "defense": defense,
            "reference": {"descriptors": clean_window, "label_shares": clean_window["label_shares"],
                          "label_names": load_results(eval_outs)["label_names"], "accuracy": clean["accuracy"],
                          "n": clean_window["n"]},
            "sets": sets}


def _sets(ds, corrupt_out: StepOutput, predictions) -> list[tuple[dict, list[str]]]:
    """({set, family, severity}, texts): the clean test set, then every corrupted set the predictions hold."""
    scored = set(predictions.loc[predictions["method"] == "none", "set"])
    if "clean" not in scored:
        raise ValueError("the evaluate outputs hold no clean test predictions under none: calibrate reads the "
                         "evaluation of the whole grid (every family's share in a distributed run)")
    out = [({"set": "clean", "family": None, "severity": None}, list(ds["test"]["text"]))]
    for name, m in corrupt_out.meta["sets"].items():
        if name in scored:
            out.append(({"set": name, "family": m["family"], "severity": m["severity"]}, read_set(corrupt_out, name)))
    return out


def _measure(meta: dict, texts: list[str], predictions, defense: str, repairs: list, vocabulary, scripts) -> tuple:
    """(meta, {window: window_descriptors' arguments, accuracy, confidences}) of one set: its per-text descriptors
    with the default repair, its class probabilities and accuracy under `none`, the predictions `none` and the
    default defense made (the first mask seed of a masked defense; None where the defense did not score the set,
    clean text when ttt.score_clean is off)."""
    import numpy as np

    from ttt_pipeline.evaluation.descriptors import text_descriptors

    repaired = texts
    for fix in repairs:
        repaired = fix(repaired)
    per_text = text_descriptors(texts, repaired, vocabulary, scripts)
    none = _rows(predictions, meta["set"], "none", len(texts))
    mine = _rows(predictions, meta["set"], defense, len(texts))
    probs = np.stack(none["probs"].to_numpy()).astype(float)
    raw, fixed = (None, None) if mine is None else (none["pred"].to_numpy(), mine["pred"].to_numpy())
    accuracy = float(np.mean(none["pred"].to_numpy() == none["label"].to_numpy()))
    return meta, {"window": (per_text, probs, raw, fixed), "accuracy": accuracy,
                  "confidences": probs.max(axis=1).tolist()}


def _rows(predictions, set_name: str, method: str, n: int):
    """One set's predictions under one method, in review order (a masked method's first mask seed); None when the
    method did not score the set."""
    rows = predictions[(predictions["set"] == set_name) & (predictions["method"] == method)]
    if rows.empty:
        return None
    seeds = rows["mask_seed"].dropna()
    if len(seeds):
        rows = rows[rows["mask_seed"] == seeds.min()]
    rows = rows.sort_values("index")
    if len(rows) != n or rows["index"].tolist() != list(range(n)):
        raise ValueError(f"{set_name} under {method}: {len(rows)} predictions for {n} reviews")
    return rows
