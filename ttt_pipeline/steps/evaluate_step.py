"""evaluate: every set under every method, with per-review predictions kept so any comparison can be paired."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Callable

from ttt_pipeline.config import PipelineConfig
from ttt_pipeline.steps.guards import guarded
from ttt_pipeline.steps.keys import evaluate_inputs, version
from ttt_pipeline.steps.machine import runtime
from ttt_pipeline.steps.outputs import read_set
from ttt_pipeline.storage import StepOutput, StepStore

Progress = Callable[[str, int, int, dict], None]
log = logging.getLogger(__name__)


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
    length = model_length(meta, cfg)
    if length != cfg.model.max_length:
        notes.append(f"model.max_length {cfg.model.max_length} -> {length}: the model's own limit")
    out = cfg.model_copy(deep=True)
    out.ttt.methods = methods
    out.model.max_length = length
    return out, notes


def model_length(meta: dict, cfg: PipelineConfig) -> int:
    """The length a stored model is scored at: its own (`max_length` of the import step's output or of the model
    folder's meta.json: a classifier brought with `evaluate --model` keeps its own limit when that is below
    model.max_length), else the configuration's. The evaluate step and the nightly check both read it here."""
    return int(meta.get("max_length") or cfg.model.max_length)


def evaluate(cfg: PipelineConfig, data: StepOutput, model_out: StepOutput, corrupt_out: StepOutput,
             store: StepStore, families: list[str] | None = None, progress: Progress | None = None) -> StepOutput:
    """Scores clean / corrupted / shifted sets under every method (masked ones once per mask seed); `families`
    restricts the corrupted sets (one evaluation per family lets several workers share the grid).

    Writes `results.json` (one row per set x method x mask seed) and `predictions.parquet` (every review's
    predicted class and class probabilities), so any comparison can be made paired, after the fact."""
    from ttt_pipeline.data.prepare import load_prepared
    from ttt_pipeline.evaluation import grid
    from ttt_pipeline.modeling.loading import load_model

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
        sets = test_sets(ds, corrupt_out, chosen, with_clean)
        rows, preds = grid.score_grid(grid.jobs(sets, cfg.ttt), model, tokenizer, cfg.ttt, cfg.evaluation,
                                      cfg.model.max_length, device,
                                      grid.build_repairs(cfg.ttt, lambda: training_texts(ds)),
                                      (lambda done, total: progress("evaluate", done, total, {})) if progress else None,
                                      amp=plain.dtype)
        samples = grid.samples(sets, preds, model.meta.label_names)
        (tmp / "results.json").write_text(json.dumps({"rows": rows, "samples": samples,
                                                       "label_names": model.meta.label_names}, indent=1))
        _write_predictions(preds, tmp / "predictions.parquet")
        return {"n_rows": len(rows), "n_predictions": sum(len(p["pred"]) for p in preds),
                "precision": plain.name, "precision_reason": plain.reason}

    return store.run("evaluate", inputs, guarded(cfg, "evaluate", build), version("evaluate"))


def training_texts(ds) -> list[str]:
    """The training reviews a repair may trust (spell's `train` vocabulary); none for unlabelled reviews
    (data.label_column null), which have no train split."""
    return list(ds["train"]["text"]) if "train" in ds else []


def test_sets(ds, corrupt_out: StepOutput, chosen: list[str], with_clean: bool) -> list:
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
