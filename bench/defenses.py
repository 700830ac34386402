"""Defenses side by side on real reviews: masked TTT against its no-gradient control and the practical alternatives.

Data: MDSD electronics (4-class star rating), shuffled with `--split-seed`. The first 80% is the training pool: its
first `--train-size` (1,400) reviews train, its last `--val-size` (200) validate and are the only data any choice
reads. Test: the first `--test-size` (400) of the rest; shift: `--shift-size` kitchen and books reviews. Sets, all at
severity 3: clean, the tutorial composite, `--char-family` and `--word-family` (test reviews with `--test-seed`,
validation reviews once per `--val-seeds`); on the test reviews only, `--test-families` (misspelling) and
`--external-families` (nlpaug's `ext:` generators: the held-out test of generalisation, never pooled with the own).
Models, per training seed (`--seeds`), on bench/common.py's MODEL: the measured recipe (joint, MLM weight 0.5,
class-weighted loss, [CLS] pooling, `--epochs` 4, precision auto) and, unless `--no-augment`, the same with robust
training (`finetune.augment`: `--augment-share` of the reviews copied, each corrupted by one of `--augment-families`
at severity 3 with `--augment-seed`). `--defenses` are `ttt.methods` names scored on the plain model, `--augmented`
those scored on the robust one; masked methods once per `--mask-seeds`, with settings chosen per training seed among
`--ttt-candidates` on the corrupted validation reviews. Differences are paired per review and pooled over training
seeds, mask seeds and, where said, sets (ttt_pipeline.evaluation.stats.paired_difference).

Default defense (rule version 3, fixed before the runs it governs): of the candidates with `--min-speed` reviews/s
and a clean validation accuracy at most 1 point below none's, the one with the highest corrupted validation accuracy
(three families x `--val-seeds`, pooled; ties: fewer components, then the first name; none eligible: `none`). A pick
on the robustly trained model stands only if its paired validation difference against the best plain-model
candidate has its 95% interval above 0: 200 validation reviews cannot rank a retrained model by point estimates.

`--json`: one JSON object on the last stdout line (rows per defense and set, drop, the default and its recovered
fraction, ttt_vs_control, worst cases and harm flags). `--quick`: a smoke run; the full run: half a day on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

from bench import REPO
from bench.common import (
    DIFF_FIELDS,
    MODEL,
    build_model,
    load_domain,
    log,
    model_device,
    scoring_amp,
    skipped_without_mdsd,
    train_classifier,
)

DEFENSES = ["none", "spell", "mask_ensemble", "masked_ttt", "masked_ttt_views", "masked_ttt_sgd",
            "masked_ttt_lower_norm", "masked_ttt_anchored", "tent", "tent_filtered", "spell+mask_ensemble",
            "spell+masked_ttt", "spell+masked_ttt_anchored", "spell+tent_filtered"]
BOOTSTRAP = {"resamples": 2000, "seed": 0}  # every interval of the report (paired bootstrap over reviews)
AUGMENTED = ["none", "spell", "masked_ttt", "spell+masked_ttt"]  # on the robustly trained model, as augment+...
RECIPES = ["masked_ttt", "masked_ttt_views", "masked_ttt_sgd", "masked_ttt_lower_norm", "masked_ttt_anchored"]


def augmented_name(method: str) -> str:
    return "augment" if method == "none" else f"augment+{method}"


# ---------------------------------------------------------------------------------------------------- data
def build_data(args) -> dict:
    """{"train": (texts, labels), "test_sets": {set: (texts, labels)}, "val_sets": {...}} (see the docstring)."""
    from ttt_pipeline.corruption import corrupt_texts

    texts, labels = load_domain("electronics", args.split_seed)
    cut = int(0.8 * len(texts))
    pool_t, pool_y = texts[:cut], labels[:cut]
    if args.train_size + args.val_size > cut:
        raise SystemExit(f"--train-size + --val-size must be at most {cut} (the training pool)")
    train = (pool_t[:args.train_size], pool_y[:args.train_size])
    val_t, val_y = pool_t[cut - args.val_size:], pool_y[cut - args.val_size:]
    test_t, test_y = texts[cut:][:args.test_size], labels[cut:][:args.test_size]
    families = ["tutorial", args.char_family, args.word_family]
    test_sets = {"clean": (test_t, test_y)}
    val_sets = {"clean": (val_t, val_y)}
    for fam in families:
        test_sets[f"{fam}-3"] = (corrupt_texts(test_t, fam, 3, args.test_seed).texts, test_y)
        for vs in args.val_seeds:
            val_sets[val_key(fam, vs, args.val_seeds)] = (corrupt_texts(val_t, fam, 3, vs).texts, val_y)
    for fam in args.test_families + args.external_families:  # test reviews only: the selection never sees them
        test_sets[f"{fam}-3"] = (corrupt_texts(test_t, fam, 3, args.test_seed).texts, test_y)
    for d in ("kitchen", "books"):
        t, y = load_domain(d, args.split_seed)
        test_sets[d] = (t[:args.shift_size], y[:args.shift_size])
    return {"train": train, "test_sets": test_sets, "val_sets": val_sets, "families": families}


def val_key(family: str, seed: int, seeds: list[int]) -> str:
    """`tutorial-3`, or `tutorial-3@8` for each validation corruption seed after the first."""
    return f"{family}-3" if seed == seeds[0] else f"{family}-3@{seed}"


def corrupted_sets(sets: dict) -> list[str]:
    """The own suite's corrupted sets (the external generators' `ext:` sets are never among them)."""
    return [s for s in sets if s.split("@")[0].endswith("-3") and not s.startswith("ext:")]


def external_sets(sets: dict) -> list[str]:
    """The external generators' sets: the held-out test of generalisation, reported apart."""
    return [s for s in sets if s.startswith("ext:")]


