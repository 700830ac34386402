"""The five pipeline steps as pure functions: (config section, upstream StepOutputs) -> StepOutput.

Each step's cache key is the hash of its code version, its config section and its inputs' digests, so an
unchanged re-run returns the stored output without work, and any change upstream rebuilds downstream. No
Prefect and no MLflow here: `ttt_pipeline/tasks/` adds orchestration and tracking around these.
"""

from __future__ import annotations

import functools
import json
import logging
import shutil
import sys
import time
from pathlib import Path
from typing import Callable

from ttt_pipeline.config import PipelineConfig
from ttt_pipeline.storage import StepOutput, StepStore
from ttt_pipeline.version import __version__

Progress = Callable[[str, int, int, dict], None]
log = logging.getLogger(__name__)
VERSIONS = {"download": "1", "tokenise": "1", "finetune": "3", "corrupt": "2", "corrupt-set": "1", "evaluate": "5"}
# finetune 3: AdamW fused on a CPU too (the same update up to float rounding); evaluate 5: a plain forward pass
# (`none`, the repairs) autocasts by ttt.precision, as the engines do
# Settings that do not change a CPU run's results. `precision` is not one: it is keyed by what `auto` resolves
# to on this machine (bf16 where the CPU runs it natively, fp32 elsewhere), so each machine caches what it ran.
# activation_checkpointing recomputes the same forward with the same dropout draws (tests/test_train.py).
DEVICE_ONLY = {"device", "num_workers", "compile", "activation_checkpointing"}
# Fine-tune settings added later whose null is what ran before they existed: left out of the key when null, so
# models cached earlier keep their keys.
OPTIONAL_KEYS = {"augment", "attention_dropout", "hidden_dropout"}


def _v(step: str) -> str:
    return f"{__version__}-{VERSIONS[step]}"


def runtime(cfg: PipelineConfig):
    """The run's machine choices (modeling/precision.py `Runtime`: device, fine-tuning and scoring precision,
    attention), resolved once per configuration and machine verdict in this process and handed to every step: cache
    keys, run metadata, fine-tuning and scoring all read this one object."""
    from ttt_pipeline.modeling.precision import cpu_native_bf16

    ft = cfg.finetune
    return _runtime(ft.device, ft.precision, cfg.ttt.precision, ft.attention, cpu_native_bf16())


@functools.lru_cache(maxsize=16)
def _runtime(device: str, train_precision: str, score_precision: str, attention: str, machine: tuple):
    """`machine`, the CPU's native-bf16 verdict, is part of the key: a test that stands in another CPU (its
    TTT_CPU_NATIVE_BF16) gets that CPU's choices."""
    from ttt_pipeline.modeling.model import pick_device
    from ttt_pipeline.modeling.precision import resolve_runtime

    return resolve_runtime(pick_device(device), train_precision, score_precision, attention)


