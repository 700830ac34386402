"""Accuracy and training-speed benchmark: the torch-ttt BERT tutorial's recipe vs our pipeline, same run.

Data: MDSD electronics (../shared/data/mdsd), 4-class star rating (1,2,4,5 -> 0..3), shuffled with seed 42, 80/20
split; kitchen and books (400 each, same shuffle) for real domain shift. Encoder: bench/common.py's MODEL (MiniLM-L6,
no MLM head: both sides train one first; the JSON's "model"), CPU.

- tutorial: fixed padding to 128, the tutorial's model (MLM head on every position in every forward), its loop
  (WeightedRandomSampler, class-weighted CE, AdamW 1e-4, linear schedule), a 50-step head-only MLM warm-up, and
  torch-ttt 0.0.2's MaskedTTTEngine at the tutorial settings (mask 0.1, 1 step, Adam 3e-5, PAD/CLS/SEP skipped);
  its masks come from torch's global RNG: one draw per training seed.
- ours: `ttt_pipeline.modeling.train.finetune` in each alignment mode (dynamic padding, length-grouped batches,
  plateau-stopped MLM warm-up), scored with our engine under `--mask-seeds N` (3) mask seeds. With `--select-ttt`
  each model's TTT settings are chosen among `--ttt` and `--ttt-alternatives` on `--selection-size` corrupted
  kitchen and books reviews that are never scored. Both sides train as many epochs on the same rows; ours with
  `--finetune joint_passes=1 precision=auto mlm_weight=0.5 weighted_sampler=false` and `--model pooling=cls`.

Intervals (ttt_pipeline.evaluation.stats.paired_difference): every recipe's summary carries `ttt_gain` (corrupted
test set), `ttt_clean_change`, `ttt_shift_change` (per domain) and `corruption_drop`, each {delta, ci_low, ci_high,
p_mcnemar, helped, hurt, significant, n, mask_seeds}: each review's correctness averaged over its training and mask
seeds, a paired percentile bootstrap over reviews (2000 resamples, 95%), `significant` when it excludes 0;
`per_seed` entries carry the same for one trained model. Differences are fractions (0.05 = 5 points).

`.venv/bin/python -m bench.accuracy --json` (all three modes: hours on 2 cores), `--modes joint` or `--quick`; prints a
table, and with --json the last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench import REPO
from bench.common import (
    DIFF_FIELDS,
    MODEL,
    SHIFT,
    build_model,
    load_domain,
    log,
    scoring_amp,
    seed_all,
    skipped_without_mdsd,
    train_classifier,
)
from ttt_pipeline.evaluation.stats import format_difference, paired_difference
from ttt_pipeline.metrics import recovered_fraction
from ttt_pipeline.modeling.precision import machine_summary


# ----------------------------------------------------------------------------------------- tutorial recipe
class TutorialClassifier(nn.Module):
    """The tutorial's BertForClassification: ELU head on [CLS]; the MLM head runs on every forward."""

    def __init__(self, bert, mlm_head, num_classes: int, weights: torch.Tensor):
        super().__init__()
        self.bert = bert
        self.dropout = nn.Dropout(0.0)
        self.mlm_head = mlm_head
        self.classifier = nn.Sequential(nn.Linear(bert.config.hidden_size, 128), nn.ELU(), nn.Linear(128, 64),
                                        nn.ELU(), nn.Linear(64, num_classes))
        self.register_buffer("weights", weights)

    def forward(self, input_ids, attention_mask, labels=None):
        out = self.bert(input_ids=input_ids, attention_mask=attention_mask, return_dict=True)
        logits = self.classifier(self.dropout(out.last_hidden_state[:, 0, :]))
        self.mlm_head(out.last_hidden_state)  # computed and discarded, as in the tutorial (torch-ttt hooks it)
        loss = F.cross_entropy(logits, labels, weight=self.weights) if labels is not None else None
        return logits, loss


