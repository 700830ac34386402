"""Masked TTT against its no-gradient control and none, at several MLM-head qualities and in both fine-tuning modes.

The question: can masked test-time training pay on this model, and what head quality would it take? TTT's gains
follow how well the self-supervised gradient aligns with the task's (Sun et al. 2020), so every configuration reports
the signal beside the accuracy: `perplexity` / `mlm_top1` of the MLM head on the clean test reviews (and
`perplexity_corrupted`), fixed 15% masks; `heldout_change`, masked TTT's MLM loss on masks it did not step on, after
minus before; `grad_cosine`, per corrupted test batch the cosine between the MLM and the classification gradients
over the parameters TTT adapts, and `grad_cosine_vs_gain`, its Spearman correlation with the batch's accuracy change.

Head qualities (`--heads`), each on top of bench/defenses.py's recipe: `weak` (warm-up cut at `--weak-steps`),
`warmup` (to its plateau, capped at `--warmup-steps`: the pipeline's default), `dapt` (then `--dapt-epochs` of
full-body domain-adaptive MLM). No package this machine's index reaches ships a pretrained MLM head that fits, so
there is no `pretrained` row. Modes (`--modes`): `full` and `frozen_encoder`. Data as bench/defenses.py: clean, the
tutorial composite at severity 3 (`--test-seed`), kitchen and books. TTT settings per model: the `--ttt-candidates`
entry with the best masked_ttt accuracy on the corrupted validation reviews (`--val-seed`, mask seed 0). Differences
are paired per review, pooled over training and mask seeds. Where CUDA is present the models train and score there.

Selection rule for the aim (fixed before any full run): the (head, mode) with the largest `val_margin`, masked TTT's
validation accuracy minus the better of none and mask_ensemble (corrupted validation reviews, mask seed 0, mean over
training seeds), decides by its test row; `chosen` names it.

`--json`: the last stdout line holds the rows (signal figures, ttt_vs_none, ttt_vs_control, control_vs_none,
shift_ttt_vs_none, ttt_settings), dose_response (Spearman of ttt_vs_control against perplexity and grad_cosine), the
model and the machine. `--quick`: a smoke run on a few reviews (tests).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import torch

from bench.common import MODEL, log, model_device, scoring_amp, skipped_without_mdsd
from bench.defenses import (  # (one data recipe for both benches)
    Scorer,
    add_data_arguments,
    build_data,
    choose_ttt,
    diff,
    train_model,
)

HEADS = {"weak": lambda a: {"mlm_warmup_max_steps": a.weak_steps},
         "warmup": lambda a: {"mlm_warmup_max_steps": a.warmup_steps},
         "dapt": lambda a: {"mlm_warmup_max_steps": a.warmup_steps, "alignment": "dapt",
                            "dapt_epochs": a.dapt_epochs}}
METHODS = ("none", "mask_ensemble", "masked_ttt")


def score(model, tok, method: str, texts, labels, settings, args) -> tuple[np.ndarray, list]:
    """(0/1 correctness per review, masked TTT's held-out (before, after) pairs)."""
    from ttt_pipeline.evaluation.scoring import score_texts

    logits, stats = score_texts(model, tok, texts, method, settings, args.max_length, args.batch_size,
                                model_device(model), amp=scoring_amp(model, settings.precision))
    return (logits.argmax(-1) == np.asarray(labels)).astype(float), stats.get("heldout", [])


def grad_cosines(model, tok, texts, labels, settings, args) -> list[float]:
    """Per test batch: cos(grad of TTT's first-step MLM loss, grad of the cross-entropy) over TTT's parameters."""
    import torch.nn.functional as F

    from ttt_pipeline.defenses.masked_ttt import MaskedTTT
    from ttt_pipeline.modeling.model import special_token_ids
    from ttt_pipeline.modeling.tokenize import encode_texts
    from ttt_pipeline.modeling.train import make_collate

    engine = MaskedTTT(model, tok.mask_token_id, special_token_ids(tok), settings)
    params, collate = engine.params, make_collate(tok)
    rows = [{"input_ids": ids} for ids in encode_texts(tok, list(texts), args.max_length)["input_ids"]]
    out = []
    model.eval()
    for i in range(0, len(rows), args.batch_size):
        b = collate(rows[i:i + args.batch_size])
        ids, am = b["input_ids"].to(engine.device), b["attention_mask"].to(engine.device)
        y = torch.as_tensor(labels[i:i + args.batch_size], device=engine.device)
        ctx = engine.prepare(ids, am, 0)
        if ctx is None:
            continue
        g_mlm = torch.autograd.grad(engine.chunk_loss(ids, am, torch.arange(len(ids), device=ids.device), ctx), params,
                                    allow_unused=True)
        g_ce = torch.autograd.grad(F.cross_entropy(model(ids, am).float(), y), params, allow_unused=True)
        flat = [torch.cat([(g if g is not None else torch.zeros_like(p)).flatten() for g, p in zip(gs, params)])
                for gs in (g_mlm, g_ce)]
        out.append(float(F.cosine_similarity(flat[0], flat[1], dim=0)))
    engine.close()
    return out


def batch_gains(ttt: np.ndarray, none: np.ndarray, size: int) -> list[float]:
    """Accuracy change of each test batch (masked TTT minus none), in the order TTT saw the batches."""
    return [float(ttt[i:i + size].mean() - none[i:i + size].mean()) for i in range(0, len(none), size)]


def evaluate_model(model, tok, data: dict, args, store: dict) -> dict:
    """Choose the TTT settings on validation, then score the test sets; the signal figures of this model."""
    from ttt_pipeline.config import TTTConfig
    from ttt_pipeline.evaluation.signal import mlm_quality

    base = TTTConfig(batch_size=args.batch_size, signal_every=0)  # probes only where scored below
    val = {k: v for k, v in data["val_sets"].items() if k in ("clean", "tutorial-3")}
    name, vscores = choose_ttt(Scorer(args, []), model, tok, val, args.candidates)
    settings = base.model_copy(update=args.candidates[name])  # mask seed 0 (TTTConfig's), as choose_ttt scores
    val_acc = {"masked_ttt": vscores[name]} if vscores else {}  # choose_ttt has scored the chosen one already
    for m in METHODS:
        val_acc.setdefault(m, float(score(model, tok, m, *val["tutorial-3"], settings, args)[0].mean()))
    clean, bad = data["test_sets"]["clean"], data["test_sets"]["tutorial-3"]
    q = mlm_quality(model, tok, clean[0], args.max_length, args.batch_size, model_device(model))
    q_bad = mlm_quality(model, tok, bad[0], args.max_length, args.batch_size, model_device(model))
    pairs = []
    for method in METHODS:
        for seed in (args.mask_seeds if method != "none" else [None]):
            cfg = settings if seed is None else settings.model_copy(update={"seed": seed, "signal_every": 1})
            for s in ("tutorial-3", *data["shift"]):
                correct, held = score(model, tok, method, *data["test_sets"][s], cfg, args)
                store.setdefault((method, s), []).append(correct)
                pairs += held if s == "tutorial-3" else []
    cos = grad_cosines(model, tok, *bad, settings.model_copy(update={"seed": args.mask_seeds[0]}), args)
    gains = batch_gains(store[("masked_ttt", "tutorial-3")][-len(args.mask_seeds)],
                        store[("none", "tutorial-3")][-1], args.batch_size)
    return {"perplexity": q["mlm_perplexity"], "perplexity_corrupted": q_bad["mlm_perplexity"],
            "mlm_top1": q["mlm_top1"], "ttt_settings": name, "cosines": cos, "gains": gains, "val": val_acc,
            "heldout_change": float(np.mean([a - b for b, a in pairs])) if pairs else None}


def spearman(x: list[float], y: list[float]) -> float | None:
    from scipy.stats import spearmanr

    if len(x) < 3 or len(set(x)) < 2 or len(set(y)) < 2:
        return None
    return float(spearmanr(x, y).statistic)


def row(head: str, mode: str, store: dict, figures: list[dict], shift: list[str], kw: dict) -> dict:
    """One configuration pooled over its training seeds (and mask seeds): the table row of the docstring."""
    def mat(method: str, sets: list[str]) -> np.ndarray:
        return np.vstack([np.column_stack(store[(method, s)]) for s in sets])

    cos = [c for f in figures for c in f["cosines"]]
    gains = [g for f in figures for g in f["gains"]]
    out = {"head": head, "mode": mode, "seeds": len(figures),
           **{k: float(np.mean([f[k] for f in figures])) for k in ("perplexity", "perplexity_corrupted", "mlm_top1")},
           "heldout_change": (float(np.mean([f["heldout_change"] for f in figures]))
                              if all(f["heldout_change"] is not None for f in figures) else None),
           "ttt_vs_none": diff(mat("none", ["tutorial-3"]), mat("masked_ttt", ["tutorial-3"]), kw),
           "ttt_vs_control": diff(mat("mask_ensemble", ["tutorial-3"]), mat("masked_ttt", ["tutorial-3"]), kw),
           "control_vs_none": diff(mat("none", ["tutorial-3"]), mat("mask_ensemble", ["tutorial-3"]), kw),
           "grad_cosine": float(np.mean(cos)) if cos else None, "grad_cosine_vs_gain": spearman(cos, gains),
           "ttt_settings": sorted({f["ttt_settings"] for f in figures}),
           "val_margin": float(np.mean([min(f["val"]["masked_ttt"] - f["val"]["none"],
                                            f["val"]["masked_ttt"] - f["val"]["mask_ensemble"]) for f in figures]))}
    if shift:
        out["shift_ttt_vs_none"] = diff(mat("none", shift), mat("masked_ttt", shift), kw)
    return out


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true")
    p.add_argument("--quick", action="store_true", help="a few reviews, 1 epoch, 1 seed each: tests")
    p.add_argument("--heads", nargs="+", default=list(HEADS), choices=list(HEADS))
    p.add_argument("--modes", nargs="+", default=["full", "frozen_encoder"], choices=["full", "frozen_encoder"])
    add_data_arguments(p)
    p.add_argument("--weak-steps", type=int, default=20, help="MLM-head warm-up steps of the `weak` head")
    p.add_argument("--warmup-steps", type=int, default=400, help="cap of the warm-up to plateau")
    p.add_argument("--dapt-epochs", type=int, default=2)
    p.add_argument("--split-seed", type=int, default=42)
    p.add_argument("--test-seed", type=int, default=42)
    p.add_argument("--val-seed", type=int, default=7)
    p.add_argument("--ttt-candidates", nargs="+", default=["tutorial", "lr=1e-4", "mask_prob=0.15,lr=1e-4"],
                   metavar="K=V[,K=V]", help="TTT settings chosen on validation (`tutorial`: the ttt.* defaults)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--partial-json", help="after each training seed, write the report over the seeds done so far here")
    args = p.parse_args()
    if args.quick:
        args.seeds, args.mask_seeds, args.epochs = args.seeds[:1], args.mask_seeds[:1], 1
        args.train_size, args.val_size, args.test_size, args.shift_size = 40, 8, 16, 8
        args.weak_steps, args.warmup_steps, args.dapt_epochs, args.max_length, args.batch_size = 1, 3, 1, 48, 8
        args.ttt_candidates = args.ttt_candidates[:1]
    return args


def candidates(specs: list[str]) -> dict[str, dict]:
    """`tutorial` -> {}; `lr=1e-4,mask_prob=0.15` -> {"lr": 0.0001, "mask_prob": 0.15} (YAML values)."""
    import yaml

    from ttt_pipeline.config import TTTConfig

    out = {}
    for spec in specs:
        raw = {} if spec == "tutorial" else {k: yaml.safe_load(v) for k, v in (kv.split("=", 1)
                                                                            for kv in spec.split(","))}
        # validated and typed as the config does (YAML 1.1 reads `1e-4` as a string; model_copy would keep it)
        out[spec] = TTTConfig(**raw).model_dump(include=set(raw))
    return out


def main() -> None:
    args = parse_args()
    if skipped_without_mdsd():
        return
    torch.set_num_threads(args.threads)
    args.candidates = candidates(args.ttt_candidates)
    # bench/defenses.py's build_data: the grid's other families are built but never scored here
    args.char_family, args.word_family, args.val_seeds = "keyboard", "word_swap", [args.val_seed]
    args.test_families, args.external_families = [], []
    data = build_data(args)
    data["shift"] = ["kitchen", "books"] if args.shift_size else []
    kw = {"resamples": 2000, "confidence": 0.95, "seed": 0}
    t0, rows = time.perf_counter(), []
    for head in args.heads:
        for mode in args.modes:
            store: dict = {}
            figures = []
            for seed in args.seeds:
                model, tok, info = train_model(seed, data["train"], args, False, {**HEADS[head](args), "mode": mode})
                figures.append(evaluate_model(model, tok, data, args, store))
                log(f"[bench] {head}/{mode} seed {seed}: train {info['train_s']:.0f} s, perplexity "
                    f"{figures[-1]['perplexity']:.1f}")
                if args.partial_json:  # the rows over the seeds done so far: a run cut short keeps them
                    now = {**row(head, mode, store, figures, data["shift"], kw), "seeds_done": len(figures)}
                    out = report([*rows, now], args, time.perf_counter() - t0)
                    Path(args.partial_json).write_text(json.dumps(out, default=str))
            rows.append(row(head, mode, store, figures, data["shift"], kw))
            log(f"[bench] {head}/{mode}: ttt vs control {rows[-1]['ttt_vs_control']['delta'] * 100:+.2f} points")
    out = report(rows, args, time.perf_counter() - t0)
    for r in rows:
        t, c = r["ttt_vs_none"], r["ttt_vs_control"]
        log(f"{r['head']:>7} {r['mode']:>14}  ppl {r['perplexity']:8.1f}  cos {r['grad_cosine'] or 0:+.3f}  "
            f"ttt-none {t['delta'] * 100:+.2f} [{t['ci_low'] * 100:+.2f}, {t['ci_high'] * 100:+.2f}]  "
            f"ttt-control {c['delta'] * 100:+.2f} [{c['ci_low'] * 100:+.2f}, {c['ci_high'] * 100:+.2f}]")
    if args.json:
        print(json.dumps(out, default=str))


def report(rows: list[dict], args, wall: float) -> dict:
    best = max(rows, key=lambda r: r["val_margin"]) if rows else None  # the docstring's selection rule
    deltas = [r["ttt_vs_control"]["delta"] for r in rows]
    out = {"model": MODEL, "rows": rows, "wall_s": wall,  # model: the encoder (bench/common.py)
           "chosen": {k: best[k] for k in ("head", "mode", "val_margin")} if best else None,
           "dose_response": {"n_rows": len(rows),
                             "spearman_gain_vs_perplexity": spearman([r["perplexity"] for r in rows], deltas),
                             "spearman_gain_vs_cosine": spearman([r["grad_cosine"] or 0.0 for r in rows], deltas)},
           "settings": {k: v for k, v in vars(args).items() if k != "candidates"},
           "machine": {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "threads": args.threads,
                       "torch": torch.__version__, "cpu": platform.processor() or platform.machine(),
                       "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}}
    return out


if __name__ == "__main__":
    main()
