"""MLflow tracking through the client API: explicit URI, one parent run per pipeline run, a child per stage.

Using `MlflowClient` (no global active run) keeps logging safe from Prefect's worker threads. Tracking calls
are retried with backoff on transient errors; a tracking server that is down at start fails the run at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

from ttt_pipeline.errors import PipelineError, redact  # noqa: F401  (redact: callers of tracking use it)

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


@contextlib.contextmanager
def _fast_http(timeout_s: str = "5", retries: str = "0"):
    """MLflow's own HTTP retries (7, with backoff) take minutes on a dead server; the start check needs seconds.
    Values the user set explicitly are kept."""
    keys = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": retries, "MLFLOW_HTTP_REQUEST_TIMEOUT": timeout_s}
    saved = {k: os.environ.get(k) for k in keys}
    for k, v in keys.items():
        os.environ.setdefault(k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)


TRACKING_URI_VARIABLES = ("TTT_TRACKING_URI", "MLFLOW_TRACKING_URI")


def env_tracking_uri() -> str | None:
    """The tracking URI this environment sets, which overrides `tracking.tracking_uri` of every run started in
    it (a worker, a shell after `source .run/env`): $TTT_TRACKING_URI, else MLflow's own $MLFLOW_TRACKING_URI."""
    for name in TRACKING_URI_VARIABLES:
        value = os.environ.get(name, "").strip()
        if value:
            return value
    return None


def resolve_uri(uri: str) -> str:
    """sqlite paths become absolute so every process (worker, UI) opens the same database."""
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return "sqlite:///" + str(Path(uri[len("sqlite:///"):]).resolve())
    return uri


_OPEN: dict[str, Any] = {}  # run id -> client, for the runs this process started and has not ended


def end_open_runs(status: str = "KILLED") -> list[str]:
    """Mark every run this process left open (children first) as `status`, once, without retries: what a
    stopped process does in its last second, so that MLflow does not show the run as running forever."""
    ended = []
    for run_id, client in reversed(list(_OPEN.items())):
        try:
            client.set_terminated(run_id, status)
            ended.append(run_id)
        except Exception:  # noqa: BLE001 - best effort on the way out; the store is what resumes
            pass
        _OPEN.pop(run_id, None)
    return ended


class Tracker:
    def __init__(self, tracking_uri: str, experiment: str, artifact_root: str = "mlruns"):
        from mlflow.tracking import MlflowClient

        self.uri = resolve_uri(env_tracking_uri() or tracking_uri)
        for name in ("mlflow.store.db.utils", "alembic"):  # schema-creation chatter on a new sqlite store
            logging.getLogger(name).setLevel(logging.WARNING)
        if self.uri.startswith("sqlite:///") and ":memory:" not in self.uri:
            from filelock import FileLock

            # The client migrates a new database as it opens it; two runs starting at once would both
            # migrate it ("duplicate column name"). One at a time: the second finds it up to date.
            db = Path(self.uri[len("sqlite:///"):])
            db.parent.mkdir(parents=True, exist_ok=True)
            with FileLock(f"{db}-init.lock"):
                self.client = MlflowClient(tracking_uri=self.uri)
        else:
            self.client = MlflowClient(tracking_uri=self.uri)
        self.experiment_name = experiment
        self.artifact_root = artifact_root
        self._experiment_id: str | None = None

    @classmethod
    def from_config(cls, cfg) -> "Tracker":
        return cls(cfg.tracking_uri, cfg.experiment, cfg.artifact_root)

    def check(self) -> None:
        """Fail fast, with the URI and the fix, when the tracking backend cannot be reached."""
        failure = "unknown error"
        with _fast_http():
            for attempt in range(2):  # one quiet second try: a blip must not stop a run, a dead server fails fast
                try:
                    self.experiment_id  # noqa: B018 - resolves (and creates) the experiment
                    return
                except Exception as exc:  # MLflow raises many types for an unreachable store
                    failure = type(exc).__name__
                    log.debug("MLflow check %d failed: %r", attempt + 1, exc)
                    if attempt == 0:
                        time.sleep(0.5)
        raise PipelineError(
            f"MLflow tracking at {redact(self.uri)} is unreachable ({failure})",
            "start the servers (make servers) or set tracking.tracking_uri=sqlite:///mlflow.db",
        )

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
        _OPEN[run.info.run_id] = self.client
        return run.info.run_id

    def end(self, run_id: str, status: str = "FINISHED") -> None:
        retry(lambda: self.client.set_terminated(run_id, status), "set_terminated")
        _OPEN.pop(run_id, None)

    def params(self, run_id: str, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k, redact(str(v))[:MAX_PARAM_LEN]) for k, v in params.items() if v is not None]
        for i in range(0, len(items), 90):
            chunk = items[i:i + 90]
            retry(lambda c=chunk: self.client.log_batch(run_id, params=c), "log params")

    def metrics(self, run_id: str, metrics: dict[str, float | None], step: int = 0,
                model_id: str | None = None) -> None:
        """Metrics of the run; with `model_id` also of that MLflow 3 logged model (`mlflow.search_logged_models`
        filters and orders models by them)."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, float(v), now, step, model_id=model_id) for k, v in metrics.items()
                 if isinstance(v, (int, float)) and v == v]
        skipped = sorted(k for k, v in metrics.items() if v is not None and not (isinstance(v, (int, float)) and v == v))
        if skipped:  # NaN or non-numbers cannot be compared across runs: say so, never drop them silently
            log.warning("MLflow: metrics %s of run %s are NaN or not numbers; not logged", skipped, run_id)
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

        retry(lambda: self.client.log_batch(run_id, tags=[RunTag(k, redact(str(v))) for k, v in tags.items()]),
              "tags")

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
            return f"open {redact(self.uri)}"
        return f"mlflow ui --backend-store-uri {self.uri} --host 127.0.0.1 --port 5000"
