"""TRAK attribution on real MDSD reviews: the `attribute` step's wall time, and TRAK's counterfactual check.

1. The pipeline's steps for the preset (download, tokenise, finetune, corrupt, evaluate; served from the step
   store when cached, or given with --entry), then the `attribute` step itself, timed, in a fresh store entry
   (or served from the store with --reuse-step: the wall time stored with the entry is reported, with
   `step.cached: true`).
2. The counterfactual test of the TRAK paper at small scale (ttt_pipeline.evaluation.attribution_check): on `--cf-train`
   training reviews S, the algorithm A(S) retrains the attributed subset (`--cf-params`; the head re-initialised)
   from the fine-tuned checkpoint, deterministically (fixed batch slots, no dropout). `--cf-targets` targets are
   drawn as the step draws them (flipped, fixed, broken predictions); TRAK attributes A(S)'s predictions on them
   (an ensemble of `--cf-models` head seeds). For each target: remove its top-k supporting reviews and retrain,
   remove k random reviews and retrain; delta = top-k margin drop minus random margin drop, mean over targets
   with a 95% percentile-bootstrap interval over targets (ttt_pipeline.evaluation.stats.bootstrap_interval). The linear
   datamodeling score over `--lds-subsets` random halves of S is reported when asked for.

    .venv/bin/python -m bench.attribution ../shared/data/mdsd/electronics --threads 2 --json

The last stdout line is one JSON object: wall_s (of the step) and cpu_s, n_train, n_targets, counterfactual =
{k, margin_drop_topk, margin_drop_random, delta, ci_low, ci_high, significant, per_target, ...}, lds (or null),
and details (step settings, load average).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from bench import REPO

DEFAULT_DATA = REPO.parent / "shared" / "data" / "mdsd" / "electronics"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", nargs="?", type=Path, default=DEFAULT_DATA, help="MDSD domain folder")
    ap.add_argument("--config", default="mdsd-electronics", help="preset or YAML (default mdsd-electronics)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    ap.add_argument("--methods", default="none,spell",
                    help="ttt.methods of the evaluation the targets come from (default none,spell: the defense "
                    "that moves MDSD accuracy, and a cheap one)")
    ap.add_argument("--entry", action="append", default=[], type=Path, metavar="STORE/STEP/KEY",
                    help="use this stored step output (download, finetune, corrupt or evaluate) instead of the preset's key "
                    "(verified by digest): a model trained before a config field was added stays usable")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reuse-step", action="store_true", help="serve the attribute step from the store if cached")
    ap.add_argument("--cf-threads", type=int, default=1,
                    help="torch threads of the check (default 1: its small batches lose more to waiting for a "
                    "second thread on a shared machine than they gain)")
    ap.add_argument("--cf-params", default="head",
                    help="attributed and retrained subset of the check (head: a retraining that converges and is "
                    "stable in minutes; head+last1 is measured in docs/attribution.md)")
    ap.add_argument("--cf-train", type=int, default=500, help="training reviews of the check")
    ap.add_argument("--cf-targets", type=int, default=30, help="targets of the check (0: skip the check)")
    ap.add_argument("--k", type=int, default=20, help="reviews removed per target")
    ap.add_argument("--cf-epochs", type=int, default=20)
    ap.add_argument("--cf-lr", type=float, default=1e-3, help="learning rate of the re-initialised head")
    ap.add_argument("--cf-layer-lr", type=float, default=1e-4,
                    help="learning rate of the retrained encoder layers (fine-tuned already: a small step)")
    ap.add_argument("--cf-models", type=int, default=4, help="A(S) head seeds in TRAK's ensemble")
    ap.add_argument("--lds-subsets", type=int, default=30, help="random halves of S for the LDS (0: not computed)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="(the last line is always the JSON object)")
    return ap.parse_args(argv)


def pipeline_outputs(cfg, entries: list[Path]):
    from ttt_pipeline import steps
    from ttt_pipeline.storage import StepStore

    store = StepStore(cfg.store)
    given = {}
    for e in entries:
        out = StepStore(e.parent.parent).load(e.parent.name, e.name)
        if out is None:
            raise SystemExit(f"--entry {e}: not a verified store entry (STORE/STEP/KEY with a manifest)")
        given[out.step] = out
    t0 = time.perf_counter()
    data = given.get("download") or steps.download(cfg, store)
    if "finetune" in given:
        model = given["finetune"]
    else:
        tokens = steps.tokenise(cfg, data, store)
        ready = steps.stored("finetune", steps.finetune_inputs(cfg, tokens, data), store)
        log(f"finetune ({'cached' if ready else 'training'})")
        model = steps.finetune(cfg, data, tokens, store)
    corrupted = given.get("corrupt") or steps.corrupt(cfg, data, store)
    if "evaluate" in given:
        evaluation = given["evaluate"]
    else:
        ready = steps.stored("evaluate", steps.evaluate_inputs(cfg, data, model, corrupted), store)
        log(f"evaluate ({'cached' if ready else 'scoring'})")
        evaluation = steps.evaluate(cfg, data, model, corrupted, store)
    log(f"upstream steps ready in {time.perf_counter() - t0:.0f} s")
    return store, data, model, corrupted, evaluation


def counterfactual(args, cfg, data, model_out, corrupted, evaluation) -> tuple[dict, dict | None]:
    import numpy as np
    import torch

    from ttt_pipeline import steps
    from ttt_pipeline.data.prepare import load_prepared
    from ttt_pipeline.evaluation.attribution import sample_train, select_targets, trak_scores
    from ttt_pipeline.evaluation.attribution_check import TailTrainer, lds, removal_check
    from ttt_pipeline.evaluation.stats import bootstrap_interval
    from ttt_pipeline.modeling.loading import load_model

    torch.set_num_threads(args.cf_threads)
    t0 = time.perf_counter()
    ds, _ = load_prepared(data.path)
    model, tok = load_model(Path(model_out.path) / "model")
    # the step's kind of targets (flipped, fixed, broken), drawn as the step draws them, as many as asked for
    targets = select_targets(steps.read_predictions([evaluation]), cfg.attribution.reasons, args.cf_targets,
                             args.seed)

    def text_of(name: str, index: int) -> str:
        return (ds["test"]["text"] if name == "clean" else ds[name]["text"] if name in ds
                else steps.read_set(corrupted, name))[index]

    target_texts = [text_of(t["set"], t["index"]) for t in targets]
    pos = sample_train(len(ds["train"]), args.cf_train, args.seed)
    texts = [ds["train"]["text"][i] for i in pos]
    labels = [int(ds["train"]["label"][i]) for i in pos]
    trainer = TailTrainer(model, tok, texts, labels, target_texts, params=args.cf_params,
                          max_length=cfg.model.max_length, epochs=args.cf_epochs, lr=args.cf_lr,
                          layer_lr=args.cf_layer_lr)
    log(f"check: cached tail inputs of {len(texts)} training reviews and {len(targets)} targets "
        f"({time.perf_counter() - t0:.0f} s)")
    t1 = time.perf_counter()
    base = [trainer.train(np.arange(len(texts)), s) for s in range(args.cf_models)]
    retrain_s = (time.perf_counter() - t1) / len(base)
    y = trainer.target_logits(base[0]).argmax(-1).tolist()
    train_acc = float(np.mean([int(p) == labels[i] for i, p in enumerate(
        _train_predictions(trainer, base[0]))]))
    log(f"check: A(S) x {len(base)} trained ({retrain_s:.0f} s each; train accuracy {train_acc:.3f})")
    res = trak_scores([trainer.full_model(t) for t in base], tok, texts, labels, target_texts, y,
                      params=args.cf_params, proj_dim=cfg.attribution.proj_dim, max_length=cfg.model.max_length,
                      batch_size=cfg.attribution.batch_size, seed=cfg.attribution.seed)
    log(f"check: TRAK on A(S) done ({res.timings}); removal retrainings: {2 * len(targets)}")
    rem = removal_check(trainer, res.scores, y, args.k, args.seed,
                        progress=lambda i, n: log(f"check: removal target {i}/{n}"))
    delta = rem["drop_topk"] - rem["drop_random"]
    lo, hi = bootstrap_interval(delta, 2000, 0.95, args.seed)
    cf = {"k": args.k, "margin_drop_topk": float(rem["drop_topk"].mean()),
          "margin_drop_random": float(rem["drop_random"].mean()), "delta": float(delta.mean()), "ci_low": lo,
          "ci_high": hi, "significant": bool(lo > 0 or hi < 0), "n_targets": len(targets), "n_train": len(texts),
          "params": args.cf_params, "epochs": args.cf_epochs, "lr": args.cf_lr,
          "layer_lr": args.cf_layer_lr, "n_models": len(base),
          "proj_dim": res.proj_dim, "train_accuracy": train_acc, "retrain_s": retrain_s,
          "targets_better": int((delta > 0).sum()), "threads": args.cf_threads,
          "per_target": [{"set": t["set"], "index": t["index"], "reasons": t["reasons"],
                          "margin": float(rem["margin_full"][j]), "drop_topk": float(rem["drop_topk"][j]),
                          "drop_random": float(rem["drop_random"][j])} for j, t in enumerate(targets)]}
    lds_out = None
    if args.lds_subsets > 0:
        out = lds(trainer, res.scores, y, args.lds_subsets, seed=args.seed,
                  progress=lambda i, n: log(f"check: LDS subset {i}/{n}"))
        lds_out = {"lds": out["lds"], "n_subsets": out["n_subsets"], "fraction": out["fraction"],
                   "per_target": [float(v) for v in out["per_target"]]}
    cf["wall_s"] = time.perf_counter() - t0
    return cf, lds_out


def _train_predictions(trainer, tail):
    import torch

    from ttt_pipeline.evaluation.attribution_check import _pad

    rows = [int(r) for r in trainer.train_cache.order]
    preds = [0] * len(rows)
    with torch.no_grad():
        for s in range(0, len(rows), 64):
            h, am = _pad(trainer.train_cache.hidden, rows[s:s + 64])
            for r, p in zip(rows[s:s + 64], tail(h, am).argmax(-1).tolist()):
                preds[r] = p
    return preds


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    from ttt_pipeline import steps
    from ttt_pipeline.config import load_config
    from ttt_pipeline.storage import StepStore

    cfg = load_config(args.config, [f"data.path={args.data}", "attribution.enabled=true",
                                    f"ttt.methods=[{args.methods}]", *args.set])
    store, data, model, corrupted, evaluation = pipeline_outputs(cfg, args.entry)
    load_before = os.getloadavg()
    log(f"attribute step: params {cfg.attribution.params}, up to {cfg.attribution.max_train} training reviews, "
        f"{cfg.attribution.max_targets} targets, {args.threads} threads")
    with tempfile.TemporaryDirectory(prefix="bench-attr-") as tmp:
        step_store = store if args.reuse_step else StepStore(tmp)
        out = steps.attribute(cfg, data, model, corrupted, [evaluation], step_store)
        result = steps.load_attribution(out)
    log(f"attribute step: {out.meta['wall_s']:.0f} s ({'cached' if out.cached else 'fresh'}), "
        f"{result['n_targets']} targets")
    cf, lds_out = (counterfactual(args, cfg, data, model, corrupted, evaluation) if args.cf_targets > 0
                   else (None, None))
    summary = {"wall_s": round(out.meta["wall_s"], 1), "n_train": result["n_train"], "n_targets": result["n_targets"],
               "cpu_s": round(out.meta.get("cpu_s", float("nan")), 1),
               "counterfactual": cf, "lds": lds_out["lds"] if lds_out else None, "lds_detail": lds_out,
               "step": {"cached": out.cached, "params": result["params"], "proj_dim": result["proj_dim"],
                        "grad_dim": result["grad_dim"], "n_models": result["n_models"],
                        "projector": result["projector"], "timings": result["timings"],
                        "reasons": {r: sum(r in t["reasons"] for t in result["targets"])
                                    for r in ("flip", "fixed", "broke")}},
               "threads": args.threads, "data": str(args.data), "methods": args.methods,
               "load_avg": {"before": [round(x, 1) for x in load_before],
                            "after": [round(x, 1) for x in os.getloadavg()], "cpus": os.cpu_count()}}
    if cf:
        print(f"counterfactual (k={cf['k']}, {cf['n_targets']} targets, {cf['params']}): margin drop top-k "
              f"{cf['margin_drop_topk']:+.3f} vs random {cf['margin_drop_random']:+.3f}; delta {cf['delta']:+.3f} "
              f"[{cf['ci_low']:+.3f}, {cf['ci_high']:+.3f}]"
              + (f"; LDS {summary['lds']:.3f}" if summary["lds"] is not None else ""))
    sys.stdout.flush()
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