# ------------------------------------------------------------------------------------------------ training
def train_model(seed: int, train: tuple[list[str], list[int]], args, augment: bool, overrides: dict | None = None):
    """The recipe of the docstring (robust training with `augment`); `overrides`: FinetuneConfig fields on top
    (bench/studies/ttt_signal.py: head quality and fine-tuning mode)."""
    from ttt_pipeline.modeling.augment import augment_texts

    model, tok = build_model(seed, max_length=args.max_length, pooling="cls")
    texts, labels = train
    summary = None
    if augment:
        aug = augment_texts(texts, labels, args.augment_families, [3], args.augment_share, args.augment_seed)
        texts, labels, summary = aug.texts, aug.labels, aug.summary()
    cfg = {"mlm_warmup_max_steps": args.warmup_steps, "joint_passes": 1, "precision": "auto", "mlm_weight": 0.5,
           "weighted_sampler": False, "epochs": args.epochs, "alignment": "joint", "seed": seed,
           "early_stopping_patience": 0, **(overrides or {})}
    work = REPO / ".cache" / "bench-defenses" / f"{'augment' if augment else 'plain'}-{seed}-{os.getpid()}"
    result, seconds = train_classifier(model, tok, texts, labels, cfg, work, args.max_length)
    return model, tok, {"train_s": seconds, "train_reviews": len(texts), "augment": summary,
                        "train_samples_per_s": result.train_samples_per_s}


# ------------------------------------------------------------------------------------------------- scoring
class Scorer:
    """Scores one model under methods; repairs (the spelling dictionary) are built once for the whole bench."""

    def __init__(self, args, vocabulary: list[str]):
        from ttt_pipeline.config import TTTConfig

        self.args = args
        # no held-out probes (ttt.signal_every): the speeds here are those of a served model
        self.base = TTTConfig(batch_size=args.batch_size, signal_every=0)
        self.vocabulary = vocabulary
        self._repairs: dict[str, object] = {}

    def repairs(self, method: str) -> list:
        from ttt_pipeline.defenses import registry

        return registry.build_repairs(method, self.base, {"vocabulary": self.vocabulary}, self._repairs)

    def run(self, model, tok, method: str, texts: list[str], labels: list[int], settings) -> tuple[np.ndarray, float]:
        """(0/1 correctness per review, wall seconds) of `method` under TTTConfig `settings`."""
        from ttt_pipeline.evaluation.scoring import predict_texts

        repairs = self.repairs(method)  # built once per bench (the dictionary's load is not per-review work)
        t0 = time.perf_counter()
        logits = predict_texts(model, tok, texts, method, settings, self.args.max_length, self.args.batch_size,
                               model_device(model), repairs=repairs, amp=scoring_amp(model, settings.precision))
        wall = time.perf_counter() - t0
        return (logits.argmax(-1) == np.asarray(labels)).astype(float), wall