def tutorial_train(seed: int, texts: list[str], labels: list[int], num_classes: int, epochs: int,
                   warmup_steps: int, device: str = "cpu") -> tuple:
    """The tutorial's training on one seed: (model, tokenizer, collate, figures). Padding to 128 tokens, the MLM
    head on every forward, AdamW 1e-4, linear schedule, weighted sampler, as torch-ttt's notebook does."""
    from torch.utils.data import DataLoader, WeightedRandomSampler
    from transformers import get_scheduler

    from ttt_pipeline.modeling.model import load_pretrained

    seed_all(seed)
    mlm, tok, _ = load_pretrained(MODEL)
    counts = np.bincount(labels, minlength=num_classes)
    inv = 1.0 / np.maximum(counts, 1)
    weights = torch.tensor(inv / inv.sum(), dtype=torch.float32)
    model = TutorialClassifier(mlm.bert, mlm.cls, num_classes, weights).to(device)

    def collate(batch):  # on `device`: the tutorial moves each batch to its device
        enc = tok([b[0] for b in batch], padding="max_length", truncation=True, max_length=128, return_tensors="pt")
        return enc["input_ids"].to(device), enc["attention_mask"].to(device), torch.tensor([b[1] for b in batch],
                                                                                          device=device)

    rows = list(zip(texts, labels))
    gen = torch.Generator().manual_seed(seed)
    special = [tok.pad_token_id, tok.cls_token_id, tok.sep_token_id]
    model.eval()
    warm_s, warm_losses = _tutorial_warmup(mlm, tok, rows, collate, gen, special, warmup_steps)
    sampler = WeightedRandomSampler(torch.tensor(inv[labels], dtype=torch.double), len(labels), replacement=True,
                                    generator=gen)
    loader = DataLoader(rows, batch_size=32, sampler=sampler, collate_fn=collate)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    total = len(loader) * epochs
    sched = get_scheduler("linear", optimizer=opt, num_warmup_steps=int(0.1 * total), num_training_steps=total)
    model.train()
    t0 = time.perf_counter()
    for epoch in range(epochs):
        for ids, am, y in loader:
            _, loss = model(ids, am, y)
            loss.backward()
            opt.step()
            sched.step()
            opt.zero_grad()
        log(f"[tutorial seed {seed}] epoch {epoch + 1}/{epochs} loss {loss.item():.3f}")
    train_s = time.perf_counter() - t0
    model.eval()
    res = {"train_samples_per_s": len(labels) * epochs / train_s, "train_s": train_s, "mlm_warmup_s": warm_s,
           "mlm_warmup_final_loss": float(np.mean(warm_losses[-10:])) if warm_losses else None}
    return model, tok, collate, res


def _tutorial_warmup(mlm, tok, rows, collate, gen, special, steps: int) -> tuple[float, list[float]]:
    """Head-only MLM warm-up: the encoder ships without a head (measurements.md: 50 steps, lr 1e-3)."""
    head_opt = torch.optim.AdamW(mlm.cls.parameters(), lr=1e-3)
    t0 = time.perf_counter()
    losses = []
    for _ in range(steps):
        idx = torch.randint(len(rows), (32,), generator=gen).tolist()
        ids, am, _ = collate([rows[i] for i in idx])
        mask = ((torch.rand(ids.shape, generator=gen) < 0.15).to(ids.device)
                & ~torch.isin(ids, torch.tensor(special, device=ids.device)))
        with torch.no_grad():
            hidden = mlm.bert(input_ids=ids.masked_fill(mask, tok.mask_token_id), attention_mask=am).last_hidden_state
        loss = F.cross_entropy(mlm.cls(hidden)[mask], ids[mask])
        head_opt.zero_grad()
        loss.backward()
        head_opt.step()
        losses.append(loss.item())
    return time.perf_counter() - t0, losses


def tutorial_run(seed: int, data: dict, epochs: int, warmup_steps: int, ttt_sets: list[str]) -> tuple[dict, dict]:
    """The tutorial recipe on one training seed: (figures, per-review correctness; see `score_sets`)."""
    from bench import _torch_ttt_shim as shim

    model, tok, collate, res = tutorial_train(seed, *data["train"], 4, epochs, warmup_steps)
    special = [tok.pad_token_id, tok.cls_token_id, tok.sep_token_id]

    def plain(texts_):
        preds = []
        with torch.no_grad():
            for i in range(0, len(texts_), 32):
                ids, am, _ = collate([(t, 0) for t in texts_[i:i + 32]])
                preds += model(ids, am)[0].argmax(-1).tolist()
        return preds

    Engine = shim.masked_ttt_engine_class()
    engine = Engine(model, mask_token_id=tok.mask_token_id, features_layer_name="mlm_head", mask_prob=0.1,
                    skip_tokens=special,
                    optimization_parameters={"optimizer_name": "adam", "num_steps": 1, "lr": 3e-5})
    engine.eval()

    def ttt(texts_):
        torch.manual_seed(seed)  # torch-ttt draws its masks from the global RNG: one draw per set
        preds = []
        for i in range(0, len(texts_), 32):
            ids, am, _ = collate([(t, 0) for t in texts_[i:i + 32]])
            out, _ = engine({"input_ids": ids, "attention_mask": am})
            preds += out[0].argmax(-1).tolist()  # the model returns (logits, loss)
        return preds

    scores, right = score_sets(data, plain, [ttt], ttt_sets)
    return res | scores, right


