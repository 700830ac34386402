"""Scoring: every test set (clean, each corruption, each shifted domain) under every method (none, TTT, Tent).

Batches are formed in the texts' own order (never shuffled), so a per-batch TTT result is reproducible.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from ttt_pipeline.defenses.registry import headline_methods, method_tag
from ttt_pipeline.metrics import recovered_fraction, summarize
from ttt_pipeline.modeling.tokenize import encode_texts
from ttt_pipeline.modeling.train import make_collate


def predict(model, tokenizer, texts: list[str], max_length: int, batch_size: int, engine=None,
            device: torch.device | str = "cpu", progress: Callable[[int, int], None] | None = None,
            amp: torch.dtype | None = None) -> np.ndarray:
    """Class logits for texts; `engine` (TTT/Tent) adapts per unit and restores, else a plain forward, under
    autocast to `amp` when given (the run's scoring precision, `Runtime.score.dtype`, which the engines get too).

    The texts are one stream: the engine is closed when they are done, so an online engine's adapted weights
    never outlive the set they were adapted on (the next set, and plain scoring, see the source weights).
    """
    enc = encode_texts(tokenizer, texts, max_length)
    rows = [{"input_ids": ids} for ids in enc["input_ids"]]
    collate = make_collate(tokenizer)
    out = []
    model.eval()
    try:
        for i in range(0, len(rows), batch_size):
            b = collate(rows[i:i + batch_size])
            ids, am = b["input_ids"].to(device), b["attention_mask"].to(device)
            if engine is None:
                with torch.inference_mode(), torch.autocast(torch.device(device).type, dtype=amp,
                                                            enabled=amp is not None):
                    logits = model(ids, am)
            else:
                logits = engine.predict(ids, am)
            out.append(logits.float().cpu().numpy())
            if progress:
                progress(min(i + batch_size, len(rows)), len(rows))
    finally:
        if hasattr(engine, "close"):
            engine.close()
    return np.concatenate(out) if out else np.zeros((0, model.meta.num_labels), dtype=np.float32)


def predict_texts(model, tokenizer, texts: list[str], method: str, settings, max_length: int, batch_size: int,
                  device: torch.device | str = "cpu", progress: Callable[[int, int], None] | None = None,
                  repairs: list[Callable[[list[str]], list[str]]] | None = None,
                  amp: torch.dtype | None = None) -> np.ndarray:
    """Class logits of `texts` under a method name (`none`, `masked_ttt`, `spell`, `spell+masked_ttt`, ...).

    `settings` is a TTTConfig or an EngineSettings (its `seed` is the mask seed); `repairs` are the method's text
    repairs when the caller built them once for many sets (a spelling dictionary and its index take about a second);
    `amp` the scoring precision's autocast dtype (`Runtime.score.dtype`; None: fp32)."""
    return score_texts(model, tokenizer, texts, method, settings, max_length, batch_size, device, progress,
                       repairs, amp)[0]


def score_texts(model, tokenizer, texts: list[str], method: str, settings, max_length: int, batch_size: int,
                device: torch.device | str = "cpu", progress: Callable[[int, int], None] | None = None,
                repairs: list[Callable[[list[str]], list[str]]] | None = None,
                amp: torch.dtype | None = None) -> tuple[np.ndarray, dict]:
    """`predict_texts` plus the engine's statistics (units, steps, held-out probes; {} without an engine)."""
    from ttt_pipeline.defenses import registry

    m = registry.parse(method)
    for fix in (registry.build_repairs(m, settings) if repairs is None else repairs):
        texts = fix(texts)
    engine = registry.build_engine(m, model, tokenizer, settings, amp)
    logits = predict(model, tokenizer, texts, max_length, batch_size, engine, device, progress,
                     amp if engine is None else None)
    return logits, dict(getattr(engine, "stats", {}))


def score(logits: np.ndarray, labels: list[int], n: int) -> dict:
    return summarize(labels, logits.argmax(-1).tolist(), n)


def headline(rows: list[dict], default_defense: str | None = None) -> dict:
    """The run's scalar headline: acc_clean, acc_corrupted (no defense), acc_default (corrupted accuracy under the
    recommended defense, `evaluation.default_defense`; `none` when it is null) and acc_clean_default, the recovered
    fraction of the drop under it, acc_corrupted_<method> for every scored method (the registry's acc_default
    resolves to one of them), and the registry's headline defenses' figures (masked TTT's acc_ttt, acc_clean_ttt,
    acc_shift_ttt, Tent's acc_tent) when they were scored. Corrupted means the project's own suite; the external generators' sets (`ext:` families,
    the held-out test) are acc_external and acc_external_default."""
    from ttt_pipeline.corruption.external import is_external

    def acc(kind: str, method: str, external: bool = False) -> float | None:
        vals = [r["acc"] for r in rows if r["kind"] == kind and r["method"] == method
                and is_external(r.get("family") or "") == external]
        return float(np.mean(vals)) if vals else None

    defense = default_defense or "none"
    out = {
        "acc_clean": acc("clean", "none"),
        "acc_corrupted": acc("corrupted", "none"),
        "acc_default": acc("corrupted", defense),
        "acc_clean_default": acc("clean", defense),
        "acc_shift": acc("shift", "none"),
        "acc_shift_default": acc("shift", defense),
        "acc_external": acc("corrupted", "none", external=True),  # `ext:` families: apart from the own suite
        "acc_external_default": acc("corrupted", defense, external=True),
    }
    for m, entry in headline_methods().items():  # the registry's headline defenses: acc_ttt, acc_clean_ttt, ...
        for kind in entry.headline_kinds:
            out["_".join(["acc", *([] if kind == "corrupted" else [kind]), entry.headline])] = acc(kind, m)
    for m in dict.fromkeys(r["method"] for r in rows if r["kind"] == "corrupted" and r["method"] != "none"):
        out[f"acc_corrupted_{method_tag(m)}"] = acc("corrupted", m)
    if None not in (out["acc_clean"], out["acc_corrupted"], out["acc_default"]) and defense != "none":
        out["recovered_fraction"] = recovered_fraction(out["acc_clean"], out["acc_corrupted"], out["acc_default"])
    f1 = [r["macro_f1"] for r in rows if r["kind"] == "clean" and r["method"] == "none"]
    if f1:
        out["macro_f1_clean"] = f1[0]
    return {k: v for k, v in out.items() if v is not None}


def metric_name(row: dict) -> str:
    """MLflow-chartable names: acc/clean/none, acc/keyboard/3/ttt, acc/shift_kitchen/tent ..."""
    method = method_tag(row["method"])
    if row["kind"] == "corrupted":
        return f"{row['family']}/{row['severity']}/{method}"
    return f"{row['set']}/{method}"


def seed_means(rows: list[dict]) -> list[dict]:
    """One row per set and method: accuracy and macro-F1 averaged over mask seeds (`mask_seeds` lists them)."""
    out: dict[tuple, dict] = {}
    for r in rows:
        key = (r["set"], r["method"])
        if key not in out:
            out[key] = {**r, "accs": [], "f1s": [], "mask_seeds": []}
        out[key]["accs"].append(r["acc"])
        out[key]["f1s"].append(r["macro_f1"])
        if r.get("mask_seed") is not None:
            out[key]["mask_seeds"].append(r["mask_seed"])
    return [{**{k: v for k, v in r.items() if k not in ("accs", "f1s")}, "acc": float(np.mean(r["accs"])),
             "macro_f1": float(np.mean(r["f1s"])), "acc_per_seed": r["accs"] if r["mask_seeds"] else None}
            for r in out.values()]