def choose_ttt(scorer: Scorer, model, tok, val_sets: dict, candidates: dict[str, dict]) -> tuple[str, dict]:
    """The TTT candidate with the best masked_ttt accuracy on the corrupted validation sets (mask seed 0)."""
    if len(candidates) == 1:  # nothing to choose: no validation scoring
        return next(iter(candidates)), {}
    scores = {}
    for name, over in candidates.items():
        settings = scorer.base.model_copy(update=over)
        correct = [scorer.run(model, tok, "masked_ttt", *val_sets[s], settings)[0] for s in corrupted_sets(val_sets)]
        scores[name] = float(np.mean(np.concatenate(correct)))
    best = max(scores.values())
    chosen = next(n for n in candidates if scores[n] == best)  # ties: the earlier (the tutorial first)
    return chosen, scores


def score_all(scorer: Scorer, model, tok, methods: dict[str, str], sets: dict, settings, mask_seeds: list[int],
              store: dict, tag: str) -> None:
    """store[(defense, set)] += one entry per mask seed: {"correct", "wall", "n"}; `methods` maps the reported
    defense name to the method run on this model."""
    from ttt_pipeline.defenses import registry

    for name, method in methods.items():
        seeds = mask_seeds if registry.parse(method).masked else [None]
        for s, (texts, labels) in sets.items():
            for seed in seeds:
                cfg = settings if seed is None else settings.model_copy(update={"seed": seed})
                correct, wall = scorer.run(model, tok, method, texts, labels, cfg)
                store.setdefault((name, s), []).append({"correct": correct, "wall": wall, "n": len(texts)})
        done = [e for (d, _), v in store.items() if d == name for e in v]
        rate = sum(e["n"] for e in done) / max(1e-9, sum(e["wall"] for e in done))
        log(f"[bench] {tag} {name}: {rate:.1f} reviews/s")


# --------------------------------------------------------------------------------------------- statistics
def matrix(store: dict, defense: str, sets: list[str]) -> np.ndarray:
    """reviews x draws (training seeds x mask seeds x sets) of 0/1 correctness: the same reviews across sets."""
    return np.column_stack([e["correct"] for s in sets for e in store[(defense, s)]])


def stacked(store: dict, defense: str, sets: list[str]) -> np.ndarray:
    """Different reviews (kitchen, books) one under the other: reviews x draws."""
    return np.vstack([np.column_stack([e["correct"] for e in store[(defense, s)]]) for s in sets])


def diff(a: np.ndarray, b: np.ndarray, kw: dict) -> dict:
    from ttt_pipeline.evaluation.stats import paired_difference

    d = paired_difference(a, b, **kw).to_dict()
    return {k: d[k] for k in DIFF_FIELDS}


def speed(store: dict, defense: str, sets: list[str]) -> float:
    entries = [e for s in sets for e in store[(defense, s)]]
    wall = sum(e["wall"] for e in entries)
    return sum(e["n"] for e in entries) / wall if wall > 0 else 0.0


def verdict(d: dict, what: str) -> str:
    if d["significant"]:
        return f"{what}: {'yes' if d['delta'] > 0 else 'no, it is worse'} ({d['delta'] * 100:+.2f} points)"
    return f"{what}: not shown ({d['delta'] * 100:+.2f} points, interval includes 0)"


