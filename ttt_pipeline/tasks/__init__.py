"""Prefect tasks: one thin wrapper per pipeline step (cache policy, retries, progress, MLflow logging)."""

from .attribution import attribute_task
from .model_registry import register_task
from .step_tasks import (
    calibrate_task,
    corrupt_task,
    download_task,
    evaluate_task,
    finetune_task,
    import_model_task,
    log_calibration_task,
    log_step_task,
    new_reviews_task,
    report_task,
    tokenise_task,
)

__all__ = ["download_task", "tokenise_task", "finetune_task", "corrupt_task", "evaluate_task", "log_step_task",
           "register_task", "attribute_task", "import_model_task", "new_reviews_task",
           "calibrate_task", "log_calibration_task", "report_task"]