def _memory_hint(cfg: PipelineConfig, stage: str) -> str:
    """The settings that lower a stage's memory, with their current values."""
    length, ft, ttt = cfg.model.max_length, cfg.finetune, cfg.ttt
    fused = ft.attention_dropout == 0 and runtime(cfg).attention.name != "eager"
    attention = "" if fused else ("finetune.attention_dropout=0 with finetune.attention=sdpa keeps no attention score "
                                  "matrices; ")
    checkpointing = "" if ft.activation_checkpointing or ft.mode != "full" else (
        "finetune.activation_checkpointing=true keeps only each layer's input (the same weights, a slower step); ")
    half = min(ttt.sub_batch_tokens, 2048) // 2 if ttt.sub_batch_tokens else 2048  # null or 0: off
    # not a default: it lowers the demo's peak but slows fine-tuning (docs/benchmarks.md, memory)
    heap = "; with glibc, MALLOC_MMAP_THRESHOLD_=4194304 in the environment returns freed activations to the " \
           "system (slower steps)" if sys.platform.startswith("linux") else ""
    sub_batches = f"ttt.sub_batch_tokens={half} adapts in smaller sub-batches (the same loss and step, up to " \
                  "rounding); " if half else ""
    return {
        "download": "lower data.max_train_samples / data.max_test_samples, or give the run more memory",
        "tokenise": f"lower model.max_length (now {length}) or data.max_train_samples",
        "fine-tune": f"lower finetune.batch_size (now {ft.batch_size}) or model.max_length (now {length}); "
                     f"{attention}{checkpointing}finetune.precision=bf16 halves activations (fast on CUDA and on CPUs "
                     f"with native bf16){heap}",
        "corrupt": "lower data.max_test_samples, or score fewer corruption.families / corruption.severities",
        "evaluate": f"lower ttt.batch_size (now {ttt.batch_size}) or model.max_length (now {length}); "
                    f"{sub_batches}ttt.params=layernorm adapts and copies far fewer weights than "
                    f"ttt.params={ttt.params}{heap}",
        "import-model": "give the run more memory: the whole model is loaded once, in fp32",
        "attribute": f"lower attribution.batch_size (now {cfg.attribution.batch_size}), attribution.proj_dim "
                     f"(now {cfg.attribution.proj_dim}) or attribution.max_train",
    }[stage]


def _guarded(cfg: PipelineConfig, stage: str, build: Callable[[Path], dict]) -> Callable[[Path], dict]:
    """`build` with out-of-memory errors turned into `error: out of memory in <stage>` plus a hint."""
    from ttt_pipeline.modeling.oom import memory_errors

    def run(tmp: Path) -> dict:
        with memory_errors(stage, _memory_hint(cfg, stage)):
            return build(tmp)

    return run


def stored(step: str, inputs: dict, store: StepStore) -> StepOutput | None:
    """The verified stored output for these inputs, if any (what a cache policy may serve)."""
    return store.load(step, StepStore.key(step, inputs, _v(step)))


def download_inputs(cfg: PipelineConfig) -> dict:
    """A source is keyed by what it holds (a local file's digest, a remote address), never by how its path is
    spelled: `data/demo/...`, its resolved link target and an absolute path share one cached download."""
    from ttt_pipeline.data.sources import source_fingerprint

    d = cfg.data
    settings = d.model_dump(mode="json", exclude={"path", "test_path", "shift"})
    return {"data": settings, "source": source_fingerprint(d.path),
            "test_source": source_fingerprint(d.test_path, "data.test_path") if d.test_path else None,
            "shift": {k: source_fingerprint(v, f"data.shift.{k}") for k, v in sorted(d.shift.items())}}


def download(cfg: PipelineConfig, store: StepStore) -> StepOutput:
    from ttt_pipeline.data.prepare import prepare_dataset

    return store.run("download", download_inputs(cfg),
                     _guarded(cfg, "download", lambda tmp: prepare_dataset(cfg.data, tmp, store.root / "raw")),
                     _v("download"))


def tokenise_inputs(cfg: PipelineConfig, data: StepOutput) -> dict:
    from ttt_pipeline.modeling.tokenize import tokenizer_fingerprint

    return {"data": data.digest, "tokenizer": tokenizer_fingerprint(cfg.model.name),
            "max_length": cfg.model.max_length}


def tokenise(cfg: PipelineConfig, data: StepOutput, store: StepStore) -> StepOutput:
    from ttt_pipeline.data.prepare import load_prepared
    from ttt_pipeline.modeling.tokenize import load_tokenizer, tokenize_dataset

    inputs = tokenise_inputs(cfg, data)

    def build(tmp: Path) -> dict:
        ds, _ = load_prepared(data.path)
        tok = load_tokenizer(cfg.model.name, cfg.model.trust_remote_code)
        return tokenize_dataset(ds, tok, cfg.model.max_length, tmp)

    return store.run("tokenise", inputs, _guarded(cfg, "tokenise", build), _v("tokenise"))


