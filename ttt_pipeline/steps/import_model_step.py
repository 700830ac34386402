"""import-model: a classifier fine-tuned elsewhere, in the place of the finetune step's model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ttt_pipeline.config import PipelineConfig
from ttt_pipeline.steps.guards import guarded
from ttt_pipeline.steps.keys import import_inputs, version, wants_mlm
from ttt_pipeline.storage import StepOutput, StepStore


def import_model(cfg: PipelineConfig, data: StepOutput, source, store: StepStore) -> StepOutput:
    """A classifier fine-tuned elsewhere (`source`: a hf_classifier.Source, local or a hub id) as this pipeline's
    model folder (`model/`), in the place of the finetune step's: evaluate, the logged MLflow Model and serving
    read it alike. A model saved by this pipeline is copied as it is, once its labels are the data's."""
    from ttt_pipeline.modeling.hf_classifier import import_classifier
    from ttt_pipeline.modeling.layout import model_folder

    labels = data.meta["label_names"]

    def build(tmp: Path) -> dict:
        own = model_folder(Path(source.model)) if source.local else None
        if own is not None:
            return _copy_own_model(own, labels, tmp / "model")
        return import_classifier(source, labels, cfg.model, cfg.ttt.mlm_from, wants_mlm(cfg), tmp / "model")

    return store.run("import-model", import_inputs(cfg, data, source), guarded(cfg, "import-model", build),
                     version("import-model"))


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
