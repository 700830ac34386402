"""Does the label-free forecast of a window's accuracy drop hold on noise it was not calibrated on? Issue 69's
acceptance bench: labelled "traffic windows" built from rt-polarity test snippets, where the truth is known.

Protocol, fixed before the full run. The `rt-polarity` preset's recipe is fine-tuned once through the library's steps
(bench.real_noise.train: download, tokenise, finetune), training seed `--seed` (42): one seed, because three did not
fit this 2-core machine beside the scoring. Every scored set is described as a window of traffic is in production
(evaluation.descriptors): the per-snippet text measures with the default defense's repair (`spell`, built as the
evaluate step builds it, trusting the training words) against the training vocabulary and scripts, the class
probabilities under `none`, and the prediction under `spell` (the model on the repaired text: what the `spell`
method runs), whence `defense_change_rate`. A window's measured drop is the clean accuracy minus its accuracy on
the same snippets under `none`.

1. Calibration, on the VALIDATION split only (721 snippets): its snippets corrupted by each of the project's own
   families (`ttt_pipeline.corruption` registry, no `ext:`) at severities 1-5 (`tutorial` at its one severity,
   recorded as 3), corruption seed `corruption.seed` (42); one CalibrationPoint per set (its window descriptors,
   its accuracy and drop under `none`) against the clean validation set (CleanReference), and
   `fit_calibration(points, clean, 0.90)`.
2. Test windows, from the TEST split: a seeded sample (seed 0) of `--test-size` snippets (default 2,000; 0: all
   5,798), the same snippets in every window of (a), (b) and (d):
   (a) each own family at severities 1, 3, 5 (`tutorial` once), forecast by the calibration refitted WITHOUT that
       family (leave one family out: the window's noise was never calibrated on);
   (b) each `ext:*` family (nlpaug's generators, the `external` extra) at severity 3, with the full calibration;
   (c) clean windows: 20 seeded subsamples (seeds 0-19) of 500 snippets of the whole clean test split (false
       alarms), full calibration;
   (d) mixtures: the sample with 30% of its snippets (seeded, seed 0) taken from a noisy set (misspelling-5,
       keyboard-5, ext:spelling-3) and the rest clean; the own families' forecast without their family, as in (a).
   Per window: the forecast drop with its 90% interval, the measured drop, the AC / DoC / ATC estimates
   (forecast.baseline_drops) and the verdict (forecast.verdict, `max_drop` 0.03).
3. Report: coverage (the share of windows whose measured drop lies inside the interval; aim >= 0.8), the mean
   absolute error in points, overall and on the left-out windows ((a) and (b): noise never calibrated on; aim
   <= 1.0), each baseline's MAE on the same windows (aim: the forecast below the best of them), the clean windows'
   false-alarm rate (verdict `noisy`; aim <= 5%), and per family of (a) and (b) its drop per changed word
   (summed measured drop / summed excess repaired_words_share over its windows) against the calibration's slope
   (the `slope` model fitted on all points): a family breaks the forecast when one of its windows falls outside its
   interval, and `broken` says why.

    .venv/bin/python -m bench.traffic_forecast                     # the full bench (about 40 min on 2 cores)
    .venv/bin/python -m bench.traffic_forecast --quick --json      # smoke: 48 training snippets, 3 families

`--quick`: 48 training snippets, 1 epoch, 60 validation and test snippets, `--test-size` 40, the families
misspelling and keyboard at severities 1 and 5 plus `tutorial` (with two families, leaving one out would leave one,
and the interval comes from held-out families), `ext:spelling` only, clean windows of 20 snippets.
Every scored set (per-snippet descriptors, probabilities, predictions) is kept in `--store` (default
.cache/bench/store-traffic-forecast, raw downloads shared with the other benches'), so a stopped run resumes and the
report reruns in seconds. Last stdout line: one JSON object; without --json a readable table goes to stderr first.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import random
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from bench import REPO
from bench.common import MODEL, log
from bench.real_noise import config, shared_raw, train

PRESET = "rt-polarity"
CAL_SEVERITIES = (1, 2, 3, 4, 5)
TEST_SEVERITIES = (1, 3, 5)
EXT_SEVERITY = 3
TUTORIAL_SEVERITY = 3  # recorded for tutorial, whose texts do not depend on it
MIXTURES = (("misspelling", 5), ("keyboard", 5), ("ext:spelling", 3))
MIX_SHARE = 0.30
CLEAN_WINDOWS, CLEAN_WINDOW_SIZE = 20, 500
CONFIDENCE, MAX_DROP = 0.90, 0.03
AIMS = {"coverage": 0.80, "mae_points": 1.0, "false_alarm_rate": 0.05}
QUICK = {"families": ("misspelling", "keyboard", "tutorial"), "severities": (1, 5), "ext": ("ext:spelling",),
         "split": 60, "test_size": 40, "clean_window": 20}
METHODS = "ttt.methods=[none,spell]"
REPORTED = ("oov_words_share", "repaired_words_share", "non_letter_character_share", "foreign_script_share",
            "defense_change_rate", "mean_confidence", "label_share_shift")
SET_VERSION = "1"
_EDGE = 1e-12  # a drop on the interval's edge is inside, whatever the last bit of the product


def plan(args) -> dict:
    """The families, severities and sizes of this run (the module doc; `--quick` shrinks them)."""
    from ttt_pipeline.corruption import list_families

    if args.quick:
        own, ext = list(QUICK["families"]), list(QUICK["ext"])
        return {"own": own, "ext": ext, "cal_severities": QUICK["severities"], "test_severities": QUICK["severities"],
                "clean_window": QUICK["clean_window"]}
    external = [f for f in list_families() if f.startswith("ext:")]
    return {"own": list_families(external_ones=False), "ext": external, "cal_severities": CAL_SEVERITIES,
            "test_severities": TEST_SEVERITIES, "clean_window": CLEAN_WINDOW_SIZE}


def severities(family: str, chosen) -> tuple[int, ...]:
    return (TUTORIAL_SEVERITY,) if family == "tutorial" else tuple(chosen)


class Scorer:
    """The trained model, the default repair and the descriptors' references, loaded on first use (a resumed run
    that finds every set in the store loads none of them). Each distinct text is scored once per process: a
    corrupted snippet that came out unchanged, or a repair that changed nothing, reuses its first score."""

    def __init__(self, run: dict):
        self.run, self.cfg = run, config(PRESET, run["seed"], run["args"], METHODS)
        self.memo: dict[str, np.ndarray] = {}

    @functools.cached_property
    def _train_texts(self) -> list[str]:
        from ttt_pipeline.data.prepare import load_prepared

        return list(load_prepared(self.run["data"].path)[0]["train"]["text"])

    @functools.cached_property
    def _model(self):
        from ttt_pipeline import steps
        from ttt_pipeline.modeling.loading import load_model
        from ttt_pipeline.modeling.train import set_threads

        set_threads()
        machine = steps.runtime(self.cfg)
        model, tok = load_model(Path(self.run["model"].path) / "model", machine.device)
        return model, tok, machine.device, machine.score.dtype

    @functools.cached_property
    def _references(self):
        """(the spell repair's callables, the training vocabulary, the training scripts)."""
        from ttt_pipeline.defenses.vocabulary import training_vocabulary
        from ttt_pipeline.evaluation import grid
        from ttt_pipeline.evaluation.descriptors import training_scripts

        train_texts = self._train_texts
        repairs = grid.build_repairs(self.cfg.ttt, lambda: train_texts)["spell"]  # the evaluate step's construction
        return repairs, training_vocabulary(train_texts), training_scripts(train_texts)

    def probs(self, texts: list[str]) -> np.ndarray:
        """Class probabilities under `none` (scoring.predict_texts), the texts not scored yet in one pass, shortest
        first (less padding)."""
        from ttt_pipeline.evaluation.scoring import predict_texts
        from ttt_pipeline.metrics import softmax

        todo = sorted((t for t in dict.fromkeys(texts) if t not in self.memo), key=len)
        if todo:
            model, tok, device, amp = self._model
            logits = predict_texts(model, tok, todo, "none", self.cfg.ttt, self.cfg.model.max_length,
                                   self.cfg.ttt.batch_size, device, amp=amp)
            self.memo.update(zip(todo, np.asarray(softmax(logits), dtype=float)))
        return np.stack([self.memo[t] for t in texts]) if texts else np.zeros((0, 2))

    def measure(self, texts: list[str]) -> dict[str, np.ndarray]:
        """Per snippet: the descriptors (descriptors.PER_TEXT), `probs` under none, `pred_spell` (the model on the
        spell-repaired text)."""
        from ttt_pipeline.evaluation.descriptors import text_descriptors

        repairs, vocabulary, scripts = self._references
        repaired = list(texts)
        for fix in repairs:
            repaired = fix(repaired)
        out = text_descriptors(texts, repaired, vocabulary, scripts)
        out["probs"] = self.probs(list(texts))
        out["pred_spell"] = self.probs(repaired).argmax(axis=1)
        return out


def scored_set(scorer: Scorer, split: str, family: str | None, severity: int | None, index: list[int]) -> dict:
    """One set (the split's snippets at `index`, clean or corrupted at family x severity, corruption.seed) measured
    by `scorer`, kept in the store: {index, label, probs, pred_spell, the descriptors}."""
    run = scorer.run
    inputs = {"model": run["model"].digest, "split": split, "family": family, "severity": severity,
              "corruption_seed": scorer.cfg.corruption.seed, "spell": scorer.cfg.ttt.spell.model_dump(mode="json"),
              "index": hashlib.sha256(np.asarray(index, dtype=np.int64).tobytes()).hexdigest(), "n": len(index)}

    def build(tmp: Path) -> dict:
        from ttt_pipeline.corruption import corrupt_texts
        from ttt_pipeline.data.prepare import load_prepared

        t0 = time.perf_counter()
        rows = load_prepared(run["data"].path)[0][split]
        texts, labels = [rows["text"][i] for i in index], [rows["label"][i] for i in index]
        if family is not None:
            texts = corrupt_texts(texts, family, severity, scorer.cfg.corruption.seed).texts
        measured = scorer.measure(texts)
        np.savez(tmp / "set.npz", index=np.asarray(index), label=np.asarray(labels), **measured)
        wall = time.perf_counter() - t0
        log(f"  {split} {family or 'clean'}{'' if family is None else f'-{severity}'}: {len(texts)} snippets "
            f"in {wall:.1f} s")
        return {"n": len(index), "wall_s": round(wall, 2)}

    out = run["store"].run("bench-traffic-forecast-set", inputs, build, SET_VERSION)
    with np.load(Path(out.path) / "set.npz") as z:
        return {k: z[k] for k in z.files}


def take(arrays: dict, positions) -> dict:
    """The set's rows at `positions` (per-snippet arrays)."""
    pos = np.asarray(positions, dtype=int)
    return {k: v[pos] for k, v in arrays.items()}


def joined(parts: list[dict]) -> dict:
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def accuracy(arrays: dict) -> float:
    return float(np.mean(arrays["probs"].argmax(axis=1) == arrays["label"]))


def describe(arrays: dict, reference_shares=None, threshold: float | None = None) -> dict:
    """The window's descriptors (descriptors.window_descriptors) from a set's per-snippet arrays."""
    from ttt_pipeline.evaluation.descriptors import PER_TEXT, window_descriptors

    per_text = {k: arrays[k] for k in PER_TEXT}
    return window_descriptors(per_text, arrays["probs"], arrays["probs"].argmax(axis=1), arrays["pred_spell"],
                              reference_label_shares=reference_shares, threshold=threshold)


def calibrate(scorer: Scorer, plan_: dict, split_n: dict) -> dict:
    """Step 1 of the module doc: the validation sets, their points and the fitted calibration."""
    from ttt_pipeline.evaluation import forecast as fc

    index = list(range(split_n["validation"]))
    clean = scored_set(scorer, "validation", None, None, index)
    clean_window = describe(clean)
    reference = fc.CleanReference(clean_window, accuracy(clean), clean["probs"].max(axis=1).tolist())
    points, sets = [], []
    for family in plan_["own"]:
        for s in severities(family, plan_["cal_severities"]):
            arrays = scored_set(scorer, "validation", family, s, index)
            window = describe(arrays, clean_window["label_shares"])
            points.append(fc.CalibrationPoint(family, s, window, accuracy(arrays), reference.accuracy - accuracy(arrays)))
            sets.append({"family": family, "severity": s, "accuracy": accuracy(arrays),
                         "drop": reference.accuracy - accuracy(arrays), **{k: window[k] for k in REPORTED}})
    cal = fc.fit_calibration(points, reference, CONFIDENCE)
    return {"calibration": cal, "points": points, "reference": reference, "sets": sets}


def slope(points, clean_window: dict, leave_out: str | None = None) -> float:
    """The `slope` model's k (drop per unit of excess repaired_words_share, least squares through the origin,
    clipped at 0) on the points, without `leave_out`'s."""
    x = np.array([max(0.0, p.window["repaired_words_share"] - clean_window["repaired_words_share"])
                  for p in points if p.family != leave_out])
    y = np.array([p.drop for p in points if p.family != leave_out])
    return max(0.0, float(x @ y / (x @ x))) if np.any(x) else 0.0


def window_row(group: str, name: str, family: str | None, severity: int | None, arrays: dict, clean: dict,
               cal, reference, calibrated_on: str) -> dict:
    """One window: forecast with its interval, measured drop on the same snippets, baselines, verdict."""
    from ttt_pipeline.evaluation import forecast as fc

    window = describe(arrays, reference.window["label_shares"], cal.atc_threshold)
    predicted = fc.forecast(cal, window)
    measured = accuracy(clean) - accuracy(arrays)
    excess = max(0.0, window["repaired_words_share"] - reference.window["repaired_words_share"])
    return {"group": group, "window": name, "family": family, "severity": severity, "n": window["n"],
            "calibration": calibrated_on, "forecast": predicted, "measured": measured,
            "inside": predicted["ci_low"] - _EDGE <= measured <= predicted["ci_high"] + _EDGE,
            "baselines": fc.baseline_drops(cal, window), "verdict": fc.verdict(predicted, MAX_DROP, window["n"]),
            "excess_repaired_words_share": excess, "descriptors": {k: window[k] for k in REPORTED}}


def traffic_windows(scorer: Scorer, plan_: dict, fitted: dict, split_n: dict, test_size: int) -> tuple[list, dict]:
    """Step 2 of the module doc: the windows (a)-(d), each a row of `window_row`; and the sample's size and the
    clean test accuracy (whole split, sample)."""
    from ttt_pipeline.evaluation import forecast as fc

    n = split_n["test"]
    sample = sorted(random.Random(0).sample(range(n), test_size)) if 0 < test_size < n else list(range(n))
    full_clean = scored_set(scorer, "test", None, None, list(range(n)))
    clean = take(full_clean, sample)
    cal, points, ref = fitted["calibration"], fitted["points"], fitted["reference"]
    without = {f: fc.fit_calibration([p for p in points if p.family != f], ref, CONFIDENCE) for f in plan_["own"]}
    noisy: dict[tuple[str, int], dict] = {}
    rows = []
    for family in plan_["own"]:
        for s in severities(family, plan_["test_severities"]):
            noisy[(family, s)] = arrays = scored_set(scorer, "test", family, s, sample)
            rows.append(window_row("left_out", f"{family}-{s}", family, s, arrays, clean, without[family], ref,
                                   f"without {family}"))
    for family in plan_["ext"]:
        noisy[(family, EXT_SEVERITY)] = arrays = scored_set(scorer, "test", family, EXT_SEVERITY, sample)
        rows.append(window_row("external", f"{family}-{EXT_SEVERITY}", family, EXT_SEVERITY, arrays, clean, cal,
                               ref, "full"))
    size = min(plan_["clean_window"], n)
    for seed in range(CLEAN_WINDOWS):
        pos = np.sort(np.random.default_rng(seed).choice(n, size, replace=False))
        arrays = take(full_clean, pos)
        rows.append(window_row("clean", f"clean-{seed}", None, None, arrays, arrays, cal, ref, "full"))
    for family, s in MIXTURES:
        if (family, s) not in noisy:  # --quick scores fewer sets
            noisy[(family, s)] = scored_set(scorer, "test", family, s, sample)
        mixed = np.random.default_rng(0).random(len(sample)) < MIX_SHARE
        arrays = joined([take(noisy[(family, s)], np.flatnonzero(mixed)), take(clean, np.flatnonzero(~mixed))])
        own = family in without
        rows.append(window_row("mixture", f"{family}-{s} 30%", family, s, arrays, clean,
                               without[family] if own else cal, ref, f"without {family}" if own else "full"))
    return rows, {"sample": len(sample), "clean_accuracy": accuracy(full_clean), "sample_accuracy": accuracy(clean)}


def mae_points(rows: list[dict], estimate) -> float | None:
    """Mean absolute error of `estimate(row)` against the measured drops, in points."""
    errors = [abs(estimate(r) - r["measured"]) for r in rows if estimate(r) is not None]
    return 100 * float(np.mean(errors)) if errors else None


GROUPS = {"all": None, "left_out": ("left_out", "external"), "own_left_out": ("left_out",),
          "external": ("external",), "clean": ("clean",), "mixture": ("mixture",)}


def summary(rows: list[dict]) -> dict:
    """Coverage, MAE (forecast and baselines, points) per group of windows, the false-alarm rate, the aims."""
    picked = {g: [r for r in rows if kinds is None or r["group"] in kinds] for g, kinds in GROUPS.items()}
    coverage = {g: float(np.mean([r["inside"] for r in rs])) if rs else None for g, rs in picked.items()}
    mae = {g: mae_points(rs, lambda r: r["forecast"]["delta"]) for g, rs in picked.items()}
    base = {b: {g: mae_points(rs, lambda r, b=b: r["baselines"][b]) for g, rs in picked.items()}
            for b in ("ac", "doc", "atc")}
    best = {g: min(base, key=lambda b: base[b][g]) for g in picked if picked[g]}
    clean = picked["clean"]
    false_alarm = float(np.mean([r["verdict"] == "noisy" for r in clean])) if clean else None
    beats = {g: mae[g] < base[best[g]][g] for g in ("all", "left_out") if g in best}
    return {"windows": {g: len(rs) for g, rs in picked.items()}, "coverage": coverage, "mae_points": mae,
            "baseline_mae_points": base, "best_baseline": best, "forecast_beats_best_baseline": beats,
            "false_alarm_rate": false_alarm,
            "aims_met": {"coverage": coverage["all"] >= AIMS["coverage"],
                         "mae_left_out": mae["left_out"] is not None and mae["left_out"] <= AIMS["mae_points"],
                         "below_best_baseline": bool(beats.get("left_out")),
                         "false_alarm_rate": false_alarm is not None and false_alarm <= AIMS["false_alarm_rate"]}}


def families(rows: list[dict], fitted: dict) -> tuple[list[dict], list[dict]]:
    """Per family of the (a) and (b) windows: coverage, MAE, drop per changed word against the calibration's slope;
    and the families that break the forecast (a window outside its interval), with why."""
    points, clean_window = fitted["points"], fitted["reference"].window
    k = slope(points, clean_window)
    out, broken = [], []
    for fam in dict.fromkeys(r["family"] for r in rows if r["group"] in ("left_out", "external")):
        mine = [r for r in rows if r["family"] == fam and r["group"] in ("left_out", "external")]
        excess = sum(r["excess_repaired_words_share"] for r in mine)
        drop = sum(r["measured"] for r in mine)
        per_word = drop / excess if excess > 1e-9 else None
        row = {"family": fam, "windows": len(mine), "inside": sum(r["inside"] for r in mine),
               "mae_points": mae_points(mine, lambda r: r["forecast"]["delta"]),
               "measured_points": [round(100 * r["measured"], 2) for r in mine],
               "forecast_points": [round(100 * r["forecast"]["delta"], 2) for r in mine],
               "drop_per_changed_word": per_word, "calibration_slope": k,
               "slope_without_family": slope(points, clean_window, fam) if fam in {p.family for p in points} else k}
        out.append(row)
        if row["inside"] < row["windows"]:
            broken.append({"family": fam, "why": why(row, excess / len(mine))})
    return out, broken


def why(row: dict, mean_excess: float) -> str:
    """A sentence on why a family's windows miss the interval: its drop per changed word against the slope."""
    measured = max(row["measured_points"], key=abs)
    if row["drop_per_changed_word"] is None or mean_excess < 0.005:
        return (f"the repair changes almost no more words than on clean text (mean excess repaired_words_share "
                f"{mean_excess:.4f}), so the forecast sees no noise, while the drop reaches {measured:+.2f} points")
    ratio = row["drop_per_changed_word"] / row["calibration_slope"] if row["calibration_slope"] else float("inf")
    side = "more" if ratio > 1 else "less"
    return (f"its drop per changed word is {row['drop_per_changed_word']:.3f} against the calibration's slope "
            f"{row['calibration_slope']:.3f} ({ratio:.2f}x): each word the repair changes costs {side} accuracy "
            f"than in the calibration sets")


def run_bench(args) -> dict:
    """Train (or find) the model, calibrate on validation, score the test windows, the report."""
    t0 = time.perf_counter()
    plan_ = plan(args)
    ns = SimpleNamespace(store=args.store, quick=args.quick, mask_seeds=1,
                         test_size=QUICK["split"] if args.quick else None)
    run = {**train(PRESET, args.seed, ns), "args": ns}
    scorer = Scorer(run)
    from ttt_pipeline.data.prepare import load_prepared

    ds = load_prepared(run["data"].path)[0]
    split_n = {s: len(ds[s]["label"]) for s in ("validation", "test")}
    fitted = calibrate(scorer, plan_, split_n)
    log(f"calibrated on {len(fitted['points'])} validation sets ({time.perf_counter() - t0:.0f} s)")
    rows, info = traffic_windows(scorer, plan_, fitted, split_n, args.test_size)
    fams, broken = families(rows, fitted)
    cal = fitted["calibration"]
    return {"model": MODEL, "quick": args.quick, "preset": PRESET, "seed": args.seed,
            "validation_snippets": split_n["validation"], "test_snippets": split_n["test"],
            "test_sample": info["sample"], "max_drop": MAX_DROP, "confidence": CONFIDENCE,
            "calibration": {"model": cal.model, "features": list(cal.features), "coefficients": list(cal.coefficients),
                            "half_width": cal.half_width, "scale_floor": cal.scale_floor,
                            "validation_accuracy": cal.test_accuracy, "held_out_errors": dict(cal.held_out_errors),
                            "baseline_errors": dict(cal.baseline_errors),
                            "slope": slope(fitted["points"], fitted["reference"].window),
                            "families": list(cal.families), "sets": fitted["sets"]},
            "test_clean_accuracy": info["clean_accuracy"], "test_clean_accuracy_sample": info["sample_accuracy"],
            **summary(rows), "families": fams, "broken": broken, "windows_list": rows,
            "wall_s": round(time.perf_counter() - t0, 1)}


def pts(x: float | None) -> str:
    return "   n/a" if x is None else f"{100 * x:+6.2f}"


def table(r: dict) -> str:
    """A readable table of the windows and the summary (points)."""
    cal = r["calibration"]
    lines = [f"{r['preset']}: calibration {cal['model']} {dict(zip(cal['features'], cal['coefficients']))} on "
             f"{len(cal['sets'])} validation sets (accuracy {100 * cal['validation_accuracy']:.2f}); "
             f"{r['test_sample']} test snippets per window",
             f"{'window':<24}{'calibration':<22}{'measured':>9}{'forecast':>9}  {'90% interval':<18}"
             f"{'AC':>7}{'DoC':>7}{'ATC':>7}  verdict"]
    for w in r["windows_list"]:
        f, b = w["forecast"], w["baselines"]
        lines.append(f"{w['window']:<24}{w['calibration']:<22}{pts(w['measured']):>9}{pts(f['delta']):>9}  "
                     f"[{pts(f['ci_low'])}, {pts(f['ci_high'])}]{'' if w['inside'] else '*':<2}"
                     f"{pts(b['ac']):>7}{pts(b['doc']):>7}{pts(b['atc']):>7}  {w['verdict']}")
    lines.append("* measured drop outside the interval")
    for g in GROUPS:
        if r["windows"][g]:
            lines.append(f"{g:<14} windows {r['windows'][g]:>3}  coverage {r['coverage'][g]:.2f}  MAE "
                         f"{r['mae_points'][g]:.2f}  (AC {r['baseline_mae_points']['ac'][g]:.2f}, DoC "
                         f"{r['baseline_mae_points']['doc'][g]:.2f}, ATC {r['baseline_mae_points']['atc'][g]:.2f})")
    lines.append(f"false alarms on clean windows: {r['false_alarm_rate']}; aims met: {r['aims_met']}")
    lines += [f"broken: {b['family']}: {b['why']}" for b in r["broken"]] or ["broken: none"]
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="the JSON line only (no table)")
    p.add_argument("--quick", action="store_true", help="smoke: 48 training snippets, 60 validation and test "
                   "snippets, 3 families at severities 1 and 5, ext:spelling")
    p.add_argument("--test-size", type=int, help="test snippets per window (a seeded sample; default 2000, --quick "
                   "40; 0: all)")
    p.add_argument("--seed", type=int, default=42, help="training seed (finetune.seed)")
    p.add_argument("--store", type=Path, default=REPO / ".cache" / "bench" / "store-traffic-forecast")
    args = p.parse_args(argv)
    if args.test_size is None:
        args.test_size = QUICK["test_size"] if args.quick else 2000
    args.store = args.store.resolve()
    shared_raw(args.store)
    out = run_bench(args)
    if not args.json:
        log(table(out))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
