"""Readers of the steps' stored outputs."""

from __future__ import annotations

import json
from pathlib import Path

from ttt_pipeline.storage import StepOutput


def read_set(corrupt_out: StepOutput, name: str) -> list[str]:
    with open(Path(corrupt_out.meta["sets"][name]["path"]) / "texts.jsonl", encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def read_predictions(eval_outs: list[StepOutput]):
    """Every evaluate output's per-review predictions as one table (see `_write_predictions`)."""
    import pandas as pd

    return pd.concat([pd.read_parquet(Path(o.path) / "predictions.parquet") for o in eval_outs], ignore_index=True)


def load_results(eval_outs: list[StepOutput]) -> dict:
    rows, samples, names = [], [], []
    for o in eval_outs:
        r = json.loads((Path(o.path) / "results.json").read_text())
        rows += r["rows"]
        samples += r["samples"]
        names = r["label_names"]
    return {"rows": rows, "samples": samples, "label_names": names}


def load_attribution(out: StepOutput) -> dict:
    return json.loads((Path(out.path) / "attribution.json").read_text())
