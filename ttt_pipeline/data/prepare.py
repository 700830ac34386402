"""The download step: any source -> a validated, split `datasets.DatasetDict` on disk plus its content digest.

Validation happens here, before any training: missing columns, unusable rows, labels outside the classes and
classes too small to split stop the run with a message naming the file and the fix. Empty texts and missing
labels are dropped (counted in the metadata and logged), over-long reviews are cut to `max_text_chars`. With
`group_column`, the test and validation splits move whole groups (every review of a movie on one side).
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import pandas as pd

from ttt_pipeline.data import labels as L
from ttt_pipeline.data.sources import load_source
from ttt_pipeline.data.splits import group_ids, grouped_split, stratified_cap, stratified_split
from ttt_pipeline.errors import DataError

log = logging.getLogger(__name__)
UNLABELLED = "<unlabelled>"  # the label of every row while data.label_column is null (no row is dropped for it)
NO_LABEL = -1  # an unlabelled review's stored label: no class


def _columns(frame: pd.DataFrame, cfg, where: str, grouped: bool = False) -> pd.DataFrame:
    """`text` and `label` (and `group`, the data.group_column, when `grouped`) from the source's columns."""
    have = ", ".join(_printable(str(c)) for c in list(frame.columns)[:12])
    wanted = (cfg.text_column,) if cfg.label_column is None else (cfg.text_column, cfg.label_column)
    missing = [c for c in wanted if c not in frame.columns]
    if missing:
        which = "text_column" if cfg.text_column in missing else "label_column"
        raise DataError(f"{where}: column(s) {missing} not found (columns: {have})",
                        f"set data.{which} to one of the columns, e.g. --set data.{which}=<name>")
    labels = UNLABELLED if cfg.label_column is None else frame[cfg.label_column]
    out = pd.DataFrame({"text": frame[cfg.text_column], "label": labels})
    if grouped:
        if cfg.group_column not in frame.columns:
            raise DataError(f"{where}: column '{_printable(str(cfg.group_column))}' (data.group_column) not found "
                            f"(columns: {have})", "set data.group_column to one of the columns, or to null to split "
                            "row by row")
        out["group"] = [L.canonical(v) for v in frame[cfg.group_column].tolist()]
    return out


def _printable(text: str) -> str:
    """Lone surrogates (from `\\ud800` escapes in JSON) as visible escapes: messages must print as UTF-8."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _clean(frame: pd.DataFrame, cfg, where: str, stats: dict) -> pd.DataFrame:
    texts, labels = [], []
    dropped_text = dropped_label = dropped_map = cut = 0
    label_map = getattr(cfg, "label_map", None)
    unmapped: dict[str, int] = {}  # label value -> first row
    kept: list[int] = []  # positions of the rows kept, for the columns that ride along (group)
    for row, (text, label) in enumerate(zip(frame["text"].tolist(), frame["label"].tolist()), 1):
        if text is None or (isinstance(text, float) and pd.isna(text)) or not L.safe_str(text).strip():
            dropped_text += 1
            continue
        lab = L.canonical(label)
        if lab is None:
            dropped_label += 1
            continue
        if label_map is not None:  # data.label_map: value -> class, None drops the row on purpose
            if lab not in label_map:
                unmapped.setdefault(lab, row)
                continue
            lab = label_map[lab]
            if lab is None:
                dropped_map += 1
                continue
        text = " ".join(L.safe_str(text).split())  # one line, single spaces: reviews carry stray newlines/tabs
        if len(text) > cfg.max_text_chars:
            text = text[: cfg.max_text_chars]
            cut += 1
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise DataError(
                f"{where}: row {row}: the text holds an unpaired surrogate "
                f"({_printable(text[exc.start:exc.end])}), which is not valid Unicode",
                "fix or remove that escape (half of an emoji cut by an exporter, usually)") from None
        texts.append(text)
        labels.append(lab)
        kept.append(row - 1)
    if unmapped:
        values = sorted(unmapped)
        shown = ", ".join(_printable(v) for v in values[:8]) + (", ..." if len(values) > 8 else "")
        first = min(unmapped.values())
        if not texts and not dropped_map:  # no label matched: the map was written for other data (a preset's)
            hint = (f"run with `--set data.label_map=null --set data.label_names=null` to take the classes from the "
                    f"data ({len(values)} values: {shown})")
        else:
            hint = "add the values to data.label_map (null drops their rows), or set data.label_map=null"
        raise DataError(f"{where}: labels {[_printable(v) for v in values[:5]]} (first on row {first}) are not in "
                        f"data.label_map (keys: {sorted(label_map)})", hint)
    stats["dropped_empty_text"] = stats.get("dropped_empty_text", 0) + dropped_text
    stats["dropped_missing_label"] = stats.get("dropped_missing_label", 0) + dropped_label
    stats["truncated_texts"] = stats.get("truncated_texts", 0) + cut
    if label_map is not None:
        stats["dropped_by_label_map"] = stats.get("dropped_by_label_map", 0) + dropped_map
    if not texts:  # before the warning: a failing run prints only its error
        raise DataError(f"{where}: no usable reviews (every row has an empty text or no label)",
                        "check data.text_column / data.label_column and the file's content")
    if dropped_text or dropped_label:
        log.warning("%s: dropped %d empty texts and %d rows without a label", where, dropped_text, dropped_label)
    out = pd.DataFrame({"text": texts, "label": labels})
    if "group" in frame.columns:
        out["group"] = frame["group"].iloc[kept].tolist()
    return out


def _frames(source: str, cfg, raw_dir: Path, stats: dict, grouped: bool = False
            ) -> tuple[dict[str, pd.DataFrame], str]:
    """The source's frames, cleaned; `grouped`: with the data.group_column, for the source that is split."""
    # data.sha256 pins data.path only: the test and shift sources are other files
    frames, digest = load_source(source, raw_dir, cfg.pt_columns, cfg.sha256 if source == cfg.path else None)
    out = {}
    for split, frame in frames.items():
        where = source if split == "all" else f"{source} [{split}]"
        if len(frame) == 0:
            raise DataError(f"{where}: the dataset is empty", "give a source with reviews")
        out[split] = _clean(_columns(frame, cfg, where, grouped), cfg, where, stats)
    return out, digest