# ------------------------------------------------------------------------------------------ our pipeline
def ours_run(seed: int, mode: str, data: dict, epochs: int, ttt_overrides: dict, ttt_sets: list[str],
             warmup_max: int, ft_overrides: dict, alternatives: dict[str, dict] | None = None,
             model_overrides: dict | None = None, unlabeled: list[str] | None = None,
             select_ttt: bool = False, mask_seeds: list[int] | tuple[int, ...] = (0,)) -> tuple[dict, dict]:
    """Our recipe on one training seed: (figures, per-review correctness; see `score_sets`). TTT (the default,
    each alternative, each selection candidate) is scored once per mask seed (TTTConfig seed)."""
    from ttt_pipeline.config import TTTConfig
    from ttt_pipeline.defenses.registry import build_engine
    from ttt_pipeline.evaluation.scoring import predict

    model, tok = build_model(seed, **({"max_length": 128} | (model_overrides or {})))
    texts, labels = data["train"]
    work = REPO / ".cache" / "bench-accuracy" / f"{mode}-{seed}-{os.getpid()}"
    ft = {"mlm_warmup_max_steps": warmup_max} | ft_overrides | {
        "epochs": epochs, "alignment": mode, "seed": seed, "early_stopping_patience": 0}
    result, t_finetune = train_classifier(model, tok, texts, labels, ft, work, 128,
                                          unlabeled if mode == "dapt" else None)

    def plain(texts_):
        return predict(model, tok, texts_, 128, 32).argmax(-1).tolist()

    def ttt_with(overrides: dict) -> list:
        """One predictor per mask seed: the settings with TTTConfig seed k, k in mask_seeds."""
        def at(k: int):
            cfg_ = TTTConfig(**(overrides | {"seed": k, "signal_every": 0}))  # no probes: the served speed

            def ttt(texts_):
                engine = build_engine("masked_ttt", model, tok, cfg_, scoring_amp(model, cfg_.precision))
                return predict(model, tok, texts_, 128, cfg_.batch_size, engine).argmax(-1).tolist()
            return ttt
        return [at(k) for k in mask_seeds]

    train_s = sum(r["epoch_s"] for r in result.history)
    res = {"train_samples_per_s": len(labels) * epochs / train_s, "train_s": train_s,
           "mlm_warmup_steps": len(result.warmup_curve),
           "mlm_warmup_final_loss": float(np.mean(result.warmup_curve[-10:])) if result.warmup_curve else None,
           "final_train_mlm_loss": result.history[-1].get("train_mlm_loss"),
           "dapt_steps": len(result.dapt_curve),
           "dapt_final_loss": float(np.mean(result.dapt_curve[-10:])) if result.dapt_curve else None,
           "finetune_total_s": t_finetune}
    if not select_ttt:
        scores, right = score_sets(data, plain, ttt_with(ttt_overrides), ttt_sets)
        res |= scores
        # other TTT settings on the same trained model (no retraining): a cheap way to compare engines' settings
        res["ttt_alternatives"], right["alternatives"] = {}, {}
        for name, alt in (alternatives or {}).items():
            res["ttt_alternatives"][name], right["alternatives"][name] = score_ttt(
                data, ttt_with(ttt_overrides | alt), ttt_sets, res)
        return res, right
    # TTT settings chosen per trained model on the held-out selection set (never the scored sets): the
    # candidates are the default (`--ttt`) and each alternative; the reported TTT figures are the chosen one's,
    # the default's stay under ttt_alternatives["default"]
    candidates = {"default": ttt_overrides} | {name: ttt_overrides | alt for name, alt in (alternatives or {}).items()}
    sel_texts, sel_labels = data["selection"]
    res["acc_selection"] = acc(plain(sel_texts), sel_labels)
    res["selection_ttt"] = {name: float(np.mean([acc(t(sel_texts), sel_labels) for t in ttt_with(c)]))
                            for name, c in candidates.items()}  # mean over mask seeds
    chosen = max(candidates, key=lambda n: res["selection_ttt"][n])  # ties: the earlier (default first)
    res["ttt_selected"] = chosen
    scores, right = score_plain(data, plain)
    res |= scores
    chosen_scores, right["ttt"] = score_ttt(data, ttt_with(candidates[chosen]), ttt_sets, res)
    res |= chosen_scores
    default = (chosen_scores, right["ttt"]) if chosen == "default" else score_ttt(data, ttt_with(ttt_overrides),
                                                                                   ttt_sets, res)
    res["ttt_alternatives"], right["alternatives"] = {"default": default[0]}, {"default": default[1]}
    return res, right