def finetune_inputs(cfg: PipelineConfig, tokens: StepOutput, data: StepOutput) -> dict:
    ft = {k: v for k, v in cfg.finetune.model_dump(mode="json").items()
          if k not in DEVICE_ONLY and not (k in OPTIONAL_KEYS and v is None)}
    ft["precision"] = runtime(cfg).train.name
    attention = runtime(cfg).attention.name  # keyed only where it changes the checkpoint's own (old keys hold)
    del ft["attention"]
    if attention is not None:
        ft["attention"] = attention
    out = {"tokens": tokens.digest, "data": data.digest, "model": cfg.model.model_dump(mode="json"), "finetune": ft}
    if cfg.finetune.unlabeled_path:  # the texts' content, not only their path, keys the model
        from ttt_pipeline.data.sources import source_fingerprint

        out["unlabeled"] = source_fingerprint(cfg.finetune.unlabeled_path, "finetune.unlabeled_path")
    return out


def unlabeled_texts(cfg: PipelineConfig) -> list[str]:
    """finetune.unlabeled_path's non-blank texts: a local file (column data.text_column) or an MDSD folder
    (whose reader names the column `text`)."""
    from ttt_pipeline.data.readers import read_local
    from ttt_pipeline.errors import DataError

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
             progress: Progress | None = None, parallel=None) -> StepOutput:
    """`parallel`: this rank's DataParallel in a data-parallel job (tasks/distributed.py), else None."""
    import torch
    from datasets import load_from_disk

    from ttt_pipeline.modeling.model import build_classifier, save_model
    from ttt_pipeline.modeling.oom import run_with_oom_fallback
    from ttt_pipeline.modeling.train import finetune as train

    inputs = finetune_inputs(cfg, tokens, data)
    work = store.root / "finetune" / f"{StepStore.key('finetune', inputs, _v('finetune'))}.work"

    def build(tmp: Path) -> dict:
        from ttt_pipeline.modeling.tokenize import lengths_dataset

        label_names = json.loads((Path(data.path) / "labels.json").read_text())
        names = [label_names[str(i)] for i in range(len(label_names))]
        ds = load_from_disk(str(Path(tokens.path) / "dataset"))
        extra_texts = unlabeled_texts(cfg) if cfg.finetune.unlabeled_path else None  # read once, not per attempt
        augmented: dict = {}  # finetune.augment's summary (copies per family and severity)

        def attempt(batch_size: int):
            ft, wd = cfg.finetune, work
            if batch_size != cfg.finetune.batch_size:  # after a CUDA OOM: a fresh model and its own checkpoints
                ft, wd = cfg.finetune.model_copy(update={"batch_size": batch_size}), work / f"oom-batch-{batch_size}"
            torch.manual_seed(cfg.finetune.seed)  # the head's init must not depend on what ran before in this process
            model, tokenizer = build_classifier(cfg.model, names)
            unlabeled = lengths_dataset(tokenizer, extra_texts, cfg.model.max_length) if extra_texts else None
            train_ds = ds["train"]
            if cfg.finetune.augment is not None:  # robust training: seeded corrupted copies of training reviews
                from ttt_pipeline.modeling.augment import augment_dataset

                train_ds, aug = augment_dataset(ds["train"], ds["train"]["text"], tokenizer, cfg.model.max_length,
                                                cfg.finetune.augment)
                augmented.update(aug.summary())
            return model, tokenizer, train(model, tokenizer, train_ds, ds["validation"] if "validation" in ds
                                           else None, ft, wd, progress, unlabeled, parallel, runtime(cfg))

        machine = runtime(cfg)
        chosen, attention = machine.train, machine.attention
        log.info("fine-tuning precision %s: %s; attention %s: %s", chosen.name, chosen.reason,
                 attention.name or "the checkpoint's own", attention.reason)
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
                "final": result.history[-1] if result.history else {}, **oom,
                "precision": chosen.name, "precision_reason": chosen.reason,
                "attention": attention.name or "checkpoint", "attention_reason": attention.reason,
                **({"augment": augmented} if augmented else {})}

    out = store.run("finetune", inputs, _guarded(cfg, "fine-tune", build), _v("finetune"))
    if not out.cached:
        shutil.rmtree(work, ignore_errors=True)  # checkpoints only serve an interrupted run
    return out


