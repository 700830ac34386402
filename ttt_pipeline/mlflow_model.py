"""Models logged before the package layout name this module as their pyfunc loader; they still load."""

from ttt_pipeline.io.mlflow_model import _load_pyfunc  # noqa: F401
