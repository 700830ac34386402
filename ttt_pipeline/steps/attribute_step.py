"""attribute: TRAK attribution of the predictions corruption flipped and defenses fixed or broke."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

from ttt_pipeline.config import PipelineConfig
from ttt_pipeline.steps.guards import guarded
from ttt_pipeline.steps.keys import attribute_inputs, version
from ttt_pipeline.steps.machine import runtime
from ttt_pipeline.steps.outputs import read_predictions, read_set
from ttt_pipeline.storage import StepOutput, StepStore

Progress = Callable[[str, int, int, dict], None]


def model_checkpoints(model_out: StepOutput) -> list[Path]:
    """The fine-tuned model, then any saved checkpoints (`checkpoints/<name>/`, save_model folders): TRAK's
    ensemble. The finetune step keeps only the selected model today, so the ensemble has one member."""
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
        from ttt_pipeline.modeling.loading import load_model
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

    return store.run("attribute", inputs, guarded(cfg, "attribute", build), version("attribute"))
