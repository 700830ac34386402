"""MLflow tracking through the client API: explicit URI, one parent run per pipeline run, a child per stage.

Using `MlflowClient` (no global active run) keeps logging safe from Prefect's worker threads. Tracking calls
are retried with backoff on transient errors; a tracking server that is down at start fails the run at once.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

from .errors import PipelineError

log = logging.getLogger(__name__)
T = TypeVar("T")
MAX_PARAM_LEN = 500


def retry(fn: Callable[[], T], what: str, attempts: int = 4, base_delay: float = 0.5) -> T:
    """Transient tracking failures (network, locked sqlite) are retried; the last error is raised, never lost."""
    for i in range(attempts):
        try:
            return fn()
        except Exception as exc:  # MLflow surfaces many exception types for the same transient fault
            if i == attempts - 1:
                raise
            delay = base_delay * 2**i
            log.warning("MLflow %s failed (%s); retrying in %.1fs", what, type(exc).__name__, delay)
            time.sleep(delay)
    raise AssertionError("unreachable")


def resolve_uri(uri: str) -> str:
    """sqlite paths become absolute so every process (worker, UI) opens the same database."""
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return "sqlite:///" + str(Path(uri[len("sqlite:///"):]).resolve())
    return uri


class Tracker:
    def __init__(self, tracking_uri: str, experiment: str, artifact_root: str = "mlruns"):
        from mlflow.tracking import MlflowClient

        self.uri = resolve_uri(os.environ.get("TTT_TRACKING_URI") or tracking_uri)
        self.client = MlflowClient(tracking_uri=self.uri)
        self.experiment_name = experiment
        self.artifact_root = artifact_root
        self._experiment_id: str | None = None

    @classmethod
    def from_config(cls, cfg) -> "Tracker":
        return cls(cfg.tracking_uri, cfg.experiment, cfg.artifact_root)

    def check(self) -> None:
        """Fail fast, with the URI and the fix, when the tracking backend cannot be reached."""
        try:
            self.experiment_id  # noqa: B018 - resolves (and creates) the experiment
        except Exception as exc:
            raise PipelineError(
                f"MLflow tracking at {self.uri} is unreachable ({type(exc).__name__})",
                "start the server (make serve) or set tracking.tracking_uri=sqlite:///mlflow.db",
            ) from None

    @property
    def experiment_id(self) -> str:
        if self._experiment_id is None:
            exp = self.client.get_experiment_by_name(self.experiment_name)
            if exp is None:
                location = None
                if not self.uri.startswith(("http://", "https://", "databricks")):
                    location = Path(self.artifact_root).resolve().as_uri()
                try:
                    self._experiment_id = self.client.create_experiment(self.experiment_name, artifact_location=location)
                except Exception:  # created meanwhile by a concurrent run
                    self._experiment_id = self.client.get_experiment_by_name(self.experiment_name).experiment_id
            else:
                self._experiment_id = exp.experiment_id
        return self._experiment_id

    def start(self, name: str | None, tags: dict[str, str] | None = None, parent: str | None = None) -> str:
        tags = dict(tags or {})
        if parent:
            tags["mlflow.parentRunId"] = parent
        run = retry(lambda: self.client.create_run(self.experiment_id, tags=tags, run_name=name), "create_run")
        return run.info.run_id

    def end(self, run_id: str, status: str = "FINISHED") -> None:
        retry(lambda: self.client.set_terminated(run_id, status), "set_terminated")

    def params(self, run_id: str, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k, str(v)[:MAX_PARAM_LEN]) for k, v in params.items() if v is not None]
        for i in range(0, len(items), 90):
            chunk = items[i:i + 90]
            retry(lambda c=chunk: self.client.log_batch(run_id, params=c), "log params")

    def metrics(self, run_id: str, metrics: dict[str, float | None], step: int = 0) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, float(v), now, step) for k, v in metrics.items()
                 if isinstance(v, (int, float)) and v == v]
        for i in range(0, len(items), 900):
            chunk = items[i:i + 900]
            retry(lambda c=chunk: self.client.log_batch(run_id, metrics=c), "log metrics")

    def series(self, run_id: str, key: str, values: list[float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(key, float(v), now, i) for i, v in enumerate(values)]
        for i in range(0, len(items), 900):
            chunk = items[i:i + 900]
            retry(lambda c=chunk: self.client.log_batch(run_id, metrics=c), f"log {key}")

    def tags(self, run_id: str, tags: dict[str, str]) -> None:
        from mlflow.entities import RunTag

        retry(lambda: self.client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()]), "tags")

    def artifact(self, run_id: str, path: str | Path, artifact_path: str | None = None) -> None:
        p = Path(path)
        if p.is_dir():
            retry(lambda: self.client.log_artifacts(run_id, str(p), artifact_path), "log_artifacts")
        else:
            retry(lambda: self.client.log_artifact(run_id, str(p), artifact_path), "log_artifact")

    def text(self, run_id: str, text: str, name: str) -> None:
        retry(lambda: self.client.log_text(run_id, text, name), "log_text")

    def dict(self, run_id: str, obj: Any, name: str) -> None:
        retry(lambda: self.client.log_dict(run_id, obj, name), "log_dict")

    def dataset(self, run_id: str, name: str, digest: str, source: str, context: str) -> None:
        from mlflow.entities import Dataset, DatasetInput, InputTag

        ds = DatasetInput(Dataset(name=name, digest=digest[:36], source_type="local", source=source),
                          tags=[InputTag("mlflow.data.context", context)])
        retry(lambda: self.client.log_inputs(run_id, datasets=[ds]), "log_inputs")

    def children(self, parent: str) -> list:
        return self.client.search_runs([self.experiment_id], f"tags.mlflow.parentRunId = '{parent}'")

    def ui_command(self) -> str:
        if self.uri.startswith(("http://", "https://")):
            return f"open {self.uri}"
        return f"mlflow ui --backend-store-uri {self.uri} --host 127.0.0.1 --port 5000"
