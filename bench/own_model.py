"""Bring your own classifier, measured: a MiniLM classifier fine-tuned the way users fine-tune one, then scored by
`ttt-pipeline evaluate` from its folder and from the MLflow registry, and the evaluate grid's speed at a user's scale.

1. Fine-tune `AutoModelForSequenceClassification` on MiniLM-L6 (MODEL, bench/common.py) with id2label the four star
   classes, on the training split of the mdsd-electronics preset (the pipeline's own download step, so the test
   reviews are never trained on): the plain PyTorch loop of the Hugging Face course (AdamW, linear decay, no warm-up,
   fp32, batches in a seeded order). `save_pretrained` with its tokenizer; its accuracy on the test split as trained.
2. Log it to MLflow as a transformers text-classification pipeline, registered as `byo-minilm`.
3. `ttt-pipeline evaluate --model FOLDER --config mdsd-electronics` and `--model models:/byo-minilm/1`: clean,
   corrupted, drop and the default defense's gain with their intervals, from both forms.
4. Speed: the evaluate step alone (no Prefect) on `--speed-n` MDSD kitchen reviews (a test set of a user's size)
   under the grid this model runs (none, spell, mask_ensemble; one mask seed), clean and the preset's corruption.
   `evaluate_fraction_of_limit` = the forward passes that grid needs (each set once per method, mask_ensemble's
   copies), timed alone on the same model in the same run, over the step's wall time; the JSON splits the rest
   into the repair's time and what remains (statistics, tokenising, batching).

    .venv/bin/python -m bench.own_model [--epochs 2] [--speed-n 2000] [--quick]

`--quick` (the tests' smoke run) trains on 48 reviews for one epoch and scores 40; its figures mean nothing.
The last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from bench.common import MDSD, MODEL, REPO, log, seed_all, skipped_without_mdsd

LABELS = ["1", "2", "4", "5"]


def training_split(store: Path, quick: bool):
    """The mdsd-electronics preset's splits, from the pipeline's download step: (train texts, labels, test ...)."""
    from ttt_pipeline import steps
    from ttt_pipeline.config import load_config
    from ttt_pipeline.data.prepare import load_prepared
    from ttt_pipeline.storage import StepStore

    cfg = load_config("mdsd-electronics", [f"data.path={MDSD / 'electronics'}", "data.shift={}", f"store={store}"]
                      + (["data.max_train_samples=48", "data.max_test_samples=40"] if quick else []))
    ds, _ = load_prepared(steps.download(cfg, StepStore(cfg.store)).path)
    return ds["train"]["text"], ds["train"]["label"], ds["test"]["text"], ds["test"]["label"]


def fine_tune(texts: list[str], labels: list[int], out: Path, epochs: int, seed: int, lr: float = 5e-5,
              batch: int = 16, max_length: int = 128) -> float:
    """The user's classifier, saved to `out`; returns the training seconds."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, get_linear_schedule_with_warmup

    from ttt_pipeline.modeling.model import resolve_model_source

    seed_all(seed)
    source = resolve_model_source(MODEL)
    tok = AutoTokenizer.from_pretrained(source)
    model = AutoModelForSequenceClassification.from_pretrained(
        source, num_labels=len(LABELS), id2label=dict(enumerate(LABELS)), label2id={n: i for i, n in enumerate(LABELS)})
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    steps = epochs * ((len(texts) + batch - 1) // batch)
    sched = get_linear_schedule_with_warmup(opt, 0, steps)
    order = torch.Generator().manual_seed(seed)
    t0 = time.perf_counter()
    model.train()
    for epoch in range(epochs):
        perm = torch.randperm(len(texts), generator=order).tolist()
        for i in range(0, len(perm), batch):
            rows = perm[i:i + batch]
            enc = tok([texts[j] for j in rows], padding=True, truncation=True, max_length=max_length,
                      return_tensors="pt")
            loss = model(**enc, labels=torch.tensor([labels[j] for j in rows])).loss
            loss.backward()
            opt.step()
            sched.step()
            opt.zero_grad()
        log(f"epoch {epoch + 1}/{epochs}: last loss {loss.item():.3f}")
    seconds = time.perf_counter() - t0
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return seconds


def accuracy_as_trained(folder: Path, texts: list[str], labels: list[int]) -> float:
    """The model's own test accuracy through transformers' text-classification pipeline (no pipeline of ours)."""
    from transformers import pipeline

    clf = pipeline("text-classification", model=str(folder), truncation=True, max_length=128)
    preds = [LABELS.index(p["label"]) for p in clf(list(texts), batch_size=32)]
    return sum(p == y for p, y in zip(preds, labels)) / len(labels)


def log_to_registry(folder: Path, tracking_uri: str, name: str) -> str:
    import mlflow
    from transformers import pipeline

    mlflow.set_tracking_uri(tracking_uri)
    try:
        with mlflow.start_run(run_name="byo-classifier"):
            info = mlflow.transformers.log_model(pipeline("text-classification", model=str(folder)), name="model",
                                                 registered_model_name=name,
                                                 pip_requirements=["transformers", "torch"])
    finally:
        mlflow.set_tracking_uri(None)
    return f"models:/{name}/{info.registered_model_version}"


def evaluate(model: str, home: Path, quick: bool) -> dict:
    """`ttt-pipeline evaluate --model MODEL --config mdsd-electronics --json`: its summary."""
    sets = [f"data.path={MDSD / 'electronics'}", f"data.shift={{kitchen: {MDSD / 'kitchen'}, books: {MDSD / 'books'}}}",
            "attribution.enabled=false", f"store={home / 'store'}", f"tracking.tracking_uri=sqlite:///{home}/mlflow.db",
            f"tracking.artifact_root={home / 'mlruns'}"] + (["data.max_train_samples=48", "data.max_test_samples=40",
                                                              "data.shift={}", "ttt.mask_seeds=1"] if quick else [])
    args = [str(REPO / ".venv" / "bin" / "ttt-pipeline") if (REPO / ".venv").is_dir() else "ttt-pipeline",
            "evaluate", "--model", model, "--config", "mdsd-electronics", "--json", *[a for s in sets for a in ("--set", s)]]
    run = subprocess.run(args, capture_output=True, text=True, cwd=home, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if run.returncode != 0:
        raise SystemExit(f"evaluate failed ({run.returncode}):\n{run.stdout[-2000:]}\n{run.stderr[-2000:]}")
    s = json.loads(run.stdout.strip().splitlines()[-1])
    keep = ("acc_clean", "acc_corrupted", "acc_default", "acc_shift", "corruption_drop", "defense_gain", "notes",
            "wall_s")
    return {k: s.get(k) for k in keep} | {"model_name": (s.get("registry") or {}).get("model_name")}


def passes(method: str, ttt) -> int:
    """Forward passes a method makes per review: one, or one per masked copy for mask_ensemble."""
    from ttt_pipeline.defenses.mask_ensemble import default_copies
    from ttt_pipeline.defenses.registry import parse

    engine = parse(method).engine
    if engine == "none":
        return 1
    if engine == "mask_ensemble":
        return default_copies(ttt)
    raise ValueError(f"{method}: no forward count for engine {engine} (this bench's grid is none, spell, "
                     "mask_ensemble)")


def speed(folder: Path, store: Path, n: int) -> dict:
    """The evaluate step on `n` kitchen reviews, timed against the forward passes its grid needs."""
    from ttt_pipeline import steps
    from ttt_pipeline.config import load_config
    from ttt_pipeline.data.prepare import load_prepared
    from ttt_pipeline.evaluation import grid
    from ttt_pipeline.evaluation.scoring import predict
    from ttt_pipeline.modeling.hf_classifier import Source
    from ttt_pipeline.modeling.loading import load_model
    from ttt_pipeline.storage import StepStore

    cfg = load_config("mdsd-electronics", [
        f"data.path={MDSD / 'electronics'}", f"data.test_path={MDSD / 'kitchen'}", f"data.max_test_samples={n}",
        "data.shift={}", "ttt.mask_seeds=1", "evaluation.signal_reviews=0", f"store={store}"])
    st = StepStore(cfg.store)
    data = steps.download(cfg, st)
    model_out = steps.import_model(cfg, data, Source(str(folder), str(folder), str(folder)), st)
    scored, _ = steps.evaluated_config(cfg, model_out)
    corrupt_out = steps.corrupt(scored, data, st)
    t0 = time.perf_counter()
    assert not steps.evaluate(scored, data, model_out, corrupt_out, st).cached, "a fresh store is needed"
    wall = time.perf_counter() - t0
    ds, _ = load_prepared(data.path)
    sets = steps.test_sets(ds, corrupt_out, list(corrupt_out.meta["sets"]), True)
    model, tok = load_model(Path(model_out.path) / "model")
    L, batch = scored.model.max_length, scored.ttt.batch_size
    amp = steps.runtime(scored).score.dtype  # the grid's own precision (the engines autocast alike)
    forward = {}
    for s in sets:
        t1 = time.perf_counter()
        predict(model, tok, s.texts, L, batch, amp=amp)
        forward[s.name] = time.perf_counter() - t1
    jobs = grid.jobs(sets, scored.ttt)
    limit = sum(forward[j.test_set.name] * passes(j.method.name, scored.ttt) for j in jobs)
    t2 = time.perf_counter()
    repairs = grid.build_repairs(scored.ttt, lambda: ds["train"]["text"])
    for j in jobs:
        for fix in repairs[j.method.name]:
            fix(j.test_set.texts)
    repair = time.perf_counter() - t2
    reviews = sum(len(j.test_set.texts) for j in jobs)
    return {"reviews": len(sets[0].texts), "sets": [s.name for s in sets], "methods": scored.ttt.methods,
            "precision": steps.runtime(scored).score.name,
            "evaluate_wall_s": round(wall, 2), "evaluate_reviews_per_s": round(reviews / wall, 1),
            "forward_limit_s": round(limit, 2), "evaluate_fraction_of_limit": round(limit / wall, 3),
            "repair_s": round(repair, 2), "other_s": round(wall - limit - repair, 2),
            "forward_s_per_set": {k: round(v, 2) for k, v in forward.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--speed-n", type=int, default=2000, help="kitchen reviews of the speed run (default 2000)")
    ap.add_argument("--work", default=None, help="folder for the model, store and MLflow files (default: a "
                    "temporary one, removed); a model trained there before is scored again, not retrained")
    ap.add_argument("--quick", action="store_true", help="the tests' smoke size (figures mean nothing)")
    args = ap.parse_args()
    if skipped_without_mdsd():
        return
    from ttt_pipeline.modeling.precision import machine_summary

    with tempfile.TemporaryDirectory(prefix="ttt-byo-") as tmp:
        home = Path(args.work or tmp).resolve()
        home.mkdir(parents=True, exist_ok=True)
        train_x, train_y, test_x, test_y = training_split(home / "store", args.quick)
        folder = home / "byo-minilm"
        record = home / "byo-minilm.json"  # a --work folder keeps the trained model: a rerun scores it again
        if not record.is_file():
            train_s = fine_tune(train_x, train_y, folder, 1 if args.quick else args.epochs, args.seed)
            record.write_text(json.dumps({"train_s": train_s}))
        train_s = json.loads(record.read_text())["train_s"]
        own = accuracy_as_trained(folder, test_x, test_y)
        log(f"trained in {train_s:.0f} s; test accuracy as trained {own:.3f}")
        uri = log_to_registry(folder, f"sqlite:///{home}/mlflow.db", "byo-minilm")
        from_folder = evaluate(str(folder), home, args.quick)
        from_registry = evaluate(uri, home, args.quick)
        fast = speed(folder, home / "speed-store", 40 if args.quick else args.speed_n)
        out = {"model": MODEL, "machine": machine_summary(), "train_reviews": len(train_x),
               "test_reviews": len(test_x), "epochs": 1 if args.quick else args.epochs, "train_s": round(train_s, 1),
               "acc_as_trained": own, "from_folder": from_folder, "from_registry": from_registry,
               "same_figures": all(from_folder[k] == from_registry[k] for k in ("acc_clean", "acc_corrupted",
                                                                                "acc_default")),
               "speed": fast}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
