"""Where `ttt-pipeline evaluate --model MODEL` finds the classifier's files.

A local Hugging Face folder is used where it is; an MLflow model (`models:/NAME@ALIAS`, `models:/NAME/VERSION`,
`runs:/RUN_ID/PATH`, a run id, or a downloaded MLflow Model folder) is downloaded through the registry
(`mlflow_model.download_model`) and read from its MLmodel file: the `transformers` flavour keeps the model in
its `model_binary` folder and the tokenizer in `components/tokenizer` (or names a hub checkpoint when it was
logged without weights); this project's own pyfunc keeps its model folder under `data/`. Anything else is a
hub id, loaded by transformers where the hub answers.
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import Iterator

import yaml

from ttt_pipeline.classifier import LOADER_MODULE, OLD_LOADER_MODULES, mlflow_model_parts
from ttt_pipeline.errors import ConfigError
from ttt_pipeline.io.mlflow_model import download_model, is_mlflow_reference
from ttt_pipeline.modeling.hf_classifier import Source

TEXT_TASKS = (None, "text-classification", "sentiment-analysis")


@contextlib.contextmanager
def fetched(name: str, tracking_uri: str) -> Iterator[Source]:
    """The Source of MODEL, with an MLflow model downloaded into a temporary folder for the block's duration."""
    path = Path(name).expanduser()
    if path.exists():
        yield from_local(name, path.resolve())
        return
    if not is_mlflow_reference(name):
        yield Source(name, name, name)
        return
    with tempfile.TemporaryDirectory(prefix="ttt-import-") as tmp:
        yield from_local(name, download_model(name, Path(tmp), tracking_uri))


def from_local(name: str, path: Path) -> Source:
    """A folder as a Source: a plain model folder as it is, an MLflow Model folder through its flavour."""
    mlmodel = path / "MLmodel"
    if not mlmodel.is_file():
        return Source(name, str(path), str(path))
    flavors = (yaml.safe_load(mlmodel.read_text(encoding="utf-8")) or {}).get("flavors") or {}
    if "transformers" in flavors:
        return _transformers(name, path, flavors["transformers"])
    loader = (flavors.get("python_function") or {}).get("loader_module")
    if loader in (LOADER_MODULE, *OLD_LOADER_MODULES):
        folder, _ = mlflow_model_parts(path)
        return Source(name, str(folder), str(folder))
    raise ConfigError(f"model.classifier '{name}': an MLflow model of flavour {sorted(flavors)}, which holds no "
                      "Hugging Face classifier", "log the model with mlflow.transformers.log_model (a "
                      "text-classification pipeline), or give its save_pretrained folder")


def _transformers(name: str, path: Path, conf: dict) -> Source:
    if conf.get("task") not in TEXT_TASKS:
        raise ConfigError(f"model.classifier '{name}': an MLflow transformers model for task {conf.get('task')!r}",
                          "give a text-classification pipeline (mlflow.transformers.log_model of "
                          "pipeline('text-classification', ...))")
    binary = conf.get("model_binary")
    if not binary:  # logged with save_pretrained=False: a reference to a hub checkpoint
        return Source(name, conf["source_model_name"], conf["source_model_name"])
    tokenizer = path / "components" / "tokenizer"
    return Source(name, str(path / binary), str(tokenizer if tokenizer.is_dir() else path / binary))