def select_default(val: dict, defenses: list[str], min_speed: float, kw: dict | None = None) -> dict:
    """The selection rule of the docstring (version 3), on the validation scores only."""
    vsets = sorted({s for (_, s) in val})
    corrupted = corrupted_sets(dict.fromkeys(vsets))
    table = {}
    for d in defenses:
        table[d] = {"acc_corrupted": float(matrix(val, d, corrupted).mean()),
                    "acc_clean": float(matrix(val, d, ["clean"]).mean()), "reviews_per_s": speed(val, d, vsets)}
    none = table["none"]
    eligible = [d for d in defenses if d != "none" and table[d]["reviews_per_s"] >= min_speed
                and table[d]["acc_clean"] >= none["acc_clean"] - 0.01]
    if not eligible:
        return {"name": "none", "eligible": [], "validation": table, "rule_version": 3}

    def rank(d: str) -> tuple:  # speed only through the bar above; exact ties: fewer components, then the name
        return -table[d]["acc_corrupted"], d.count("+"), d

    out = {"name": min(eligible, key=rank), "eligible": eligible, "validation": table, "rule_version": 3}
    plain = [d for d in eligible if not d.startswith("augment")]
    if out["name"].startswith("augment") and plain:  # version 3: a retrained model must beat the plain one's best
        rival = min(plain, key=rank)
        vs = diff(matrix(val, rival, corrupted), matrix(val, out["name"], corrupted), kw or BOOTSTRAP)
        out["retrained_vs_plain"] = {**vs, "plain": rival, "retrained": out["name"]}
        if not vs["ci_low"] > 0:
            out["name"] = rival
    return out


def save_validation(val: dict, path: str) -> None:
    """The validation scores the selection rule reads (per (defense, set): each draw's 0/1 correctness, its wall
    seconds and review count), so a later rule version can be applied to a finished run without retraining."""
    arrays = {}
    for (defense, s), entries in val.items():
        key = f"{defense}|{s}"
        arrays[key + "|correct"] = np.column_stack([e["correct"] for e in entries]).astype(np.uint8)
        arrays[key + "|wall"] = np.array([e["wall"] for e in entries], dtype=float)
        arrays[key + "|n"] = np.array([e["n"] for e in entries], dtype=int)
    tmp = Path(path).with_suffix(".tmp.npz")
    np.savez_compressed(tmp, **arrays)
    os.replace(tmp, path)  # atomic: a run stopped mid-write leaves the previous file


def load_validation(path: str) -> dict:
    """save_validation's file as the validation store select_default reads."""
    with np.load(path) as z:
        keys = {k.rsplit("|", 1)[0] for k in z.files}
        out = {}
        for key in sorted(keys):
            defense, s = key.split("|")
            correct, wall, n = z[key + "|correct"], z[key + "|wall"], z[key + "|n"]
            out[(defense, s)] = [{"correct": correct[:, i].astype(float), "wall": float(wall[i]), "n": int(n[i])}
                                 for i in range(correct.shape[1])]
    return out


