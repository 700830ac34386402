"""Robust review classification with test-time defenses: the pure library (no Prefect).

Packages: `data`, `corruption`, `modeling`, `defenses`, `evaluation` (the pure core), `io` (MLflow, remote
store, plots, reports, batch prediction). docs/architecture.md draws the layers.
"""

from ttt_pipeline.version import __version__

__all__ = ["__version__", "load_classifier", "Classifier"]


def __getattr__(name: str):
    """`from ttt_pipeline import load_classifier` without importing torch at `import ttt_pipeline`."""
    if name == "load_classifier":
        from ttt_pipeline.io.mlflow_model import load_classifier

        return load_classifier
    if name == "Classifier":
        from ttt_pipeline.classifier import Classifier

        return Classifier
    raise AttributeError(f"module 'ttt_pipeline' has no attribute {name!r}")