def _normalise_split_names(frames: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    alias = {"valid": "validation", "val": "validation", "dev": "validation"}
    return {alias.get(k, k): v for k, v in frames.items()}


def _split_off(base: pd.DataFrame, fraction: float, seed: int, names: list[str], what: str):
    """(rest, split off): stratified by class; with a `group` column, whole groups (group_ids) move together."""
    labels = base["label"].tolist()
    if "group" in base.columns:
        ids = group_ids(base["group"].tolist(), base["text"].tolist())
        keep, taken = grouped_split(labels, ids, fraction, seed, names, what)
    else:
        keep, taken = stratified_split(labels, fraction, seed, names, what)
    return base.iloc[keep].reset_index(drop=True), base.iloc[taken].reset_index(drop=True)


def content_digest(splits: dict[str, pd.DataFrame], names: list[str]) -> str:
    h = hashlib.sha256(json.dumps(names).encode())
    for split in sorted(splits):
        h.update(split.encode())
        for t, y in zip(splits[split]["text"], splits[split]["label"]):
            h.update(f"{y}\t{t}\n".encode())
    return h.hexdigest()


def prepare_dataset(cfg, out_dir: Path, raw_dir: Path) -> dict:
    """Write `out_dir/dataset` (DatasetDict: text, label) and `out_dir/labels.json`; return metadata."""
    from datasets import Dataset, DatasetDict
    from datasets.utils.logging import disable_progress_bar

    disable_progress_bar()
    stats: dict = {}
    frames, raw_digest = _frames(cfg.path, cfg, raw_dir, stats, grouped=cfg.group_column is not None)
    frames = _normalise_split_names(frames)
    if cfg.label_column is None:
        return _prepare_unlabelled(cfg, frames, out_dir, raw_digest, stats)
    # where the test reviews come from: data.test_path, the source's own test split, or split off here (then a
    # model trained elsewhere on the same source may have seen them: `evaluate --model` says so)
    test_from = "test_path" if cfg.test_path else ("source" if "test" in frames else "split")
    if cfg.test_path:
        test_frames, _ = _frames(cfg.test_path, cfg, raw_dir, stats)
        frames = {"train": pd.concat(list(frames.values()) if "train" not in frames else [frames["train"]]),
                  "test": pd.concat(list(test_frames.values()))}
    elif "train" not in frames:
        frames = {"train": pd.concat(list(frames.values()), ignore_index=True)}

    names = [str(n) for n in cfg.label_names] if cfg.label_names else \
        L.infer_label_names([v for f in frames.values() for v in f["label"]], cfg.path)
    if len(names) < 2:
        raise DataError(f"{cfg.path}: only one class ({names}) in the labels",
                        "a classifier needs at least two classes; check data.label_column")
    encoded = {s: f.assign(label=L.encode(f["label"].tolist(), names, cfg.path if s != "test" or not cfg.test_path
                                          else cfg.test_path)).reset_index(drop=True)
               for s, f in frames.items()}

    if "test" not in encoded:
        encoded["train"], encoded["test"] = _split_off(encoded["train"], cfg.test_fraction, cfg.split_seed, names,
                                                       "test")
    if "validation" not in encoded and cfg.val_fraction > 0:
        encoded["train"], encoded["validation"] = _split_off(encoded["train"], cfg.val_fraction, cfg.split_seed + 1,
                                                             names, "validation")

    caps = {"train": cfg.max_train_samples, "test": cfg.max_test_samples,
            "validation": cfg.max_test_samples}
    for split, cap in caps.items():
        if split in encoded and cap is not None:
            idx = stratified_cap(encoded[split]["label"].tolist(), cap, cfg.split_seed + 2)
            encoded[split] = encoded[split].iloc[idx].reset_index(drop=True)

    for name, source in cfg.shift.items():
        shift_frames, _ = _frames(source, cfg, raw_dir, stats)
        frame = pd.concat(list(shift_frames.values()), ignore_index=True)
        frame = frame.assign(label=L.encode(frame["label"].tolist(), names, source))
        idx = stratified_cap(frame["label"].tolist(), cfg.max_test_samples, cfg.split_seed + 3)
        encoded[f"shift_{name}"] = frame.iloc[idx].reset_index(drop=True)

    keep_splits = {s: f for s, f in encoded.items() if s in ("train", "validation", "test") or s.startswith("shift_")}
    for split in ("train", "test"):
        if len(keep_splits.get(split, [])) == 0:
            raise DataError(f"{cfg.path}: the {split} split is empty", "give more reviews or change the split fractions")

    dd = DatasetDict({s: Dataset.from_pandas(f[["text", "label"]], preserve_index=False) for s, f in keep_splits.items()})
    dd.save_to_disk(str(Path(out_dir) / "dataset"))
    (Path(out_dir) / "labels.json").write_text(json.dumps(dict(enumerate(names)), indent=2))
    counts = {s: {names[c]: int((f["label"] == c).sum()) for c in range(len(names))} for s, f in keep_splits.items()}
    return {
        "label_names": names,
        "num_labels": len(names),
        "sizes": {s: len(f) for s, f in keep_splits.items()},
        "test_from": test_from,
        "class_counts": counts,
        "content_digest": content_digest(keep_splits, names),
        "raw_digest": raw_digest,
        **({"groups": {s: int(f["group"].nunique()) for s, f in keep_splits.items() if "group" in f.columns}}
           if cfg.group_column else {}),
        **stats,
    }


def _prepare_unlabelled(cfg, frames: dict[str, pd.DataFrame], out_dir: Path, raw_digest: str, stats: dict) -> dict:
    """data.label_column null: every review of data.path (each split of it, cut to max_test_samples by a seeded
    draw) is a test review labelled NO_LABEL, for `evaluate --model`'s label-free figures; there is no train split
    (nothing is trained; `datasets` cannot store an empty one), and `labelled` is false in the metadata."""
    import numpy as np
    from datasets import Dataset, DatasetDict

    test = pd.concat(list(frames.values()), ignore_index=True)[["text"]]
    if cfg.max_test_samples is not None and len(test) > cfg.max_test_samples:
        keep = np.sort(np.random.default_rng(cfg.split_seed + 2).choice(len(test), cfg.max_test_samples, replace=False))
        test = test.iloc[keep].reset_index(drop=True)
    splits = {"test": test.assign(label=NO_LABEL)}
    DatasetDict({s: Dataset.from_pandas(f, preserve_index=False) for s, f in splits.items()}).save_to_disk(
        str(Path(out_dir) / "dataset"))
    names = [str(n) for n in cfg.label_names]
    (Path(out_dir) / "labels.json").write_text(json.dumps(dict(enumerate(names)), indent=2))
    return {"label_names": names, "num_labels": len(names), "labelled": False, "sizes": {"test": len(test)},
            "class_counts": {},  # no labels, no classes counted
            "test_from": "source",  # the reviews are the source's own: no model was trained on them here
            "content_digest": content_digest(splits, names), "raw_digest": raw_digest, **stats}


def load_prepared(path: str | Path):
    from datasets import load_from_disk

    path = Path(path)
    return load_from_disk(str(path / "dataset")), json.loads((path / "labels.json").read_text())
