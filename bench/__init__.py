"""The benches: measurements the project's figures come from, run from the checkout as modules
(`python -m bench.speed`, ...), so they import each other as `bench.<name>` and the library as installed (or, from
a checkout without one, from the current folder). bench/studies/ holds the one-off studies: a question answered
once, with its rule fixed before the run (docs/benchmarks.md records the answers)."""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent  # the checkout: its .cache, and the MDSD reviews beside it
