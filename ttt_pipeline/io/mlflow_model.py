"""The classifier as an MLflow Model: the `python_function` flavour with this module as its loader.

Layout of the logged model (an MLflow 3 LoggedModel, linked to the finetune run as its output):

    MLmodel                      flavour python_function, loader_module ttt_pipeline.io.mlflow_model, code code/,
                                 config = the inference configuration (method + ttt.* settings), signature, metadata
                                 (ttt_pipeline_version: the version of the code in code/)
    code/ttt_pipeline/           this package's source as it was when the model was logged (MLflow's `code_paths`)
    data/model/                  the finetune step's folder: encoder/ (safetensors), head.safetensors,
                                 tokenizer/, meta.json, labels.json, vocabulary.json (spell's training words)
    input_example.json, serving_input_example.json, requirements.txt, python_env.yaml, conda.yaml

Self-contained: loading (`mlflow.pyfunc.load_model`, `mlflow models serve`, `mlflow models build-docker`) puts
code/ first on sys.path, imports the loader module from it and calls `_load_pyfunc(data_path, model_config)`, as
MLflow documents for a loader module shipped in `code_paths`. requirements.txt pins the third-party packages
that code imports, by version, so an environment built from the model's own requirements.txt alone (MLflow's
virtualenv or uv environment manager, a Docker image, `pip install -r requirements.txt`) serves it; the project
itself need not be installed, and no package of its name is fetched from an index. torch is pinned as its CPU build
by default (`--extra-index-url https://download.pytorch.org/whl/cpu` and `torch==2.13.0+cpu` on Linux and Windows;
macOS wheels are CPU-only already): PyPI's `torch==2.13.0` on Linux is the CUDA build, several GB of nvidia-*
wheels, which is what MLflow's own environment managers would otherwise install on a CPU-only host.
`TTT_MODEL_TORCH=cuda` at logging time pins PyPI's build instead (`torch==2.13.0`: CUDA on Linux). Weights are safetensors and the tokenizer
and vocabulary are data files: nothing is unpickled; the code that runs is the package's own source in code/
(a process that already imported `ttt_pipeline`, such as a test, keeps its own copy).
Requests: `{"inputs": ["text", ...]}` or `{"dataframe_records": [{"text": ...}]}`, with an optional `params`
object (`method` and any `ttt.*` inference setting, `ttt_pipeline.classifier.inference_fields`) overriding the
model config for that request; the answer is `{"predictions": [{"label", "probability", "probabilities"}]}`.

Logging goes through MlflowClient (create_logged_model, log_outputs, log_model_artifacts, finalize) with the
model folder written by `mlflow.pyfunc.save_model`: `mlflow.pyfunc.log_model` works on the process-global
tracking URI and active run, which the pipeline never sets (its tasks log from Prefect's worker threads).
"""

from __future__ import annotations

import json
import logging
import re
import tempfile
from pathlib import Path
from typing import Any

from ttt_pipeline.classifier import LOADER_MODULE, Classifier, load_local
from ttt_pipeline.errors import ConfigError, PipelineError
from ttt_pipeline.io.model_registry import LOGGED_MODEL_NAME, logged_model_id

log = logging.getLogger(__name__)
MODEL_TYPE = "review-classifier"
RUN_ID = re.compile(r"^[0-9a-f]{32}$")
INPUT_EXAMPLE = ["Great sound and the battery lasts all day.", "Stopped working after a week. Very disappointed."]
# What loading and serving import (distribution names); pinned to the versions this model was logged with.
# Written by hand rather than inferred (mlflow's requirement inference): inference maps the loader's modules to the
# installed `ttt-pipeline` distribution, then prunes everything that distribution requires, leaving the one pin no
# public index serves as ours (`ttt-pipeline==0.1.0`); the package's code travels in code/ instead.
REQUIREMENTS = ("mlflow", "torch", "transformers", "tokenizers", "safetensors", "numpy", "pandas", "pydantic",
                "pyyaml", "symspellpy", "rapidfuzz")  # rapidfuzz: `spell`'s edit distances