def report(test: dict, val: dict, defenses: list[str], families: list[str], args, kw: dict) -> dict:
    from ttt_pipeline.evaluation.stats import recovered_fraction_interval

    sets = list(dict.fromkeys(s for (_, s) in test))
    corrupted = corrupted_sets(dict.fromkeys(sets))
    tutorial = "tutorial-3"
    rows = []
    for d in defenses:
        for s in sets:
            a, b = matrix(test, "none", [s]), matrix(test, d, [s])
            row = {"defense": d, "set": s, "acc": float(b.mean()), **diff(a, b, kw),
                   "reviews_per_s": speed(test, d, [s])}
            if d.startswith("augment") and s in corrupted:
                row["trained_on"] = s[:-2] in args.augment_families
            rows.append(row)
    drop = diff(matrix(test, "none", [tutorial]), matrix(test, "none", ["clean"]), kw)
    chosen = select_default(val, defenses, args.min_speed, kw)
    name = chosen["name"]
    shift = [s for s in ("kitchen", "books") if s in sets]
    point, lo, hi = recovered_fraction_interval(matrix(test, "none", ["clean"]), matrix(test, "none", [tutorial]),
                                                matrix(test, name, [tutorial]), **kw)
    default = {"name": name, "recovered_fraction": None if np.isnan(point) else point,
               "recovered_ci": [None if np.isnan(lo) else lo, None if np.isnan(hi) else hi],
               "clean_change": diff(matrix(test, "none", ["clean"]), matrix(test, name, ["clean"]), kw),
               "shift_change": diff(stacked(test, "none", shift), stacked(test, name, shift), kw),
               "shift_change_by_domain": {s: diff(matrix(test, "none", [s]), matrix(test, name, [s]), kw)
                                          for s in shift},
               "gain_on_tutorial": diff(matrix(test, "none", [tutorial]), matrix(test, name, [tutorial]), kw),
               "reviews_per_s": speed(test, name, sets), **{k: v for k, v in chosen.items() if k != "name"}}
    out = {"rows": rows, "drop": drop, "default": default,
           "generalisation": generalisation(test, rows, defenses, name, kw)}

    def versus(b: str, a: str) -> dict | None:
        if (a, corrupted[0]) not in test or (b, corrupted[0]) not in test:
            return None
        d = diff(matrix(test, a, corrupted), matrix(test, b, corrupted), kw)
        return {**d, "sets": corrupted, "verdict": verdict(d, f"{b} beats {a}")}

    out["ttt_vs_control"] = versus("masked_ttt", "mask_ensemble")
    out["ttt_on_top_of_spell"] = versus("spell+masked_ttt", "spell")
    out["recipes_vs_control"] = {r: versus(r, "mask_ensemble") for r in RECIPES if (r, corrupted[0]) in test}
    out["tent_filtered_vs_tent"] = versus("tent_filtered", "tent")
    trained = [s for s in corrupted if s[:-2] in args.augment_families]
    held = [s for s in corrupted if s not in trained]
    if ("augment", "clean") in test:
        out["augment"] = {"families": args.augment_families, "trained_sets": trained, "held_out_sets": held,
                          "clean": diff(matrix(test, "none", ["clean"]), matrix(test, "augment", ["clean"]), kw),
                          "trained": diff(matrix(test, "none", trained), matrix(test, "augment", trained), kw)
                          if trained else None,
                          "held_out": diff(matrix(test, "none", held), matrix(test, "augment", held), kw)
                          if held else None}
    return out


def _fraction(test: dict, name: str, sets: list[str], kw: dict) -> dict:
    """The share of the drop (clean minus `sets` without defense) that `name` wins back on `sets`, with its interval."""
    from ttt_pipeline.evaluation.stats import recovered_fraction_interval

    clean = matrix(test, "none", ["clean"])
    point, lo, hi = recovered_fraction_interval(clean, matrix(test, "none", sets), matrix(test, name, sets), **kw)
    nan = lambda v: None if np.isnan(v) else v  # noqa: E731
    return {"recovered_fraction": nan(point), "recovered_ci": [nan(lo), nan(hi)],
            "drop": diff(matrix(test, "none", sets), np.repeat(clean, len(sets), axis=1), kw),
            "gain": diff(matrix(test, "none", sets), matrix(test, name, sets), kw), "sets": sets}


def generalisation(test: dict, rows: list[dict], defenses: list[str], name: str, kw: dict) -> dict:
    """Own suite against the external generators (never looked at by the selection), and every defense's worst case:
    its lowest paired change over all scored sets, `harm` when any set's interval lies wholly below 0."""
    sets = dict.fromkeys(s for (_, s) in test)
    own, ext = corrupted_sets(sets), external_sets(sets)
    out: dict = {"own_sets": own, "external_sets": ext, "gains": {}, "worst_case": {}}
    for d in defenses:
        if d == "none":
            continue
        out["gains"][d] = {part: diff(matrix(test, "none", ss), matrix(test, d, ss), kw)
                           for part, ss in (("own", own), ("external", ext)) if ss}
        mine = [r for r in rows if r["defense"] == d]
        low = min(mine, key=lambda r: r["delta"])
        harmed = [r["set"] for r in mine if r["ci_high"] < 0]
        out["worst_case"][d] = {"delta": low["delta"], "ci_low": low["ci_low"], "ci_high": low["ci_high"],
                                "set": low["set"], "harm": bool(harmed), "harmed_sets": harmed}
    out["fractions"] = {}
    for d in [name] + [d for d in defenses if d not in ("none", name)]:
        out["fractions"][d] = {s: _fraction(test, d, [s], kw) for s in own + ext}
        if ext:
            out["fractions"][d]["external_pooled"] = _fraction(test, d, ext, kw)
    out["default"] = {"name": name, **out["fractions"][name]} if name != "none" else {"name": name}
    return out


