"""Is the encoder's hidden dropout worth its cost on a CPU? `finetune.hidden_dropout` 0 against the checkpoint's own
(0.1), the mdsd-electronics recipe, validation reviews only.

Protocol, fixed before the run: MDSD electronics through the preset's own split (`data.val_fraction` 0.1,
`split_seed` 42); for each training seed 42, 43, 44 the recipe fine-tunes twice, hidden dropout as the checkpoint
has it and 0, everything else equal (attention dropout is 0 in the recipe already). Each model predicts the
validation reviews (the run's scoring precision). Reported: the paired accuracy difference (0 minus 0.1) pooled
over the seeds (reviews x seeds, bootstrap 95% interval), each seed's validation accuracy, and the training
throughput of both arms (the fine-tune's samples/s of its classification epochs; the ratio per seed, in the same
run, arms alternating).

Rule: the presets adopt `hidden_dropout: 0` when the pooled difference's interval reaches 0 or lies above it (no
significant loss), its point estimate is at least -1.0 point, and the median throughput ratio is at least 1.1;
otherwise they keep the checkpoint's dropout and the figures say why.

    .venv/bin/python -m bench.studies.hidden_dropout --json      # about 40 min on 2 cores
    .venv/bin/python -m bench.studies.hidden_dropout --quick     # smoke: 64 reviews, 1 epoch, 1 seed
Last stdout line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import numpy as np

from bench.common import MDSD, MODEL, log, skipped_without_mdsd

ARMS = {"checkpoint": None, "off": 0.0}


def train_arm(seed: int, dropout: float | None, store: Path, args) -> dict:
    """One fine-tune of the recipe; its validation predictions and throughput."""
    from ttt_pipeline import steps
    from ttt_pipeline.config import load_config
    from ttt_pipeline.data.prepare import load_prepared
    from ttt_pipeline.evaluation.scoring import predict_texts
    from ttt_pipeline.modeling.loading import load_model
    from ttt_pipeline.storage import StepStore

    sets = [f"data.path={MDSD / 'electronics'}", "data.shift={}", f"finetune.seed={seed}", f"store={store}",
            f"model.name={MODEL}", *([f"finetune.hidden_dropout={dropout}"] if dropout is not None else []),
            *(["data.max_train_samples=64", "finetune.epochs=1", "finetune.mlm_warmup_max_steps=2"]
              if args.quick else [])]
    cfg = load_config("mdsd-electronics", sets)
    st = StepStore(cfg.store)
    data = steps.download(cfg, st)
    tokens = steps.tokenise(cfg, data, st)
    model_out = steps.finetune(cfg, data, tokens, st)
    ds, _ = load_prepared(data.path)
    val = ds["validation"]
    model, tok = load_model(Path(model_out.path) / "model")
    machine = steps.runtime(cfg)
    logits = predict_texts(model, tok, val["text"], "none", cfg.ttt, cfg.model.max_length, cfg.ttt.batch_size,
                           amp=machine.score.dtype)
    pred = logits.argmax(-1)
    return {"correct": (pred == np.asarray(val["label"])).astype(float), "pred": pred, "labels": list(val["label"]),
            "samples_per_s": model_out.meta["train_samples_per_s"], "cached": model_out.cached,
            "precision": machine.train.name}


def run(args) -> dict:
    from ttt_pipeline.evaluation.stats import paired_difference
    from ttt_pipeline.modeling.precision import machine_summary

    store = Path(args.store or tempfile.mkdtemp(prefix="hidden-dropout-"))
    seeds = args.seeds[:1] if args.quick else args.seeds
    runs: dict[int, dict] = {}
    for i, seed in enumerate(seeds):
        order = list(ARMS) if i % 2 == 0 else list(reversed(ARMS))  # alternate which arm trains first
        runs[seed] = {arm: train_arm(seed, ARMS[arm], store, args) for arm in order}
        log(f"seed {seed}: " + ", ".join(f"{a} acc {r['correct'].mean():.3f} {r['samples_per_s']:.1f} samples/s"
                                         for a, r in runs[seed].items()))
    on = np.stack([runs[s]["checkpoint"]["correct"] for s in seeds], 1)
    off = np.stack([runs[s]["off"]["correct"] for s in seeds], 1)
    diff = paired_difference(on, off, seed=0)
    ratios = [runs[s]["off"]["samples_per_s"] / runs[s]["checkpoint"]["samples_per_s"] for s in seeds]
    out = {"model": MODEL, "machine": machine_summary(), "seeds": seeds, "validation_reviews": int(on.shape[0]),
           "val_acc": {a: [round(float(runs[s][a]["correct"].mean()), 4) for s in seeds] for a in ARMS},
           "difference_points": {"delta": round(100 * diff.delta, 2), "ci_low": round(100 * diff.ci_low, 2),
                                 "ci_high": round(100 * diff.ci_high, 2)},
           "samples_per_s": {a: [round(runs[s][a]["samples_per_s"], 2) for s in seeds] for a in ARMS},
           "throughput_ratio": {"median": round(statistics.median(ratios), 3), "per_seed": [round(r, 3) for r in ratios]},
           "any_cached": any(r["cached"] for s in seeds for r in runs[s].values()), "quick": args.quick}
    out["adopt"] = bool(diff.ci_high >= 0 and 100 * diff.delta >= -1.0 and out["throughput_ratio"]["median"] >= 1.1)
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true")
    p.add_argument("--quick", action="store_true", help="64 reviews, 1 epoch, 1 seed: a smoke run")
    p.add_argument("--seeds", type=int, nargs="+", default=[42, 43, 44])
    p.add_argument("--store", help="the step store (default: a fresh temporary folder, so every arm trains)")
    args = p.parse_args(argv)
    if skipped_without_mdsd():
        return
    out = run(args)
    if not args.json:
        log(json.dumps(out, indent=1))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
