"""The five pipeline steps as pure functions: (config section, upstream StepOutputs) -> StepOutput.

Each step's cache key is the hash of its code version, its config section and its inputs' digests, so an
unchanged re-run returns the stored output without work, and any change upstream rebuilds downstream. No
Prefect and no MLflow here: `tasks/` adds orchestration and tracking around these.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Callable

from . import __version__
from .config import PipelineConfig
from .storage import StepOutput, StepStore

Progress = Callable[[str, int, int, dict], None]
VERSIONS = {"download": "1", "tokenise": "1", "finetune": "2", "corrupt": "2", "corrupt-set": "1", "evaluate": "1"}
# Settings that do not change a CPU run's results. `precision` is not one: bf16 autocasts on CPU too.
DEVICE_ONLY = {"device", "num_workers", "compile"}


def _v(step: str) -> str:
    return f"{__version__}-{VERSIONS[step]}"


def stored(step: str, inputs: dict, store: StepStore) -> StepOutput | None:
    """The verified stored output for these inputs, if any (what a cache policy may serve)."""
    return store.load(step, StepStore.key(step, inputs, _v(step)))


def download_inputs(cfg: PipelineConfig) -> dict:
    from .data.sources import source_fingerprint

    d = cfg.data
    return {"data": d.model_dump(mode="json"), "source": source_fingerprint(d.path),
            "test_source": source_fingerprint(d.test_path, "data.test_path") if d.test_path else None,
            "shift": {k: source_fingerprint(v, f"data.shift.{k}") for k, v in sorted(d.shift.items())}}


def download(cfg: PipelineConfig, store: StepStore) -> StepOutput:
    from .data.prepare import prepare_dataset

    return store.run("download", download_inputs(cfg),
                     lambda tmp: prepare_dataset(cfg.data, tmp, store.root / "raw"), _v("download"))


def tokenise_inputs(cfg: PipelineConfig, data: StepOutput) -> dict:
    from .tokenize import tokenizer_fingerprint

    return {"data": data.digest, "tokenizer": tokenizer_fingerprint(cfg.model.name),
            "max_length": cfg.model.max_length}


def tokenise(cfg: PipelineConfig, data: StepOutput, store: StepStore) -> StepOutput:
    from .data.prepare import load_prepared
    from .tokenize import load_tokenizer, tokenize_dataset

    inputs = tokenise_inputs(cfg, data)

    def build(tmp: Path) -> dict:
        ds, _ = load_prepared(data.path)
        tok = load_tokenizer(cfg.model.name, cfg.model.trust_remote_code)
        return tokenize_dataset(ds, tok, cfg.model.max_length, tmp)

    return store.run("tokenise", inputs, build, _v("tokenise"))


def finetune_inputs(cfg: PipelineConfig, tokens: StepOutput, data: StepOutput) -> dict:
    ft = {k: v for k, v in cfg.finetune.model_dump(mode="json").items() if k not in DEVICE_ONLY}
    out = {"tokens": tokens.digest, "data": data.digest, "model": cfg.model.model_dump(mode="json"), "finetune": ft}
    if cfg.finetune.unlabeled_path:  # the texts' content, not only their path, keys the model
        from .data.sources import source_fingerprint

        out["unlabeled"] = source_fingerprint(cfg.finetune.unlabeled_path, "finetune.unlabeled_path")
    return out


def unlabeled_texts(cfg: PipelineConfig) -> list[str]:
    """finetune.unlabeled_path's non-blank texts: a local file (column data.text_column) or an MDSD folder
    (whose reader names the column `text`)."""
    from .data.readers import read_local
    from .errors import DataError

    path = Path(cfg.finetune.unlabeled_path).expanduser()
    frame = read_local(path, cfg.data.pt_columns, "finetune.unlabeled_path")
    column = "text" if path.is_dir() else cfg.data.text_column
    if column not in frame.columns:
        raise DataError(f"{path}: no column '{column}' (columns: {list(frame.columns)})",
                        "set data.text_column, or give finetune.unlabeled_path a file with that column")
    texts = [t for t in frame[column].dropna().astype(str) if t.strip()]
    if not texts:
        raise DataError(f"{path}: no non-empty texts in column '{column}'", "check finetune.unlabeled_path")
    return texts


def finetune(cfg: PipelineConfig, data: StepOutput, tokens: StepOutput, store: StepStore,
             progress: Progress | None = None) -> StepOutput:
    import torch
    from datasets import load_from_disk

    from .model import build_classifier, save_model
    from .oom import run_with_oom_fallback
    from .train import finetune as train

    inputs = finetune_inputs(cfg, tokens, data)
    work = store.root / "finetune" / f"{StepStore.key('finetune', inputs, _v('finetune'))}.work"

    def build(tmp: Path) -> dict:
        from .tokenize import lengths_dataset

        label_names = json.loads((Path(data.path) / "labels.json").read_text())
        names = [label_names[str(i)] for i in range(len(label_names))]
        ds = load_from_disk(str(Path(tokens.path) / "dataset"))
        extra_texts = unlabeled_texts(cfg) if cfg.finetune.unlabeled_path else None  # read once, not per attempt

        def attempt(batch_size: int):
            ft, wd = cfg.finetune, work
            if batch_size != cfg.finetune.batch_size:  # after a CUDA OOM: a fresh model and its own checkpoints
                ft, wd = cfg.finetune.model_copy(update={"batch_size": batch_size}), work / f"oom-batch-{batch_size}"
            torch.manual_seed(cfg.finetune.seed)  # the head's init must not depend on what ran before in this process
            model, tokenizer = build_classifier(cfg.model, names)
            unlabeled = lengths_dataset(tokenizer, extra_texts, cfg.model.max_length) if extra_texts else None
            return model, tokenizer, train(model, tokenizer, ds["train"], ds["validation"] if "validation" in ds
                                           else None, ft, wd, progress, unlabeled)

        (model, tokenizer, result), oom = run_with_oom_fallback(attempt, cfg.finetune.batch_size)
        save_model(model.cpu(), tokenizer, tmp / "model")
        history = {"epochs": result.history, "mlm_warmup": result.warmup_curve, "dapt": result.dapt_curve}
        (tmp / "history.json").write_text(json.dumps(history))
        return {"best_epoch": result.best_epoch, "best_val_macro_f1": result.best_val_macro_f1,
                "train_samples_per_s": result.train_samples_per_s, "epochs_run": len(result.history),
                "stopped_early": result.stopped_early, "resumed_from_epoch": result.resumed_from_epoch,
                "mlm_head_pretrained": model.meta.mlm_head_pretrained,
                "mlm_warmup_steps": len(result.warmup_curve),
                "mlm_warmup_final_loss": (sum(result.warmup_curve[-10:]) / len(result.warmup_curve[-10:])
                                          if result.warmup_curve else None),
                "final": result.history[-1] if result.history else {}, **oom}

    out = store.run("finetune", inputs, build, _v("finetune"))
    if not out.cached:
        shutil.rmtree(work, ignore_errors=True)  # checkpoints only serve an interrupted run
    return out


def corrupt_inputs(cfg: PipelineConfig, data: StepOutput) -> dict:
    return {"data": data.digest, "corruption": cfg.corruption.model_dump(mode="json")}


def corrupt(cfg: PipelineConfig, data: StepOutput, store: StepStore) -> StepOutput:
    """The suite for this config: an index over (family, severity) sets, each generated once and cached on
    its own, so adding a family or a severity only generates the new sets."""
    from .data.prepare import load_prepared

    inputs = corrupt_inputs(cfg, data)

    def build(tmp: Path) -> dict:
        loaded: list[list[str]] = []

        def test_texts() -> list[str]:  # read once, and only if some set must be generated
            if not loaded:
                loaded.append(load_prepared(data.path)[0]["test"]["text"])
            return loaded[0]

        sets = {}
        for family in cfg.corruption.families:
            sevs = [cfg.corruption.severities[0]] if family == "tutorial" else cfg.corruption.severities
            for sev in sevs:
                set_inputs = {"data": data.digest, "family": family, "severity": sev, "seed": cfg.corruption.seed}
                one = store.run("corrupt-set", set_inputs,
                                lambda t, f=family, s=sev: _write_set(t, test_texts(), f, s, cfg.corruption.seed),
                                _v("corrupt-set"))
                sets[f"{family}-{sev}"] = {**one.meta, "path": one.path, "set_digest": one.digest}
        (tmp / "index.json").write_text(json.dumps(sets, indent=1))
        return {"sets": sets}

    return store.run("corrupt", inputs, build, _v("corrupt"))


def _write_set(tmp: Path, texts: list[str], family: str, severity: int, seed: int) -> dict:
    from .corruption import corrupt_texts

    t0 = time.perf_counter()
    cs = corrupt_texts(texts, family, severity, seed)
    with open(tmp / "texts.jsonl", "w", encoding="utf-8") as f:
        for t in cs.texts:
            f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")
    return {"family": family, "severity": severity, "seed": seed, "n": len(cs.texts),
            "realised_edit_rate": cs.realised_edit_rate, "digest": cs.digest(), "wall_s": time.perf_counter() - t0,
            "examples": [[a, b] for a, b in list(zip(texts, cs.texts))[:5]]}


def read_set(corrupt_out: StepOutput, name: str) -> list[str]:
    with open(Path(corrupt_out.meta["sets"][name]["path"]) / "texts.jsonl", encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def evaluate_inputs(cfg: PipelineConfig, data: StepOutput, model_out: StepOutput, corrupt_out: StepOutput,
                    families: list[str] | None = None) -> dict:
    sets_meta = corrupt_out.meta["sets"]
    chosen = [n for n, m in sets_meta.items() if families is None or m["family"] in families]
    return {"data": data.digest, "model": model_out.digest, "corrupt": corrupt_out.digest, "sets": chosen,
            "clean": families is None or "clean" in families, "ttt": cfg.ttt.model_dump(mode="json"),
            "max_length": cfg.model.max_length}


def evaluate(cfg: PipelineConfig, data: StepOutput, model_out: StepOutput, corrupt_out: StepOutput,
             store: StepStore, families: list[str] | None = None, progress: Progress | None = None) -> StepOutput:
    """Scores clean / corrupted / shifted sets under every method; `families` restricts the corrupted sets
    (one evaluation per family lets several workers share the grid)."""
    from .data.prepare import load_prepared
    from .evaluate import predict, score
    from .model import load_model, pick_device
    from .ttt import build_engine

    sets_meta = corrupt_out.meta["sets"]
    chosen = [n for n, m in sets_meta.items() if families is None or m["family"] in families]
    with_clean = families is None or "clean" in families
    inputs = evaluate_inputs(cfg, data, model_out, corrupt_out, families)

    def build(tmp: Path) -> dict:
        from .train import set_threads

        set_threads()
        device = pick_device(cfg.finetune.device)
        ds, _ = load_prepared(data.path)
        model, tokenizer = load_model(Path(model_out.path) / "model", device)
        n = model.meta.num_labels
        labels = ds["test"]["label"]
        jobs = []  # (kind, set name, family, severity, texts, labels)
        if with_clean:
            jobs.append(("clean", "clean", None, None, ds["test"]["text"], labels))
            for split in ds:
                if split.startswith("shift_"):
                    jobs.append(("shift", split, None, None, ds[split]["text"], ds[split]["label"]))
        for name in chosen:
            m = sets_meta[name]
            jobs.append(("corrupted", name, m["family"], m["severity"], read_set(corrupt_out, name), labels))
        rows, samples = [], []
        total = sum(len(j[4]) * len(cfg.ttt.methods) for j in jobs)
        done = 0
        for kind, name, family, sev, texts, ys in jobs:
            preds_by_method = {}
            for method in cfg.ttt.methods:
                if kind == "clean" and method != "none" and not cfg.ttt.score_clean:
                    continue
                engine = build_engine(method, model, tokenizer, cfg.ttt)
                t0 = time.perf_counter()
                logits = predict(model, tokenizer, texts, cfg.model.max_length, cfg.ttt.batch_size, engine, device,
                                 (lambda i, t, d=done: progress("evaluate", d + i, total, {})) if progress else None)
                wall = time.perf_counter() - t0
                done += len(texts)
                s = score(logits, ys, n)
                preds_by_method[method] = logits.argmax(-1).tolist()
                rows.append({"kind": kind, "set": name, "family": family, "severity": sev, "method": method,
                             "acc": s["acc"], "macro_f1": s["macro_f1"], "recall": s["recall"],
                             "confusion": s["confusion"], "n": s["n"], "wall_s": wall,
                             "samples_per_s": len(texts) / wall if wall > 0 else 0.0})
            if kind == "corrupted":
                for i in range(min(8, len(texts))):
                    samples.append({"set": name, "text": texts[i], "label": model.meta.label_names[ys[i]],
                                    **{f"pred_{m}": model.meta.label_names[p[i]] for m, p in preds_by_method.items()}})
        (tmp / "results.json").write_text(json.dumps({"rows": rows, "samples": samples,
                                                       "label_names": model.meta.label_names}, indent=1))
        return {"n_rows": len(rows)}

    return store.run("evaluate", inputs, build, _v("evaluate"))


def load_results(eval_outs: list[StepOutput]) -> dict:
    rows, samples, names = [], [], []
    for o in eval_outs:
        r = json.loads((Path(o.path) / "results.json").read_text())
        rows += r["rows"]
        samples += r["samples"]
        names = r["label_names"]
    return {"rows": rows, "samples": samples, "label_names": names}