PACKAGE_DIR = Path(__file__).resolve().parents[1]  # ttt_pipeline/: shipped as the model's code/ttt_pipeline


# ---------------------------------------------------------------------- saving and logging


def signature(label_names: list[str]):
    """Input: texts (one unnamed string column, so `{"inputs": [...]}`, records with a `text` field and a
    Python list all fit). Output: label, probability, probabilities (label -> probability).
    Params: `method` and every inference setting, default None = the model config's value."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, DataType, ParamSchema, ParamSpec, Schema
    from mlflow.types.schema import Map

    from ttt_pipeline.classifier import inference_fields

    params = [ParamSpec("method", DataType.string, None)]
    params += [ParamSpec(name, DataType[kind], None) for name, kind in inference_fields().items()]
    return ModelSignature(
        inputs=Schema([ColSpec(DataType.string)]),
        outputs=Schema([ColSpec(DataType.string, "label"), ColSpec(DataType.double, "probability"),
                        ColSpec(Map(DataType.double), "probabilities")]),
        params=ParamSchema(params))


TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
TORCH_BUILDS = ("cpu", "cuda")


def _torch_lines(public: str, build: str) -> list[str]:
    """The requirement lines of torch `public` (a public version) for `build`: cpu (PyTorch's CPU index as an extra
    index, the `+cpu` wheel where PyTorch publishes one: Linux and Windows) or cuda (PyPI's build)."""
    if build not in TORCH_BUILDS:
        raise PipelineError(f"TTT_MODEL_TORCH={build!r}: the logged model's torch build is one of {TORCH_BUILDS}",
                            "unset TTT_MODEL_TORCH (cpu, the default) or set it to cuda")
    if build == "cuda":
        return [f"torch=={public}"]
    return [f"--extra-index-url {TORCH_CPU_INDEX}", f'torch=={public}+cpu; sys_platform != "darwin"',
            f'torch=={public}; sys_platform == "darwin"']


def pip_requirements(torch_build: str | None = None) -> list[str]:
    """`dist==<public version>` of each of REQUIREMENTS installed here (the local label of a build, torch's `+cpu`,
    is dropped, as MLflow's own inference does), torch as the build `torch_build` names (default
    $TTT_MODEL_TORCH, else cpu; `_torch_lines`), whatever build is installed here."""
    import os
    from importlib.metadata import PackageNotFoundError, version

    from packaging.version import Version

    build = (torch_build or os.environ.get("TTT_MODEL_TORCH") or "cpu").strip().lower()
    out = []
    for dist in REQUIREMENTS:
        try:
            public = Version(version(dist)).public
        except PackageNotFoundError:
            out.append(dist)
            continue
        out.extend(_torch_lines(public, build) if dist == "torch" else [f"{dist}=={public}"])
    return out


def save_classifier_model(folder: Path, path: Path, config: dict[str, Any],
                          vocabulary: dict[str, int] | None = None, mlflow_model=None) -> Path:
    """Write the MLflow Model of a saved classifier folder to `path` (which must not exist)."""
    import mlflow.pyfunc
    from mlflow.models import Model

    from ttt_pipeline import __version__
    from ttt_pipeline.defenses.vocabulary import FILE, write_vocabulary

    folder, path = Path(folder), Path(path)
    meta = json.loads((folder / "meta.json").read_text())
    mlflow_model = mlflow_model or Model()
    mlflow_model.metadata = {"ttt_pipeline_version": __version__, "base_model": meta["base_model"],
                             "label_names": meta["label_names"], "max_length": meta["max_length"],
                             "vocabulary_words": len(vocabulary) if vocabulary is not None else None}
    mlflow.pyfunc.save_model(
        path=str(path), loader_module=LOADER_MODULE, data_path=str(folder), mlflow_model=mlflow_model,
        signature=signature(meta["label_names"]), input_example=list(INPUT_EXAMPLE),
        pip_requirements=pip_requirements(), model_config=dict(config), code_paths=[str(PACKAGE_DIR)])
    data = path / Model.load(str(path)).flavors["python_function"]["data"]
    if vocabulary is not None:
        write_vocabulary(vocabulary, data / FILE)
    else:
        (data / FILE).unlink(missing_ok=True)
    return path


def log_classifier_model(client, run_id: str, folder: Path, config: dict[str, Any],
                         vocabulary: dict[str, int] | None = None, params: dict[str, Any] | None = None) -> str:
    """Log the classifier folder as an MLflow Model (a LoggedModel that is the output of run `run_id`, so the
    run page lists it under "Logged models"); returns its model id. The model's params are the run's params
    plus the inference configuration (`inference.*`)."""
    from mlflow.entities import LoggedModelOutput, LoggedModelStatus
    from mlflow.models import Model

    from ttt_pipeline.io.tracking import MAX_PARAM_LEN, retry

    run = retry(lambda: client.get_run(run_id), "get_run")
    all_params = {**run.data.params, **(params or {}), **{f"inference.{k}": v for k, v in config.items()}}
    lm = retry(lambda: client.create_logged_model(
        run.info.experiment_id, name=LOGGED_MODEL_NAME, source_run_id=run_id, model_type=MODEL_TYPE,
        params={k: str(v)[:MAX_PARAM_LEN] for k, v in all_params.items()},
        tags={"ttt.method": str(config.get("method"))}), "create_logged_model")
    try:
        retry(lambda: client.log_outputs(run_id, [LoggedModelOutput(lm.model_id, step=0)]), "log_outputs")
        with tempfile.TemporaryDirectory(prefix="ttt-mlflow-model-") as tmp:
            local = save_classifier_model(folder, Path(tmp) / "model", config, vocabulary,
                                          Model(artifact_path=lm.artifact_location, model_uuid=lm.model_id,
                                                run_id=run_id, model_id=lm.model_id))
            retry(lambda: client.log_model_artifacts(lm.model_id, str(local)), "log_model_artifacts")
        retry(lambda: client.finalize_logged_model(lm.model_id, LoggedModelStatus.READY), "finalize")
    except BaseException:
        try:
            client.finalize_logged_model(lm.model_id, LoggedModelStatus.FAILED)
        except Exception as exc:  # the original error matters more
            log.warning("could not mark logged model %s FAILED: %s", lm.model_id, exc)
        raise
    return lm.model_id


# ---------------------------------------------------------------------- resolving and downloading


def _missing(exc: Exception) -> bool:
    code = getattr(exc, "error_code", "") or ""
    return any(c in code for c in ("RESOURCE_DOES_NOT_EXIST", "NOT_FOUND", "INVALID_PARAMETER_VALUE"))


def client_for(tracking_uri: str | None):
    """(MlflowClient, uri) for `tracking_uri`, else $TTT_TRACKING_URI / $MLFLOW_TRACKING_URI, else the demo
    preset's sqlite:///mlflow.db; a sqlite file that does not exist or a server that does not answer is a
    PipelineError (`client.open_client`), never a new empty store. The registry is the tracking store."""
    from mlflow.tracking import MlflowClient

    from ttt_pipeline.io.client import default_tracking_uri, open_client

    _, uri = open_client(tracking_uri or default_tracking_uri())
    return MlflowClient(tracking_uri=uri, registry_uri=uri), uri


def _registered(client, source: str) -> str:
    """The storage location of `models:/<name>@<alias>`, `models:/<name>/<version>`, `models:/<name>/latest`
    or `models:/<model id>`, resolved with this client (MLflow's own models:/ resolution reads the process-global
    registry URI, which would be ./mlflow.db here)."""
    from mlflow.exceptions import MlflowException

    ref = source[len("models:/"):].strip("/")
    try:
        if "@" in ref:
            name, alias = ref.split("@", 1)
            mv = client.get_model_version_by_alias(name, alias)
        elif "/" in ref:
            name, version = ref.rsplit("/", 1)
            if version == "latest":
                versions = client.search_model_versions(f"name = '{name}'")
                if not versions:
                    raise PipelineError(f"{source}: the registered model has no versions", "run the pipeline first")
                version = str(max(int(v.version) for v in versions))
            mv = client.get_model_version(name, version)
        else:  # a logged model id (m-...)
            return client.get_logged_model(ref).artifact_location
        return client.get_model_version_download_uri(mv.name, mv.version)
    except MlflowException as exc:
        if _missing(exc):
            first = (exc.message or str(exc)).splitlines()[0][:300]
            raise PipelineError(f"{source}: not found in the MLflow registry ({first})",
                                "check the model name, alias or version (the MLflow UI's Models page lists them) "
                                "and --tracking-uri") from None
        raise


def resolve_reference(client, source: str) -> str:
    """The artifact URI of the model a reference names: a run id (pipeline run or finetune run),
    `models:/...` or `runs:/<run id>/<path>`."""
    from mlflow.exceptions import MlflowException

    from ttt_pipeline.io.model_registry import MODEL_ARTIFACT, MODEL_STAGES, find_model_run

    if source.startswith("models:/"):
        return _registered(client, source)
    run_id, _, path = source[len("runs:/"):].partition("/") if source.startswith("runs:/") else (source, "", "")
    try:
        run = client.get_run(run_id)
    except MlflowException as exc:
        if _missing(exc):
            raise PipelineError(f"MLflow run {run_id} not found", "check the run id and --tracking-uri") from None
        raise
    if path:
        return f"{run.info.artifact_uri.rstrip('/')}/{path}"
    candidates = [run]
    if run.data.tags.get("stage") not in MODEL_STAGES:  # a pipeline run: its fine-tune child holds the model
        child = find_model_run(client, run_id)
        candidates = [child] if child is not None else []
    for r in candidates:
        model_id = logged_model_id(client, r.info.run_id)
        if model_id:
            return client.get_logged_model(model_id).artifact_location
        if client.list_artifacts(r.info.run_id, MODEL_ARTIFACT):
            return f"{r.info.artifact_uri.rstrip('/')}/{MODEL_ARTIFACT}"
    raise PipelineError(f"MLflow run {run_id} has no logged model",
                        "give the pipeline run or its finetune run (tracking.log_model must have been true)")


def download_model(source: str, dst: Path, tracking_uri: str | None = None) -> Path:
    """Download the model a reference names into `dst`; returns the local folder."""
    import mlflow.artifacts
    from mlflow.exceptions import MlflowException

    from ttt_pipeline.errors import redact

    client, uri = client_for(tracking_uri)
    artifact_uri = resolve_reference(client, source)
    try:
        local = mlflow.artifacts.download_artifacts(artifact_uri=artifact_uri, dst_path=str(dst), tracking_uri=uri,
                                                    registry_uri=uri)
    except (MlflowException, OSError) as exc:
        first = (getattr(exc, "message", None) or str(exc)).splitlines()[0][:300]
        raise PipelineError(f"{source}: the model files at {redact(artifact_uri)} could not be downloaded ({first})",
                            "check that the artifact store is reachable (and --tracking-uri)") from None
    return Path(local)


# ---------------------------------------------------------------------- the pyfunc loader


def _texts(data) -> list[str]:
    """Texts of a scoring request: a DataFrame's `text` column (or its only column), a list, a Series, an
    array or a dict with a `text` list. A missing text names its row."""
    import numpy as np
    import pandas as pd

    if isinstance(data, pd.DataFrame):
        if "text" in data.columns:
            data = data["text"]
        elif len(data.columns) == 1:
            data = data.iloc[:, 0]
        else:
            raise PipelineError(f"input has columns {list(data.columns)} and no `text` column",
                                'send {"inputs": ["review", ...]} or records with a "text" field')
    elif isinstance(data, dict):
        if "text" not in data:
            raise PipelineError(f"input has keys {list(data)} and no `text`", 'send {"inputs": ["review", ...]}')
        data = data["text"]
    if isinstance(data, str):
        data = [data]
    values = data.tolist() if isinstance(data, (pd.Series, np.ndarray)) else list(data)
    for i, v in enumerate(values):
        if not isinstance(v, str):
            what = "missing" if v is None or (isinstance(v, float) and v != v) else f"a {type(v).__name__}"
            raise PipelineError(f"input row {i}: the text is {what}", "every input needs a review text (a string)")
        try:
            v.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate: what an undecodable byte becomes; no tokenizer takes it
            raise PipelineError(f"input row {i}: the text is not valid Unicode (a lone surrogate at character "
                                f"{exc.start})", "send UTF-8 text; replace undecodable bytes (errors='replace')"
                                ) from None
    return values


def _cut(texts: list[str]) -> tuple[list[str], list[bool]]:
    """The texts cut to data.max_text_chars' default as the data step cuts reviews (the model reads a few hundred
    tokens; a 2 MB review would cost the repair seconds for nothing), and which were."""
    from ttt_pipeline.config.schema import DataConfig

    limit = DataConfig.model_fields["max_text_chars"].default
    return [t[:limit] for t in texts], [len(t) > limit for t in texts]


class PyfuncClassifier:
    """What `mlflow.pyfunc.load_model` returns the implementation of: predict(data, params) -> list of dicts
    (Classifier.predict's, plus `method`, the method that ran, and `truncated`, whether the text was longer than
    the model reads).
    With a `recorder` (io.traffic_recorder.TrafficRecorder), every predicted text is also captured."""

    def __init__(self, classifier, recorder=None):
        self.classifier = classifier
        self.recorder = recorder

    def predict(self, data, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        from mlflow.exceptions import MlflowException

        overrides = {k: v for k, v in (params or {}).items() if v is not None}
        method = overrides.pop("method", None)
        try:
            texts, cut = _cut(_texts(data))
            name = method or self.classifier.method  # the method that runs (refused below if it cannot)
            if self.recorder is not None:
                records = self.recorder.predict(texts, method, overrides)
            else:
                records = self.classifier.predict(texts, method, **overrides)
            # each answer says which method ran and whether the model read only the text's head
            read = ([r["truncated"] for r in records] if all("truncated" in r for r in records)  # captured
                    else self.classifier.truncated(texts))
            for record, was_cut, long in zip(records, cut, read):
                record.update(method=name, truncated=bool(was_cut or long))
            return records
        except PipelineError as exc:  # a bad request: HTTP 400 with the message and hint
            raise MlflowException.invalid_parameter_value(
                exc.message + (f" (hint: {exc.hint})" if exc.hint else "")) from None


def logged_run_id(model_dir: Path) -> str | None:
    """The run id an MLflow Model folder's MLmodel names (its source run), else its model id; None without."""
    import yaml

    try:
        spec = yaml.safe_load((Path(model_dir) / "MLmodel").read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return None
    found = spec.get("run_id") or spec.get("model_id") if isinstance(spec, dict) else None
    return str(found) if found else None


ENV_BATCH_TEXTS, ENV_BATCH_WAIT_MS = "TTT_SERVE_BATCH_TEXTS", "TTT_SERVE_BATCH_WAIT_MS"


def batching_env(environ) -> tuple[int, float]:
    """A served model's request batching (Classifier.batch_requests) from its environment: TTT_SERVE_BATCH_TEXTS
    texts per pass (0: each request alone), TTT_SERVE_BATCH_WAIT_MS the first request's wait for others."""
    from ttt_pipeline.classifier import BATCH_TEXTS, BATCH_WAIT_MS

    out = []
    for name, default, kind in ((ENV_BATCH_TEXTS, BATCH_TEXTS, int), (ENV_BATCH_WAIT_MS, BATCH_WAIT_MS, float)):
        raw = environ.get(name, "").strip()
        try:
            value = kind(raw) if raw else default
        except ValueError:
            value = -1
        if value < 0:
            raise ConfigError(f"{name}={raw!r} is not a number >= 0",
                              f"unset it (default {default}) or give {'a whole number' if kind is int else 'ms'}")
        out.append(value)
    return out[0], out[1]


def _load_pyfunc(data_path: str, model_config: dict[str, Any] | None = None) -> PyfuncClassifier:
    """MLflow's entry point: `data_path` is the model's data/model folder; `model_config` the stored inference
    configuration with any load-time override (`mlflow.pyfunc.load_model(..., model_config=...)`) on top. With
    TTT_MONITORING_CAPTURE=1 in the environment the requests are captured (io.traffic_recorder); concurrent
    requests are batched as TTT_SERVE_BATCH_TEXTS / TTT_SERVE_BATCH_WAIT_MS say (`batching_env`)."""
    import os

    from ttt_pipeline.classifier import from_folder, known_settings
    from ttt_pipeline.io.traffic_recorder import CaptureSettings, TrafficRecorder

    device = os.environ.get("TTT_DEVICE", "auto")
    config = known_settings(dict(model_config or {}), data_path)
    classifier = from_folder(Path(data_path), config, device).prepare()  # the first request is fast
    classifier.batch_requests(*batching_env(os.environ))
    capture = CaptureSettings.from_env(fallback_version=logged_run_id(Path(data_path).parents[1]))
    if capture is None:
        return PyfuncClassifier(classifier)
    recorder = TrafficRecorder(classifier, capture)
    if recorder.descriptor_method != classifier.method:  # its repair is built at load too, not on a request
        classifier.prepare(recorder.descriptor_method)
    log.info("capturing traffic into %s as %s v%s (texts %s)", capture.uri, capture.model_name,
             capture.model_version, "kept" if capture.store_text else "not kept")
    return PyfuncClassifier(classifier, recorder)


def model_identity(source: str, tracking_uri: str | None = None) -> tuple[str, str]:
    """(registered name, version) of a model reference as captured traffic names it: `models:/NAME/V`,
    `models:/NAME@ALIAS` (the alias resolved now) and `models:/NAME/latest` by the registry; a run id, `runs:/`
    or a local MLflow Model folder as ("unknown", its run id); else ("unknown", "unknown")."""
    text = str(source)
    if text.startswith("models:/"):
        ref = text[len("models:/"):].strip("/")
        if "@" in ref or ref.endswith("/latest"):
            client, _ = client_for(tracking_uri)
            if "@" in ref:
                name, alias = ref.split("@", 1)
                return name, str(client.get_model_version_by_alias(name, alias).version)
            name = ref.rsplit("/", 1)[0]
            return name, str(max(int(v.version) for v in client.search_model_versions(f"name = '{name}'")))
        if "/" in ref:
            name, version = ref.rsplit("/", 1)
            return name, version
        return "unknown", ref  # a logged model id
    if text.startswith("runs:/"):
        return "unknown", text[len("runs:/"):].split("/", 1)[0]
    if RUN_ID.match(text):
        return "unknown", text
    return "unknown", logged_run_id(Path(text).expanduser()) or "unknown"


def is_mlflow_reference(source: str) -> bool:
    return source.startswith(("models:/", "runs:/")) or bool(RUN_ID.match(source))


def load_classifier(source: str | Path, device: str = "auto", tracking_uri: str | None = None,
                    config: dict[str, Any] | None = None, **settings) -> Classifier:
    """A Classifier from a folder, an MLflow run id (the pipeline run or its finetune run),
    `models:/<name>@<alias>`, `models:/<name>/<version>`, `models:/<model id>` or `runs:/<id>/<path>`.

    `tracking_uri` (default: $TTT_TRACKING_URI, $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db) resolves MLflow
    references; `config` and keyword `settings` (method=..., steps=...) override the stored inference
    configuration."""
    overrides = {**(config or {}), **settings}
    text = str(source)
    path = Path(text).expanduser()
    if path.exists():
        return load_local(path, overrides, device)
    if not is_mlflow_reference(text):
        raise PipelineError(f"model {text!r}: no such folder, and not an MLflow run id or models:/ URI",
                            "give a model folder, a run id (32 hex digits), models:/<name>@<alias> or "
                            "models:/<name>/<version>")
    with tempfile.TemporaryDirectory(prefix="ttt-model-") as tmp:  # weights are read into memory, then dropped
        local = download_model(text, Path(tmp), tracking_uri)
        return load_local(local, overrides, device, source=text)
