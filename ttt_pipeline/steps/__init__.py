"""The pipeline's steps as pure functions: (config section, upstream StepOutputs) -> StepOutput.

download -> tokenise -> finetune (or import-model), corrupt -> evaluate (-> calibrate, -> attribute), and
new-reviews for the nightly check: one module per step (`<step>_step.py`), their cache keys in `keys.py` (the
hash of the step's code version, its config section and its inputs' digests, so an unchanged re-run returns the
stored output without work and any change upstream rebuilds downstream), the readers of stored outputs in
`outputs.py`, the machine choices in `machine.py` and the out-of-memory hints in `guards.py`. No Prefect and no
MLflow here: `ttt_pipeline/tasks/` adds orchestration and tracking around these.
"""

from ttt_pipeline.steps.attribute_step import attribute, model_checkpoints
from ttt_pipeline.steps.calibrate_step import (
    calibrate,
    calibration_skip_reason,
    calibration_suite,
    calibration_summary,
    read_calibration,
)
from ttt_pipeline.steps.contents import kept
from ttt_pipeline.steps.corrupt_step import corrupt
from ttt_pipeline.steps.download_step import download
from ttt_pipeline.steps.evaluate_step import evaluate, evaluated_config, model_length, test_sets
from ttt_pipeline.steps.finetune_step import finetune, unlabeled_texts
from ttt_pipeline.steps.guards import guarded, memory_hint
from ttt_pipeline.steps.import_model_step import import_model
from ttt_pipeline.steps.keys import (
                                     VERSIONS,
                                     attribute_inputs,
                                     calibrate_inputs,
                                     corrupt_inputs,
                                     download_inputs,
                                     evaluate_inputs,
                                     finetune_inputs,
                                     import_inputs,
                                     new_reviews_inputs,
                                     stored,
                                     tokenise_inputs,
                                     version,
                                     wants_mlm,
)
from ttt_pipeline.steps.machine import runtime
from ttt_pipeline.steps.new_reviews_step import score_new_reviews
from ttt_pipeline.steps.outputs import load_attribution, load_results, read_predictions, read_set
from ttt_pipeline.steps.report_step import flip_report
from ttt_pipeline.steps.tokenise_step import tokenise
from ttt_pipeline.storage import StepOutput, StepStore

__all__ = ["VERSIONS", "StepOutput", "StepStore", "attribute", "attribute_inputs", "calibrate", "calibrate_inputs",
           "calibration_skip_reason", "calibration_suite", "calibration_summary", "corrupt", "corrupt_inputs",
           "download", "download_inputs", "evaluate", "evaluate_inputs", "evaluated_config", "finetune",
           "finetune_inputs", "flip_report", "guarded", "import_inputs", "import_model", "kept", "load_attribution",
           "load_results", "memory_hint", "model_checkpoints", "model_length", "new_reviews_inputs", "read_calibration",
           "read_predictions", "read_set", "runtime", "score_new_reviews", "stored", "test_sets", "tokenise",
           "tokenise_inputs", "unlabeled_texts", "version", "wants_mlm"]
