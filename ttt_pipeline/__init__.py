"""Robust review classification with masked test-time training: the pure library (no Prefect)."""

__version__ = "0.1.0"

__all__ = ["load_classifier", "Classifier"]


def __getattr__(name: str):
    """`from ttt_pipeline import load_classifier` without importing torch at `import ttt_pipeline`."""
    if name in ("load_classifier", "Classifier"):
        from . import classifier

        return getattr(classifier, name)
    raise AttributeError(f"module 'ttt_pipeline' has no attribute {name!r}")