VERSIONS["import-model"] = "1"


def wants_mlm(cfg: PipelineConfig) -> bool:
    """Whether a method in ttt.methods adapts on an MLM head (masked TTT and its recipes)."""
    from ttt_pipeline.defenses.registry import needs_mlm

    return any(needs_mlm(m) for m in cfg.ttt.methods)


def import_inputs(cfg: PipelineConfig, data: StepOutput, source) -> dict:
    from ttt_pipeline.modeling.hf_classifier import source_fingerprint

    return {"data_labels": data.meta["label_names"], "source": source_fingerprint(source),
            "label_map": cfg.model.label_map, "max_length": cfg.model.max_length,
            "mlm_from": cfg.ttt.mlm_from if wants_mlm(cfg) else None, "mlm": wants_mlm(cfg),
            "trust_remote_code": cfg.model.trust_remote_code}


def import_model(cfg: PipelineConfig, data: StepOutput, source, store: StepStore) -> StepOutput:
    """A classifier fine-tuned elsewhere (`source`: a hf_classifier.Source, local or a hub id) as this pipeline's
    model folder (`model/`), in the place of the fine-tune step's: evaluate, the logged MLflow Model and serving
    read it alike. A model saved by this pipeline is copied as it is, once its labels are the data's."""
    from ttt_pipeline.modeling.hf_classifier import import_classifier
    from ttt_pipeline.modeling.layout import model_folder

    labels = data.meta["label_names"]

    def build(tmp: Path) -> dict:
        own = model_folder(Path(source.model)) if source.local else None
        if own is not None:
            return _copy_own_model(own, labels, tmp / "model")
        return import_classifier(source, labels, cfg.model, cfg.ttt.mlm_from, wants_mlm(cfg), tmp / "model")

    return store.run("import-model", import_inputs(cfg, data, source), _guarded(cfg, "import-model", build),
                     _v("import-model"))


def _copy_own_model(folder: Path, labels: list[str], out: Path) -> dict:
    from ttt_pipeline.errors import ConfigError

    meta = json.loads((folder / "meta.json").read_text())
    if [n.casefold() for n in meta["label_names"]] != [n.casefold() for n in labels]:
        raise ConfigError(f"model.classifier: the model's labels {meta['label_names']} are not the data's {labels}",
                          f"set data.label_names to {meta['label_names']} (in that order), with data.label_map to "
                          "merge label values")
    shutil.copytree(folder, out)
    return {"kind": "review_classifier", "model_labels": meta["label_names"], "order": list(range(len(labels))),
            "max_length": meta["max_length"], "mlm_head": True, "mlm_note": "the model's own MLM head"}


def evaluated_config(cfg: PipelineConfig, model_out: StepOutput) -> tuple[PipelineConfig, list[str]]:
    """The configuration the evaluate step runs for an imported model, and what it changed: the model's length,
    and the methods it cannot run (masked TTT without an MLM head) left out, with the reason."""
    from ttt_pipeline.defenses.registry import needs_mlm
    from ttt_pipeline.errors import ConfigError

    meta, notes = model_out.meta, []
    methods = [m for m in cfg.ttt.methods if meta["mlm_head"] or not needs_mlm(m)]
    if len(methods) < len(cfg.ttt.methods):
        dropped = [m for m in cfg.ttt.methods if m not in methods]
        notes.append(f"{', '.join(dropped)}: {meta['mlm_note']}")
        if cfg.evaluation.default_defense in dropped:
            raise ConfigError(f"evaluation.default_defense {cfg.evaluation.default_defense} adapts on an MLM head, "
                              "and the model has none", "set ttt.mlm_from=BASE_CHECKPOINT, or choose another "
                              f"default defense: --set evaluation.default_defense={methods[-1]}")
    if meta["max_length"] != cfg.model.max_length:
        notes.append(f"model.max_length {cfg.model.max_length} -> {meta['max_length']}: the model's own limit")
    out = cfg.model_copy(deep=True)
    out.ttt.methods = methods
    out.model.max_length = meta["max_length"]
    return out, notes


