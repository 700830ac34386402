"""The self-supervised signal masked TTT adapts on, measured in every run (issue 35).

A TTT gain needs an informative masked-LM task: a head that reads review text at perplexity 100+ hands the
encoder gradients about noise, where a pretrained BERT head reads reviews near perplexity 5-7. Two figures say
which regime a model is in:

- `mlm_quality`: the head's masked-token loss, perplexity and top-1 accuracy on a set's own text (fixed masks:
  15 % of the maskable tokens, row-hash draws, so every method and run sees the same masks);
- the engine's held-out MLM loss before and after each measured adaptation (masks it never stepped on;
  `EpisodicEngine.probe_*`), summarised here with the share of predictions the adaptation changed.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from ttt_pipeline.defenses.base import RowHashMasker, trim_padding
from ttt_pipeline.defenses.registry import headline_method
from ttt_pipeline.modeling.model import special_token_ids
from ttt_pipeline.modeling.tokenize import encode_texts
from ttt_pipeline.modeling.train import make_collate

QUALITY_MASK_PROB = 0.15  # BERT's pre-training rate: perplexities comparable with published heads


def mlm_quality(model, tokenizer, texts: list[str], max_length: int, batch_size: int, device, seed: int = 0,
                limit: int = 512) -> dict | None:
    """Masked-token cross-entropy (nats), perplexity and top-1 accuracy of the MLM head on the first `limit`
    texts; None when nothing could be masked (or `limit` is 0), or the model has no MLM head."""
    if limit <= 0 or not len(texts) or getattr(model, "mlm_head", None) is None:
        return None
    enc = encode_texts(tokenizer, list(texts[:limit]), max_length)
    rows = [{"input_ids": ids} for ids in enc["input_ids"]]
    collate, masker = make_collate(tokenizer), RowHashMasker(QUALITY_MASK_PROB, special_token_ids(tokenizer), seed)
    loss_sum, hits, n = 0.0, 0, 0
    model.eval()
    with torch.inference_mode():
        for i in range(0, len(rows), batch_size):
            b = collate(rows[i:i + batch_size])
            ids, am = trim_padding(b["input_ids"].to(device), b["attention_mask"].to(device))
            mask = masker(ids, am, 0).to(device).bool()
            if not bool(mask.any()):
                continue
            hidden = model.encode(ids.masked_fill(mask, tokenizer.mask_token_id), am)
            logits, target = model.mlm_logits_at(hidden, mask).float(), ids[mask]
            loss_sum += float(F.cross_entropy(logits, target, reduction="sum"))
            hits += int((logits.argmax(-1) == target).sum())
            n += int(target.numel())
    if n == 0:
        return None
    loss = loss_sum / n
    return {"mlm_loss": loss, "mlm_perplexity": math.exp(min(loss, 50.0)), "mlm_top1": hits / n, "mlm_tokens": n}


def heldout_fields(stats: dict) -> dict:
    """An engine's held-out probes as row fields: mean loss before / after over the measured units and the
    per-unit pairs (empty when the engine measured nothing)."""
    pairs = stats.get("heldout") or []
    if not pairs:
        return {}
    before, after = (float(np.mean([p[i] for p in pairs])) for i in (0, 1))
    return {"heldout_before": before, "heldout_after": after, "heldout_units": len(pairs),
            "heldout_pairs": [[round(a, 5), round(b, 5)] for a, b in pairs]}


def changed_share(preds: pd.DataFrame, method: str, kind: str = "corrupted") -> float | None:
    """Share of (review, set, mask seed) predictions of `method` that differ from `none`'s on the same review."""
    mine = preds[(preds["method"] == method) & (preds["kind"] == kind)]
    base = preds[(preds["method"] == "none") & (preds["kind"] == kind)]
    if mine.empty or base.empty:
        return None
    merged = mine.merge(base[["set", "index", "pred"]], on=["set", "index"], suffixes=("", "_none"))
    return float((merged["pred"] != merged["pred_none"]).mean()) if len(merged) else None


def _own_suite(r: dict) -> bool:
    from ttt_pipeline.corruption.external import is_external

    return r["kind"] == "corrupted" and not is_external(r.get("family") or "")


def signal_headline(rows: list[dict], preds: pd.DataFrame | None = None) -> dict:
    """Scalars for the run summary: the head's clean and corrupted perplexity and top-1 accuracy, and masked
    TTT's held-out MLM loss before / after adaptation (mean over its measured units of the corrupted sets and
    mask seeds), its change, and the share of corrupted-set predictions it changed."""
    out: dict = {}
    clean = [r for r in rows if r["kind"] == "clean" and "mlm_loss" in r]
    if clean:
        out.update({"mlm_loss_clean": clean[0]["mlm_loss"], "mlm_perplexity_clean": clean[0]["mlm_perplexity"],
                    "mlm_top1_clean": clean[0]["mlm_top1"]})
    corrupted = [r for r in rows if _own_suite(r) and "mlm_loss" in r]
    if corrupted:
        loss = float(np.mean([r["mlm_loss"] for r in corrupted]))
        out.update({"mlm_loss_corrupted": loss, "mlm_perplexity_corrupted": math.exp(min(loss, 50.0)),
                    "mlm_top1_corrupted": float(np.mean([r["mlm_top1"] for r in corrupted]))})
    ttt = [r for r in rows if _own_suite(r) and r["method"] == headline_method("ttt") and "heldout_before" in r]
    if ttt:
        before = float(np.mean([r["heldout_before"] for r in ttt]))
        after = float(np.mean([r["heldout_after"] for r in ttt]))
        out.update({"ttt_heldout_before": before, "ttt_heldout_after": after, "ttt_heldout_change": after - before})
    if preds is not None and (share := changed_share(preds, headline_method("ttt"))) is not None:
        out["ttt_changed_share"] = share
    return out


def signal_metrics(rows: list[dict], metric_name) -> dict:
    """Per-set MLflow metrics: mlm_loss / mlm_perplexity / mlm_top1 of each set, and each masked method's
    held-out loss change (mean over mask seeds) per set."""
    out: dict = {}
    for r in rows:
        if "mlm_loss" in r:
            name = metric_name({**r, "method": "none"}).rsplit("/", 1)[0]
            out.update({f"{k}/{name}": r[k] for k in ("mlm_loss", "mlm_perplexity", "mlm_top1")})
    changes: dict = {}
    for r in rows:
        if "heldout_before" in r:
            changes.setdefault(metric_name(r), []).append(r["heldout_after"] - r["heldout_before"])
    out.update({f"ttt_heldout_change/{k}": float(np.mean(v)) for k, v in changes.items()})
    return out
