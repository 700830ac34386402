"""The package version (a leaf module: the core reads it without importing the package's public face)."""

__version__ = "0.1.0"