def full_run_estimate(test: dict, val: dict, defenses: list[str], args, candidates: int, train_s: float) -> float:
    """Seconds the full run (default sizes) would take at this run's measured reviews/s per defense and training
    speed, scaled to 128 tokens; rough from a --quick run (small batches, cold caches), and without the MLM-head
    warm-up's fixed cost."""
    from ttt_pipeline.defenses import registry

    n_test = 4 * 400 + 2 * 400
    n_val = (1 + 3 * len(args.val_seeds)) * 200
    seconds = 0.0
    for d in defenses:
        method = d.removeprefix("augment").removeprefix("+") or "none"
        rate = speed(test, d, list(dict.fromkeys(s for (_, s) in test)))
        masks = 3 if registry.parse(method).masked else 1
        seconds += 3 * masks * (n_test + n_val) / max(rate, 1e-9)
    if ("masked_ttt", "tutorial-3") in test:  # the TTT settings' choice on validation
        seconds += 3 * candidates * (n_val - 200) / max(speed(test, "masked_ttt", ["tutorial-3"]), 1e-9)
    tokens = 128 / args.max_length  # cost grows about linearly with the review length at these lengths
    scale = (1400 * 4) / max(1, args.train_size * args.epochs)  # training time is linear in reviews x epochs
    return (seconds + 3 * train_s * scale) * tokens


# ------------------------------------------------------------------------------------------------------ main
def add_data_arguments(p: argparse.ArgumentParser) -> None:
    """Seeds, sizes and batching of the data recipe above (bench/studies/ttt_signal.py shares them)."""
    p.add_argument("--seeds", type=int, nargs="+", default=[42, 43, 44], help="training seeds")
    p.add_argument("--mask-seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--train-size", type=int, default=1400)
    p.add_argument("--val-size", type=int, default=200)
    p.add_argument("--test-size", type=int, default=400)
    p.add_argument("--shift-size", type=int, default=400, help="kitchen and books reviews (0: none)")
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=32, help="test reviews per batch (the TTT unit)")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true")
    p.add_argument("--quick", action="store_true", help="a few reviews, 1 epoch, 1 training and 1 mask seed: tests")
    add_data_arguments(p)
    p.add_argument("--warmup-steps", type=int, default=400, help="cap of the MLM-head warm-up")
    p.add_argument("--char-family", default="keyboard")
    p.add_argument("--word-family", default="word_swap")
    p.add_argument("--test-families", nargs="*", default=["misspelling"],
                   help="own-suite families scored on the test reviews only (never validated on)")
    p.add_argument("--external-families", nargs="*",
                   default=["ext:keyboard", "ext:ocr", "ext:random_char", "ext:spelling"],
                   help="external generators (the held-out test; the selection rule never looks at them)")
    p.add_argument("--split-seed", type=int, default=42, help="shuffle of every domain's reviews before the split")
    p.add_argument("--test-seed", type=int, default=42, help="corruption seed of the test reviews")
    p.add_argument("--val-seeds", type=int, nargs="+", default=[7, 8, 9],
                   help="corruption seeds of the validation split (each review corrupted once per seed)")
    p.add_argument("--augment-families", nargs="+", default=["tutorial", "keyboard"])
    p.add_argument("--augment-share", type=float, default=0.5)
    p.add_argument("--augment-seed", type=int, default=1000)
    p.add_argument("--defenses", nargs="+", default=DEFENSES, help="methods scored on the plain model")
    p.add_argument("--augmented", nargs="+", default=AUGMENTED,
                   help="methods scored on the robustly trained model (reported as augment+...; none is always in)")
    p.add_argument("--no-augment", action="store_true", help="skip the robustly trained model")
    p.add_argument("--ttt-candidates", nargs="+", default=["tutorial", "lr=1e-4", "mask_prob=0.15"],
                   metavar="K=V[,K=V]", help="TTT settings chosen on validation (`tutorial`: the ttt.* defaults)")
    p.add_argument("--min-speed", type=float, default=50.0, help="reviews/s a default defense must reach")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--keep-validation", help="write the validation scores the selection read here (.npz; "
                   "load_validation reads them back, so a later rule version can be applied to this run)")
    p.add_argument("--partial-json", help="after each training seed, write the report over the seeds done so far here")
    return p


