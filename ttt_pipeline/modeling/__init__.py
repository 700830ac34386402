"""The classifier, its tokenisation, training and precision. Importing it caps oneDNN's primitive cache and
ideep's computation cache (`runtime.cap_primitive_cache`): it must happen before the process's first bf16 operation."""

from ttt_pipeline.modeling.runtime import cap_primitive_cache

cap_primitive_cache()