# ------------------------------------------------------------------------------------------------ scoring
def correct(preds, ys) -> np.ndarray:
    """0/1 per review."""
    return (np.asarray(preds) == np.asarray(ys)).astype(float)


def acc(preds, ys) -> float:
    return float(correct(preds, ys).mean())


# per-review correctness of one trained model (never printed): {"plain": {set: (reviews,)}, "ttt": {set: (reviews,
# mask seeds)}, "alternatives": {name: {set: (reviews, mask seeds)}}}; sets: clean, corrupted, kitchen, books
def score_plain(data: dict, plain) -> tuple[dict, dict]:
    out, right = {}, {}
    t0 = time.perf_counter()
    for name, key in (("clean", "test"), ("corrupted", "corrupted")) + tuple((d, d) for d in SHIFT):
        right[name] = correct(plain(data[key][0]), data[key][1])
    out["acc_clean"] = float(right["clean"].mean())
    out["acc_corrupted"] = float(right["corrupted"].mean())
    shift = [float(right[d].mean()) for d in SHIFT]
    out["acc_shift"] = float(np.mean(shift))
    out["acc_shift_by_domain"] = dict(zip(SHIFT, shift))
    out["eval_s"] = time.perf_counter() - t0
    return out, {"plain": right}


def score_sets(data: dict, plain, ttts: list, ttt_sets: list[str]) -> tuple[dict, dict]:
    out, right = score_plain(data, plain)
    scores, right["ttt"] = score_ttt(data, ttts, ttt_sets, out)
    return out | scores, right


def score_ttt(data: dict, ttts: list, ttt_sets: list[str], plain_scores: dict) -> tuple[dict, dict]:
    """TTT accuracies (means over the draws: one predictor per mask seed) and the recovered fraction, given the
    plain accuracies of the same model; with the per-review correctness, reviews x draws per set."""
    right = {}
    t0 = time.perf_counter()

    def score(name: str, key: str) -> float:
        texts_, ys = data[key]
        right[name] = np.stack([correct(t(texts_), ys) for t in ttts], axis=1)
        return float(right[name].mean())  # equal-sized draws: the mean of the per-draw accuracies

    out = {"acc_ttt": score("corrupted", "corrupted")}
    out["acc_ttt_by_mask_seed"] = [float(v) for v in right["corrupted"].mean(0)]
    n_ttt = len(data["corrupted"][0])
    if "clean" in ttt_sets:
        out["acc_clean_ttt"] = score("clean", "test")
        n_ttt += len(data["test"][0])
    if "shift" in ttt_sets:
        shift_ttt = [score(d, d) for d in SHIFT]
        out["acc_shift_ttt"] = float(np.mean(shift_ttt))
        out["acc_shift_ttt_by_domain"] = dict(zip(SHIFT, shift_ttt))
        n_ttt += sum(len(data[d][0]) for d in SHIFT)
    out["ttt_samples_per_s"] = n_ttt * len(ttts) / (time.perf_counter() - t0)
    out["recovered_fraction"] = recovered_fraction(plain_scores["acc_clean"], plain_scores["acc_corrupted"],
                                                   out["acc_ttt"])
    return out, right


# ---------------------------------------------------------------------------------------------- intervals
def difference(a: np.ndarray, b: np.ndarray, **extra) -> dict:
    """b minus a on the same reviews (reviews x draws each), from ttt_pipeline.evaluation.stats.paired_difference."""
    d = paired_difference(a, b).to_dict()
    return {k: d[k] for k in DIFF_FIELDS} | extra


def pooled(parts: list[dict], name: str) -> np.ndarray:
    """reviews x (training seeds x draws) of set `name`: one model's draws after another (same reviews)."""
    return np.concatenate([np.asarray(p[name], dtype=float).reshape(len(p[name]), -1) for p in parts], axis=1)


