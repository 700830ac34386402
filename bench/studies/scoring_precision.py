"""Scoring in bf16 against fp32: the same predictions, and how much of the matrix units' speed scoring gets.

On every scored set of a preset (clean test, each corrupted set, each shifted domain) a trained classifier scores
the reviews twice through the library's plain forward pass (`evaluation.scoring.predict`): fp32 and under bf16
autocast. Per set: the share of reviews given the same class, and the accuracy difference (bf16 - fp32) with its
paired 95% bootstrap interval. Speed: the scoring speedup (fp32 seconds over bf16 seconds, over every set) against
the bare encoder's, the model's own encoder run on the same batches with and without autocast in the same run;
`scoring_share_of_encoder_speedup` is their ratio (the issue's line: >= 0.8).

    .venv/bin/python -m bench.studies.scoring_precision --model FOLDER [--config mdsd-electronics]

FOLDER: a Hugging Face sequence-classification folder (imported as `ttt-pipeline evaluate` imports it) or a
pipeline model folder (`.cache/finetune/<key>/model`). The last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bench.common import MDSD, log, skipped_without_mdsd


def scored_sets(model_folder: Path, preset: str, store: Path):
    """(config, model, tokenizer, test sets) of the preset with the model imported (or copied) into `store`."""
    from ttt_pipeline import steps
    from ttt_pipeline.config import load_config
    from ttt_pipeline.data.prepare import load_prepared
    from ttt_pipeline.modeling.hf_classifier import Source
    from ttt_pipeline.modeling.loading import load_model
    from ttt_pipeline.storage import StepStore

    cfg = load_config(preset, [f"data.path={MDSD / 'electronics'}", f"store={store}",
                               f"data.shift={{kitchen: {MDSD / 'kitchen'}, books: {MDSD / 'books'}}}"])
    st = StepStore(cfg.store)
    data = steps.download(cfg, st)
    model_out = steps.import_model(cfg, data, Source(str(model_folder), str(model_folder), str(model_folder)), st)
    cfg, _ = steps.evaluated_config(cfg, model_out)
    corrupt_out = steps.corrupt(cfg, data, st)
    ds, _ = load_prepared(data.path)
    sets = steps.test_sets(ds, corrupt_out, list(corrupt_out.meta["sets"]), True)
    model, tok = load_model(Path(model_out.path) / "model")
    return cfg, model, tok, sets


def encoder_seconds(model, tok, texts: list[str], max_length: int, batch: int, amp) -> float:
    """The bare encoder on the scoring path's own batches (same order, same padding)."""
    from ttt_pipeline.modeling.tokenize import encode_texts
    from ttt_pipeline.modeling.train import make_collate

    rows = [{"input_ids": ids} for ids in encode_texts(tok, texts, max_length)["input_ids"]]
    collate = make_collate(tok)
    t0 = time.perf_counter()
    with torch.inference_mode(), torch.autocast("cpu", dtype=amp, enabled=amp is not None):
        for i in range(0, len(rows), batch):
            b = collate(rows[i:i + batch])
            model.encoder(input_ids=b["input_ids"], attention_mask=b["attention_mask"])
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="classifier folder (Hugging Face or a pipeline model folder)")
    ap.add_argument("--config", default="mdsd-electronics")
    args = ap.parse_args()
    if skipped_without_mdsd():
        return
    from ttt_pipeline.evaluation.scoring import predict
    from ttt_pipeline.evaluation.stats import paired_difference
    from ttt_pipeline.modeling.precision import machine_summary

    with tempfile.TemporaryDirectory(prefix="ttt-precision-") as tmp:
        cfg, model, tok, sets = scored_sets(Path(args.model).resolve(), args.config, Path(tmp))
        L, batch = cfg.model.max_length, cfg.ttt.batch_size
        per_set, seconds = {}, {"fp32": 0.0, "bf16": 0.0, "encoder_fp32": 0.0, "encoder_bf16": 0.0}
        for s in sets:
            preds = {}
            for name, amp in (("fp32", None), ("bf16", torch.bfloat16)):
                t0 = time.perf_counter()
                preds[name] = predict(model, tok, s.texts, L, batch, amp=amp).argmax(-1)
                seconds[name] += time.perf_counter() - t0
                seconds[f"encoder_{name}"] += encoder_seconds(model, tok, s.texts, L, batch, amp)
            y = np.asarray(s.labels)
            d = paired_difference(preds["fp32"] == y, preds["bf16"] == y)
            per_set[s.name] = {"n": len(y), "agreement": float((preds["fp32"] == preds["bf16"]).mean()),
                               "acc_fp32": float((preds["fp32"] == y).mean()), "acc_diff": round(d.delta, 4),
                               "ci_low": round(d.ci_low, 4), "ci_high": round(d.ci_high, 4)}
            log(s.name, per_set[s.name])
    scoring = seconds["fp32"] / seconds["bf16"]
    encoder = seconds["encoder_fp32"] / seconds["encoder_bf16"]
    print(json.dumps({"model": args.model, "config": args.config, "machine": machine_summary(), "sets": per_set,
                      "min_agreement": min(v["agreement"] for v in per_set.values()),
                      "every_interval_contains_0": all(v["ci_low"] <= 0 <= v["ci_high"] for v in per_set.values()),
                      "seconds": {k: round(v, 2) for k, v in seconds.items()}, "scoring_speedup": round(scoring, 3),
                      "encoder_speedup": round(encoder, 3),
                      "scoring_share_of_encoder_speedup": round(scoring / encoder, 3)}))


if __name__ == "__main__":
    main()