def prepare_args(p: argparse.ArgumentParser, args) -> None:
    """--quick's sizes, the corruption seeds' check, the method names (unknown names fail before any training),
    `none` first in both method lists."""
    from ttt_pipeline.defenses import registry

    if args.quick:
        args.seeds, args.mask_seeds, args.epochs = args.seeds[:1], args.mask_seeds[:1], 1
        args.train_size, args.val_size, args.test_size, args.shift_size = 48, 8, 16, 8
        args.warmup_steps, args.max_length, args.batch_size = 5, 64, 8
    corruption_seeds = [args.test_seed, args.augment_seed, *args.val_seeds]
    if len(set(corruption_seeds)) < len(corruption_seeds):
        p.error(f"the test ({args.test_seed}), validation ({args.val_seeds}) and augment ({args.augment_seed}) "
                "corruption seeds must all differ")
    for m in args.defenses + args.augmented:
        registry.parse(m)  # unknown names fail before any training
    args.defenses = ["none"] + [m for m in args.defenses if m != "none"]
    args.augmented = ["none"] + [m for m in args.augmented if m != "none"]


def run_seed(seed: int, args, data: dict, scorer: Scorer, candidates: dict, methods: dict,
             store: dict) -> tuple[dict, list[float]]:
    """One training seed: the plain model (its TTT settings chosen on validation) and, with methods["robust"], the
    robustly trained one, scored on the validation and test sets into store["val"] and store["test"]; (the seed's
    per_seed entry, training seconds of each model)."""
    from ttt_pipeline.defenses import registry

    plain, robust = methods["plain"], methods["robust"]
    test, val = store["test"], store["val"]
    masked = any(registry.parse(m).masked for m in [*plain.values(), *robust.values()])
    model, tok, info = train_model(seed, data["train"], args, augment=False)
    train_s = [info["train_s"]]
    chosen, scores = ("tutorial", {}) if not masked else choose_ttt(scorer, model, tok, data["val_sets"], candidates)
    settings = scorer.base.model_copy(update=candidates[chosen])
    log(f"[bench] seed {seed}: TTT settings {chosen} (validation {scores})")
    score_all(scorer, model, tok, plain, data["val_sets"], settings, args.mask_seeds, val, f"seed {seed} val")
    score_all(scorer, model, tok, plain, data["test_sets"], settings, args.mask_seeds, test, f"seed {seed} test")
    entry = {"seed": seed, "ttt_selected": chosen, "ttt_validation": scores, "train": info}
    if robust:
        model, tok, info = train_model(seed, data["train"], args, augment=True)
        train_s.append(info["train_s"])
        score_all(scorer, model, tok, robust, data["val_sets"], settings, args.mask_seeds, val, f"seed {seed} val")
        score_all(scorer, model, tok, robust, data["test_sets"], settings, args.mask_seeds, test,
                  f"seed {seed} test")
        entry["train_augment"] = info
    return entry, train_s


def settings_of(args, data: dict, candidates: dict) -> dict:
    """The JSON's `settings`: what this run was."""
    return {"seeds": args.seeds, "mask_seeds": args.mask_seeds, "epochs": args.epochs,
            "train": len(data["train"][0]), "val": args.val_size, "test": args.test_size,
            "shift_per_domain": args.shift_size, "families": data["families"], "split_seed": args.split_seed,
            "test_seed": args.test_seed, "val_seeds": args.val_seeds,
            "test_families": args.test_families, "external_families": args.external_families,
            "augment": {"families": args.augment_families, "severities": [3], "share": args.augment_share,
                        "seed": args.augment_seed},
            "ttt_candidates": candidates, "min_speed": args.min_speed, "threads": args.threads, "quick": args.quick}