def ttt_intervals(plain: list[dict], ttt: list[dict], mask_seeds: list[int] | None) -> dict:
    """ttt_gain (corrupted), ttt_clean_change (clean), ttt_shift_change (domain -> object): TTT against no
    adaptation on the same reviews, pooled over the trained models (their plain and TTT correctness, in order)."""
    def diff(name: str) -> dict:
        return difference(pooled(plain, name), pooled(ttt, name), mask_seeds=mask_seeds)

    out = {"ttt_gain": diff("corrupted")}
    if "clean" in ttt[0]:
        out["ttt_clean_change"] = diff("clean")
    shift = {d: diff(d) for d in SHIFT if d in ttt[0]}
    if shift:
        out["ttt_shift_change"] = shift
    return out


def intervals(rights: list[dict], mask_seeds: list[int] | None) -> dict:
    """A recipe's paired objects over its trained models `rights` (see score_plain): corruption_drop, the TTT
    objects, and each alternative's TTT objects under "ttt_alternatives"."""
    plain = [r["plain"] for r in rights]
    out = {"corruption_drop": difference(pooled(plain, "corrupted"), pooled(plain, "clean"))}
    out |= ttt_intervals(plain, [r["ttt"] for r in rights], mask_seeds)
    alts = rights[0].get("alternatives") or {}
    if alts:
        out["ttt_alternatives"] = {name: ttt_intervals(plain, [r["alternatives"][name] for r in rights], mask_seeds)
                                   for name in alts}
    return out


def attach(summary: dict, objs: dict) -> dict:
    """Put `intervals` output into a run or a recipe summary (alternatives into their own entries)."""
    alts = objs.pop("ttt_alternatives", {})
    summary.update(objs)
    for name, v in alts.items():
        summary["ttt_alternatives"][name].update(v)
    return summary


def mean_over(runs: list[dict]) -> dict:
    # a figure undefined on a seed (None: no corruption drop to recover) is left out of that figure's mean, and the
    # key stays, as null, when no seed defines it (the JSON contract names it)
    keys = [k for k in runs[0] if all(isinstance(r.get(k), (int, float, type(None))) for r in runs)]
    out = {}
    for k in keys:
        vals = [r[k] for r in runs if r.get(k) is not None]
        out[k] = float(np.mean(vals)) if vals else None
    alts = runs[0].get("ttt_alternatives") or {}
    if alts:
        out["ttt_alternatives"] = {name: mean_over([r["ttt_alternatives"][name] for r in runs]) for name in alts}
        for v in out["ttt_alternatives"].values():
            v.pop("per_seed")
    sel = runs[0].get("selection_ttt") or {}
    if sel:
        out["selection_ttt"] = {name: float(np.mean([r["selection_ttt"][name] for r in runs])) for name in sel}
    out["per_seed"] = runs
    return out


