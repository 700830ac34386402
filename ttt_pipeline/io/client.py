"""An MLflow client for reading runs and models: the commands (report, compare, explain, predict) and the model
loader open the same store the same way, and a missing or silent store is an error with its fix, never a new
empty one."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

from ttt_pipeline.errors import PipelineError


def default_tracking_uri() -> str:
    """$TTT_TRACKING_URI, else $MLFLOW_TRACKING_URI, else the demo preset's (`sqlite:///mlflow.db` here)."""
    from ttt_pipeline.io.tracking import env_tracking_uri

    env = env_tracking_uri()
    if env:
        return env
    from ttt_pipeline.config import load_config

    return load_config("demo").tracking.tracking_uri


def open_client(uri: str):
    """An MlflowClient on a backend that exists and answers; PipelineError with the fix otherwise."""
    from mlflow.tracking import MlflowClient

    from ttt_pipeline.io.tracking import resolve_uri

    uri = resolve_uri(uri)
    if uri.startswith("sqlite:///"):
        path = Path(uri[len("sqlite:///"):])
        if not path.is_file():
            raise PipelineError(f"no MLflow database at {path}",
                                "run `ttt-pipeline run` in this folder first, or pass --tracking-uri")
    elif uri.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=5) as r:
                r.read()
        except (urllib.error.URLError, OSError) as exc:
            raise PipelineError(f"MLflow tracking at {uri} is unreachable ({getattr(exc, 'reason', exc)})",
                                "start the servers (make servers) or pass --tracking-uri sqlite:///mlflow.db") from None
    return MlflowClient(tracking_uri=uri), uri