def corrupt_inputs(cfg: PipelineConfig, data: StepOutput) -> dict:
    return {"data": data.digest, "corruption": cfg.corruption.model_dump(mode="json")}


def corrupt(cfg: PipelineConfig, data: StepOutput, store: StepStore) -> StepOutput:
    """The suite for this config: an index over (family, severity) sets, each generated once and cached on
    its own, so adding a family or a severity only generates the new sets."""
    from ttt_pipeline.data.prepare import load_prepared

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

    return store.run("corrupt", inputs, _guarded(cfg, "corrupt", build), _v("corrupt"))


def _write_set(tmp: Path, texts: list[str], family: str, severity: int, seed: int) -> dict:
    from ttt_pipeline.corruption import corrupt_texts

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
            "clean": families is None or "clean" in families, "ttt": _ttt_key(cfg),
            "evaluation": cfg.evaluation.model_dump(mode="json", exclude={"reference", "default_defense"}),
            "max_length": cfg.model.max_length}


def _ttt_key(cfg: PipelineConfig) -> dict:
    ttt = cfg.ttt.model_dump(mode="json")
    ttt["precision"] = runtime(cfg).score.name
    return ttt


def evaluate(cfg: PipelineConfig, data: StepOutput, model_out: StepOutput, corrupt_out: StepOutput,
             store: StepStore, families: list[str] | None = None, progress: Progress | None = None) -> StepOutput:
    """Scores clean / corrupted / shifted sets under every method (masked ones once per mask seed); `families`
    restricts the corrupted sets (one evaluation per family lets several workers share the grid).

    Writes `results.json` (one row per set x method x mask seed) and `predictions.parquet` (every review's
    predicted class and class probabilities), so any comparison can be made paired, after the fact."""
    from ttt_pipeline.data.prepare import load_prepared
    from ttt_pipeline.evaluation import grid
    from ttt_pipeline.modeling.model import load_model

    sets_meta = corrupt_out.meta["sets"]
    chosen = [n for n, m in sets_meta.items() if families is None or m["family"] in families]
    with_clean = families is None or "clean" in families
    inputs = evaluate_inputs(cfg, data, model_out, corrupt_out, families)

    def build(tmp: Path) -> dict:
        from ttt_pipeline.modeling.train import set_threads

        set_threads()
        machine = runtime(cfg)
        device, plain = machine.device, machine.score
        log.info("scoring precision %s: %s", plain.name, plain.reason)
        ds, _ = load_prepared(data.path)
        model, tokenizer = load_model(Path(model_out.path) / "model", device)
        sets = _test_sets(ds, corrupt_out, chosen, with_clean)
        rows, preds = grid.score_grid(grid.jobs(sets, cfg.ttt), model, tokenizer, cfg.ttt, cfg.evaluation,
                                      cfg.model.max_length, device,
                                      grid.build_repairs(cfg.ttt, lambda: ds["train"]["text"]),
                                      (lambda done, total: progress("evaluate", done, total, {})) if progress else None,
                                      amp=plain.dtype)
        samples = grid.samples(sets, preds, model.meta.label_names)
        (tmp / "results.json").write_text(json.dumps({"rows": rows, "samples": samples,
                                                       "label_names": model.meta.label_names}, indent=1))
        _write_predictions(preds, tmp / "predictions.parquet")
        return {"n_rows": len(rows), "n_predictions": sum(len(p["pred"]) for p in preds),
                "precision": plain.name, "precision_reason": plain.reason}

    return store.run("evaluate", inputs, _guarded(cfg, "evaluate", build), _v("evaluate"))