def print_summary(out: dict) -> None:
    """The table (stderr), then the verdicts, the default and the generalisation figures (stdout)."""
    print(table(out["rows"]), file=sys.stderr)
    for key in ("ttt_vs_control", "ttt_on_top_of_spell"):
        if out.get(key):
            print(f"{key}: {out[key]['verdict']} [{out[key]['ci_low'] * 100:+.2f}, {out[key]['ci_high'] * 100:+.2f}]")
    d = out["default"]
    print(f"default: {d['name']}, recovered {d['recovered_fraction']} {d['recovered_ci']}, "
          f"{d['reviews_per_s']:.1f} reviews/s")
    g = out["generalisation"]
    for key, v in g["default"].items():
        if isinstance(v, dict):
            print(f"default on {key}: recovered {v['recovered_fraction']} {v['recovered_ci']} of a drop of "
                  f"{v['drop']['delta'] * 100:+.2f} [{v['drop']['ci_low'] * 100:+.2f}, {v['drop']['ci_high'] * 100:+.2f}]")
    for m, w in g["worst_case"].items():
        print(f"worst case {m}: {w['delta'] * 100:+.2f} [{w['ci_low'] * 100:+.2f}, {w['ci_high'] * 100:+.2f}] on "
              f"{w['set']}" + (f"  HARM on {', '.join(w['harmed_sets'])}" if w["harm"] else ""))


def main() -> None:
    from ttt_pipeline.config import apply_overrides
    from ttt_pipeline.modeling.precision import machine_summary

    p = parser()
    args = p.parse_args()
    if skipped_without_mdsd():
        return
    prepare_args(p, args)
    torch.set_num_threads(args.threads)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import logging

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    candidates = {c: ({} if c == "tutorial" else apply_overrides({}, c.split(","))) for c in args.ttt_candidates}
    t_all = time.perf_counter()
    data = build_data(args)
    scorer = Scorer(args, data["train"][0])
    store: dict = {"test": {}, "val": {}}
    per_seed = []
    train_s = 0.0
    methods = {"plain": {d: d for d in args.defenses},
               "robust": {} if args.no_augment else {augmented_name(m): m for m in args.augmented}}
    defenses = list(methods["plain"]) + [d for d in methods["robust"] if d not in methods["plain"]]
    for seed in args.seeds:
        entry, seconds = run_seed(seed, args, data, scorer, candidates, methods, store)
        for t in seconds:
            train_s += t
        per_seed.append(entry)
        log(f"[bench] seed {seed}: {json.dumps(entry, default=float)}")
        if args.partial_json:  # the report over the seeds done so far, rewritten after each (a run cut short keeps it)
            partial = {"model": MODEL, **report(store["test"], store["val"], defenses, data["families"], args,
                                                BOOTSTRAP),
                       "seeds_done": [e["seed"] for e in per_seed]}
            Path(args.partial_json).write_text(json.dumps(partial, default=float))
        if args.keep_validation:  # rewritten after each seed too, as the partial report
            save_validation(store["val"], args.keep_validation)
    kw = BOOTSTRAP
    out = {"model": MODEL, **report(store["test"], store["val"], defenses, data["families"], args, kw)}
    out["per_seed"] = per_seed
    out["estimated_full_run_s"] = full_run_estimate(store["test"], store["val"], defenses, args, len(candidates),
                                                    train_s / max(1, len(args.seeds)))
    out["settings"] = settings_of(args, data, candidates)
    out["wall_s"] = time.perf_counter() - t_all
    out["machine"] = machine_summary()  # timings above are of this CPU kind
    print_summary(out)
    if args.json:
        print(json.dumps(out, default=float))

def table(rows: list[dict]) -> str:
    sets = list(dict.fromkeys(r["set"] for r in rows))
    head = f"{'defense':<28}" + "".join(f"{s[:14]:>16}" for s in sets) + f"{'reviews/s':>12}"
    lines = [head, "-" * len(head)]
    for d in dict.fromkeys(r["defense"] for r in rows):
        mine = {r["set"]: r for r in rows if r["defense"] == d}
        rate = np.mean([r["reviews_per_s"] for r in mine.values()])
        lines.append(f"{d[:28]:<28}" + "".join(f"{mine[s]['acc']:>8.3f} {mine[s]['delta'] * 100:>+6.1f}" for s in sets)
                     + f"{rate:>12.1f}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