def table(rows: dict[str, dict]) -> str:
    cols = ["train_samples_per_s", "acc_clean", "acc_corrupted", "acc_ttt", "recovered_fraction", "acc_clean_ttt",
            "acc_shift", "acc_shift_ttt"]
    label = {"train_samples_per_s": "train samples/s", "recovered_fraction": "recovered"}
    head = (f"{'recipe':<16}" + "".join(f"{label.get(c, c.replace('acc_', '')):>16}" for c in cols)
            + "  ttt gain, points [95% CI]")
    lines = [head, "-" * len(head)]

    def line(name: str, r: dict) -> str:
        gain = format_difference(r["ttt_gain"]) if r.get("ttt_gain") else "-"
        return (f"{name:<16}" + "".join(f"{r.get(c) if r.get(c) is not None else float('nan'):>16.3f}" for c in cols)
                + f"  {gain}")

    for name, r in rows.items():
        lines.append(line(name, r))
        lines += [line(f"  ttt {alt}"[:16], a) for alt, a in (r.get("ttt_alternatives") or {}).items()]
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true")
    p.add_argument("--quick", action="store_true", help="tiny subset, 1 epoch, 1 seed: a smoke run for tests")
    p.add_argument("--seeds", type=int, nargs="+", default=[42, 43, 44])
    p.add_argument("--modes", nargs="+", default=["frozen", "joint", "dapt"])
    p.add_argument("--default-mode", default="joint",
                   help="the mode reported as `ours` (joint: the best measured, see README)")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--train-size", type=int, default=1600)
    p.add_argument("--test-size", type=int, default=400)
    p.add_argument("--shift-size", type=int, default=400)
    p.add_argument("--ttt", nargs="*", default=[], metavar="KEY=VALUE", help="our TTT settings (TTTConfig fields)")
    p.add_argument("--finetune", nargs="*",
                   default=["joint_passes=1", "precision=auto", "mlm_weight=0.5", "weighted_sampler=false"],
                   metavar="KEY=VALUE",
                   help="our fine-tuning settings (FinetuneConfig fields; epochs/alignment/seed come from the bench). "
                        "Default: the best measured (one joint pass, the machine's precision: bf16 where native; "
                        "MLM weight 0.5; imbalance handled by the class-weighted loss alone, no weighted sampler). "
                        "Pass `--finetune` alone for the library defaults.")
    p.add_argument("--model", nargs="*", default=["pooling=cls"], metavar="KEY=VALUE",
                   help="our model settings (ModelConfig fields; the encoder is common.MODEL: the offline MiniLM "
                        "unless TTT_BENCH_MODEL names another). "
                        "Default: [CLS] pooling, as the tutorial (the best measured row uses it; mean pooling was "
                        "not run with these fine-tuning settings); `--model` alone for the library defaults.")
    p.add_argument("--ttt-alternatives", nargs="*", default=[], metavar="K=V[,K=V]",
                   help="more TTT settings scored on each of our trained models (reported per seed and averaged)")
    p.add_argument("--ttt-sets", nargs="*", default=["clean", "shift"], help="also score TTT on clean / shift")
    p.add_argument("--mask-seeds", type=int, default=3, metavar="N",
                   help="score our masked TTT under TTTConfig seed 0..N-1 on each trained model (accuracies are means "
                        "over them; intervals pool them); the tutorial engine stays one global-RNG draw")
    p.add_argument("--unlabeled-per-domain", type=int, default=0, metavar="N",
                   help="dapt mode: also MLM-train on N unlabeled kitchen and N books reviews taken after the shift "
                        "test rows (never the scored ones)")
    p.add_argument("--selection-size", type=int, default=0, metavar="N",
                   help="N corrupted kitchen and N corrupted books reviews, taken after the shift and unlabeled rows "
                        "(never scored): the held-out set of --select-ttt")
    p.add_argument("--select-ttt", action="store_true",
                   help="per trained model, choose the TTT settings among --ttt and --ttt-alternatives by accuracy on "
                        "the corrupted selection set, and report the chosen one's figures")
    p.add_argument("--skip-tutorial", action="store_true")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = p.parse_args()
    if args.select_ttt and args.selection_size <= 0:
        p.error("--select-ttt needs --selection-size N > 0 (the held-out set it chooses on)")
    if args.mask_seeds < 1:
        p.error("--mask-seeds needs N >= 1")
    return args


def corrupt(texts: list[str]) -> list[str]:
    """The tutorial composite, seed 42: every corrupted set alike."""
    from ttt_pipeline.corruption import tutorial_corrupt

    return list(tutorial_corrupt(texts, 0.1, 0.1, seed=42).texts)


def load_data(args) -> tuple[dict, list[str]]:
    """({"train", "test", "corrupted", "kitchen", "books"[, "selection"]: (texts, labels)}, unlabeled texts): the
    splits of the module doc."""
    texts, labels = load_domain("electronics")
    n_train = min(args.train_size, int(0.8 * len(texts)))
    test_texts, test_labels = texts[int(0.8 * len(texts)):][:args.test_size], labels[int(0.8 * len(texts)):][:args.test_size]
    data = {"train": (texts[:n_train], labels[:n_train]), "test": (test_texts, test_labels),
            "corrupted": (corrupt(test_texts), test_labels)}
    unlabeled, sel_texts, sel_labels = [], [], []
    for d in ("kitchen", "books"):
        t, y = load_domain(d)
        data[d] = (t[:args.shift_size], y[:args.shift_size])
        unlabeled += t[args.shift_size:args.shift_size + args.unlabeled_per_domain]
        start = args.shift_size + args.unlabeled_per_domain
        sel_texts += t[start:start + args.selection_size]
        sel_labels += y[start:start + args.selection_size]
    if sel_texts:
        data["selection"] = (corrupt(sel_texts), sel_labels)
    return data, unlabeled


