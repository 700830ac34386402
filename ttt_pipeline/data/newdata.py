"""New labelled reviews for the nightly re-evaluation (`nightly.data_path`): reviews that arrived since training.

The source is a file, a folder whose newest data file is read (a drop folder that grows by one export a day), or
any source `data.path` accepts (an MDSD folder, gdown://, hf://). Rows are cleaned as the download step cleans
them (data's text/label columns and label_map) and the labels are encoded against the champion's classes, so a
class the champion does not know stops the night with the file named.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ttt_pipeline.data import labels as L
from ttt_pipeline.data.prepare import _clean, _columns
from ttt_pipeline.data.readers import SUFFIXES
from ttt_pipeline.data.sources import existing_local, load_source
from ttt_pipeline.errors import DataError

FIELD = "nightly.data_path"


def resolve(path: str) -> str:
    """The source to read: a local folder holding data files -> its newest file (by modification time, then
    name); anything else as given."""
    p = existing_local(path, FIELD)
    if p is None:
        return path
    if p.is_dir():
        files = [f for f in p.iterdir() if f.is_file() and f.suffix.lower() in SUFFIXES]
        if files:
            return str(max(files, key=lambda f: (f.stat().st_mtime, f.name)))
    return str(p)


def read_new_reviews(path: str, data_cfg, label_names: list[str], raw_dir: Path) -> tuple[pd.DataFrame, str]:
    """(frame with `text` and `label` as class ids of `label_names`, the source actually read)."""
    source = resolve(path)
    frames, _ = load_source(source, raw_dir, data_cfg.pt_columns)
    stats: dict = {}
    parts = []
    for split, frame in frames.items():
        where = f"{FIELD} {source}" + ("" if split == "all" else f" [{split}]")
        if len(frame) == 0:
            continue
        parts.append(_clean(_columns(frame, data_cfg, where), data_cfg, where, stats))
    if not parts:
        raise DataError(f"{FIELD} {source}: no reviews", "point nightly.data_path at labelled reviews, or set it to null")
    frame = pd.concat(parts, ignore_index=True)
    return frame.assign(label=L.encode(frame["label"].tolist(), list(label_names), source)), source
