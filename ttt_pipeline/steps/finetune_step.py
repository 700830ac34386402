"""finetune: train the classifier on the tokenised reviews (`modeling/train.py`), resumable from its checkpoints."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Callable

from ttt_pipeline.config import PipelineConfig
from ttt_pipeline.steps.guards import guarded
from ttt_pipeline.steps.keys import finetune_inputs, version
from ttt_pipeline.steps.machine import runtime
from ttt_pipeline.storage import StepOutput, StepStore

Progress = Callable[[str, int, int, dict], None]
log = logging.getLogger(__name__)


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
    """`parallel`: this rank's DataParallel in a data-parallel job (modeling/data_parallel.py), else None."""
    import torch
    from datasets import load_from_disk

    from ttt_pipeline.modeling.model import build_classifier, save_model
    from ttt_pipeline.modeling.oom import run_with_oom_fallback
    from ttt_pipeline.modeling.train import finetune as train

    inputs = finetune_inputs(cfg, tokens, data)
    work = store.root / "finetune" / f"{StepStore.key('finetune', inputs, version('finetune'))}.work"

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

    out = store.run("finetune", inputs, guarded(cfg, "finetune", build), version("finetune"))
    if not out.cached:
        shutil.rmtree(work, ignore_errors=True)  # checkpoints only serve an interrupted run
    return out