def recipe(name: str, run_seed, seeds: list[int], seeds_of_masks: list[int] | None) -> dict:
    """Every training seed of one recipe, then the means and the intervals pooled over the seeds."""
    runs, rights = [], []
    for s in seeds:
        log(f"[bench] {name} seed {s}")
        run, right = run_seed(s)
        attach(run, intervals([right], seeds_of_masks))  # this trained model alone
        runs.append(run)
        rights.append(right)
        log(f"[bench] {name} seed {s}: {json.dumps(run, default=float)}")
    return attach(mean_over(runs), intervals(rights, seeds_of_masks))


def run_recipes(args, data: dict, unlabeled: list[str], ov: dict, mask_seeds: list[int]) -> dict[str, dict]:
    """The tutorial (unless --skip-tutorial) and ours in each mode, every training seed; `ov`: the parsed
    --ttt, --finetune, --model and --ttt-alternatives."""
    warmup_tut = 50 if not args.quick else 1  # quick: one step runs the path (each costs a full-vocabulary head)
    warmup_ours = 400 if not args.quick else 10
    results: dict[str, dict] = {}
    if not args.skip_tutorial:
        results["tutorial"] = recipe("tutorial", lambda s: tutorial_run(s, data, args.epochs, warmup_tut,
                                                                        args.ttt_sets), args.seeds, None)
    for mode in args.modes:
        results[f"ours/{mode}"] = recipe(f"ours/{mode}", lambda s, mode=mode: ours_run(
            s, mode, data, args.epochs, ov["ttt"], args.ttt_sets, warmup_ours, ov["finetune"], ov["alternatives"],
            ov["model"], unlabeled, args.select_ttt, mask_seeds), args.seeds, mask_seeds)
    return results


def summary_of(args, results: dict[str, dict], data: dict, unlabeled: list[str], ov: dict, mask_seeds: list[int],
               t_all: float) -> dict:
    """The JSON object (the module doc)."""
    ours = results.get(f"ours/{args.default_mode}", {})
    tut = results.get("tutorial", {})
    return {
        "model": MODEL,  # the encoder both recipes ran on (TTT_BENCH_MODEL, else MiniLM: bench/common.py)
        "tutorial": {k: v for k, v in tut.items()},
        "ours": {k: v for k, v in ours.items()},
        "ours_mode": args.default_mode,
        "modes": {k: {kk: vv for kk, vv in v.items() if kk != "per_seed"} for k, v in results.items()},
        "train_speedup": (ours["train_samples_per_s"] / tut["train_samples_per_s"]) if tut and ours else None,
        "ttt_selected_per_seed": [r.get("ttt_selected") for r in ours.get("per_seed", [])] if args.select_ttt else None,
        "settings": {"seeds": args.seeds, "epochs": args.epochs, "train": len(data["train"][0]),
                     "test": len(data["test"][0]), "shift_per_domain": args.shift_size, "ttt": ov["ttt"],
                     "finetune": ov["finetune"], "model": ov["model"], "threads": args.threads, "quick": args.quick,
                     "unlabeled_texts": len(unlabeled), "selection_texts": len(data.get("selection", ([], []))[0]),
                     "select_ttt": args.select_ttt, "ttt_alternatives": ov["alternatives"], "mask_seeds": mask_seeds},
        "wall_s": time.perf_counter() - t_all, "machine": machine_summary(),
    }


def main() -> None:
    args = parse_args()
    mask_seeds = list(range(args.mask_seeds))
    if skipped_without_mdsd():
        return
    if args.quick:
        args.seeds, args.epochs, args.train_size, args.test_size, args.shift_size = args.seeds[:1], 1, 64, 32, 32
        args.modes = [args.default_mode]
        args.selection_size = min(args.selection_size, 16)
    torch.set_num_threads(args.threads)
    import logging

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from ttt_pipeline.config import apply_overrides

    ov = {"ttt": apply_overrides({}, args.ttt), "finetune": apply_overrides({}, args.finetune),
          "model": apply_overrides({}, args.model),
          "alternatives": {alt: apply_overrides({}, alt.split(",")) for alt in args.ttt_alternatives}}
    data, unlabeled = load_data(args)
    t_all = time.perf_counter()
    results = run_recipes(args, data, unlabeled, ov, mask_seeds)
    print(table(results))
    print(json.dumps(summary_of(args, results, data, unlabeled, ov, mask_seeds, t_all), default=float))

if __name__ == "__main__":
    main()