def _test_sets(ds, corrupt_out: StepOutput, chosen: list[str], with_clean: bool) -> list:
    """The evaluate step's sets: clean test and shifted domains (unless a family-only share of the grid), then the
    chosen corrupted copies of the test set."""
    from ttt_pipeline.evaluation.grid import TestSet

    sets = []
    if with_clean:
        sets.append(TestSet("clean", "clean", ds["test"]["text"], ds["test"]["label"]))
        sets += [TestSet("shift", s, ds[s]["text"], ds[s]["label"]) for s in ds if s.startswith("shift_")]
    for name in chosen:
        m = corrupt_out.meta["sets"][name]
        sets.append(TestSet("corrupted", name, read_set(corrupt_out, name), ds["test"]["label"], m["family"],
                            m["severity"]))
    return sets


def _write_predictions(preds: list[dict], path: Path) -> None:
    import pandas as pd

    frames = [pd.DataFrame({"kind": p["kind"], "set": p["set"], "family": p["family"], "severity": p["severity"],
                            "method": p["method"], "mask_seed": p["mask_seed"], "index": range(len(p["pred"])),
                            "label": p["label"], "pred": p["pred"], "probs": list(p["probs"])}) for p in preds]
    frame = pd.concat(frames, ignore_index=True)
    frame["severity"] = frame["severity"].astype("Int64")
    frame["mask_seed"] = frame["mask_seed"].astype("Int64")
    frame.to_parquet(path, index=False)


def read_predictions(eval_outs: list[StepOutput]):
    """Every evaluate output's per-review predictions as one table (see `_write_predictions`)."""
    import pandas as pd

    return pd.concat([pd.read_parquet(Path(o.path) / "predictions.parquet") for o in eval_outs], ignore_index=True)


def load_results(eval_outs: list[StepOutput]) -> dict:
    rows, samples, names = [], [], []
    for o in eval_outs:
        r = json.loads((Path(o.path) / "results.json").read_text())
        rows += r["rows"]
        samples += r["samples"]
        names = r["label_names"]
    return {"rows": rows, "samples": samples, "label_names": names}


VERSIONS["attribute"] = "1"


def attribute_inputs(cfg: PipelineConfig, data: StepOutput, model_out: StepOutput, corrupt_out: StepOutput,
                     eval_outs: list[StepOutput]) -> dict:
    return {"data": data.digest, "model": model_out.digest, "corrupt": corrupt_out.digest,
            "evaluate": sorted(o.digest for o in eval_outs), "max_length": cfg.model.max_length,
            "attribution": cfg.attribution.model_dump(mode="json", exclude={"enabled"}),
            "device": runtime(cfg).device.type}  # the GPU projector draws other random matrices


def model_checkpoints(model_out: StepOutput) -> list[Path]:
    """The fine-tuned model, then any saved checkpoints (`checkpoints/<name>/`, save_model folders): TRAK's
    ensemble. The fine-tune step keeps only the selected model today, so the ensemble has one member."""
    root = Path(model_out.path)
    extra = sorted(p for p in (root / "checkpoints").glob("*") if (p / "meta.json").is_file())
    return [root / "model", *extra]


