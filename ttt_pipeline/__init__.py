"""Robust review classification with masked test-time training: the pure library (no Prefect)."""

__version__ = "0.1.0"