def attribute(cfg: PipelineConfig, data: StepOutput, model_out: StepOutput, corrupt_out: StepOutput,
              eval_outs: list[StepOutput], store: StepStore, progress: Progress | None = None) -> StepOutput:
    """TRAK attribution of the predictions corruption flipped and defenses fixed or broke (ttt_pipeline.evaluation.attribution):
    `attribution.json` (targets with their top-k supporting and opposing training reviews) and `scores.npy`
    (targets x attributed training reviews)."""
    inputs = attribute_inputs(cfg, data, model_out, corrupt_out, eval_outs)

    def build(tmp: Path) -> dict:
        import numpy as np
        import torch

        from ttt_pipeline.data.prepare import load_prepared
        from ttt_pipeline.evaluation.attribution import explain
        from ttt_pipeline.modeling.model import load_model
        from ttt_pipeline.modeling.train import set_threads

        t0 = time.perf_counter()
        c0 = time.process_time()  # CPU seconds: the cost on an idle machine, whatever else shares it
        set_threads()
        a = cfg.attribution
        device = runtime(cfg).device
        ds, _ = load_prepared(data.path)
        folders = model_checkpoints(model_out)
        model, tokenizer = load_model(folders[0], device)
        models = [model] + [lambda f=f: load_model(f, device)[0] for f in folders[1:]]
        sets: dict[str, list[str]] = {}

        def text_of(name: str, index: int) -> str:
            if name not in sets:
                sets[name] = (ds["test"]["text"] if name == "clean" else ds[name]["text"] if name in ds
                              else read_set(corrupt_out, name))
            return sets[name][index]

        result, scores = explain(
            read_predictions(eval_outs), text_of, models, tokenizer, ds["train"]["text"], ds["train"]["label"],
            model.meta.label_names, top_k=a.top_k, params=a.params, proj_dim=a.proj_dim, max_train=a.max_train,
            max_targets=a.max_targets, reasons=a.reasons, batch_size=a.batch_size, seed=a.seed,
            max_length=cfg.model.max_length, device=device,
            progress=(lambda i, n: progress("attribute", i, n, {})) if progress else None)
        (tmp / "attribution.json").write_text(json.dumps(result, indent=1, ensure_ascii=False))
        np.save(tmp / "scores.npy", scores.astype("float32"))
        return {**{k: result[k] for k in ("n_train", "n_targets", "proj_dim", "grad_dim", "n_models", "projector",
                                          "params", "timings")},
                "wall_s": time.perf_counter() - t0,  # kept with the entry: a cached step still says what it cost
                "cpu_s": time.process_time() - c0, "threads": torch.get_num_threads()}

    return store.run("attribute", inputs, _guarded(cfg, "attribute", build), _v("attribute"))


def load_attribution(out: StepOutput) -> dict:
    return json.loads((Path(out.path) / "attribution.json").read_text())


def kept(cfg: PipelineConfig, store: StepStore) -> list[str]:
    """What the store holds for this config, in pipeline order: each finished step, and an interrupted
    fine-tune's last checkpoint, so that a stopped run can say what the same command will resume from."""
    data = stored("download", download_inputs(cfg), store)
    if data is None:
        return []
    out = ["download"]
    tokens = stored("tokenise", tokenise_inputs(cfg, data), store)
    model = None
    if tokens is not None:
        out.append("tokenise")
        inputs = finetune_inputs(cfg, tokens, data)
        model = stored("finetune", inputs, store)
        epochs = _checkpoint_epochs(store.root / "finetune" / f"{StepStore.key('finetune', inputs, _v('finetune'))}"
                                    ".work")
        if model is not None:
            out.append("fine-tune")
        elif epochs:
            out.append(f"fine-tune's checkpoint after epoch {epochs} of {cfg.finetune.epochs}")
    corrupted = stored("corrupt", corrupt_inputs(cfg, data), store)
    if corrupted is not None:
        out.append("corrupt")
        if model is not None and stored("evaluate", evaluate_inputs(cfg, data, model, corrupted), store):
            out.append("evaluate")
    return out


def _checkpoint_epochs(work: Path) -> int:
    try:
        return len(json.loads((work / "state.json").read_text())["history"]) if (work / "last.pt").is_file() else 0
    except (OSError, ValueError, KeyError):
        return 0
