"""Classifying a file of reviews with a trained model, under any defense (the `ttt-pipeline predict` command).

Input: CSV, TSV, JSON Lines, JSON (a list of objects), Parquet, or a text file (one review per line); the
review is in `--text-column` (default `text`). Every row is read and checked before the model is loaded: rows
without a usable text are listed with their line numbers (row numbers for JSON lists and Parquet) and stop the
command, unless --skip-bad-rows. Output (by its suffix: .jsonl, .json, .csv, .tsv, .parquet): the input rows,
in order, with `label`, `probability` and `probabilities` (class -> probability; a JSON string in CSV/TSV)
added; an input field of one of those names is kept as `input_<name>`. The output file appears only complete
(written beside it, then renamed): an error leaves no partial file.

Streaming: the input is read twice, in chunks of CHUNK_ROWS rows (Parquet by record batches): once to check
every row, then to classify and write chunk by chunk, so memory does not grow with the file. The records come
from `ttt_pipeline.data.records`, which shares the training data's encoding check and JSON layouts. Chunks are whole
model batches (`ttt.batch_size`), so each batch, and each prediction, is the one a single pass would give. Two
exceptions read the whole input at once: a JSON file (one array: JSON Lines streams) and online TTT
(`ttt.online`, whose adapted weights carry from batch to batch over the whole input).
"""

from __future__ import annotations

import csv
import json
import os
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from ttt_pipeline.data.records import STREAMED, records
from ttt_pipeline.errors import ConfigError, DataError

INPUTS = STREAMED
OUTPUTS = (".jsonl", ".json", ".csv", ".tsv", ".parquet")
ADDED = ("label", "probability", "probabilities")
LISTED = 10  # bad rows named in a message
# What errors call the inputs: the function's own parameters; the command line passes its flags instead
# (`cli/predict.FLAGS`), so io names no command-line flag of its own.
Report = Callable[[str], None]
ProgressFactory = Callable[[int], Any]  # total -> a callback (done, total) with .close()
NAMES = {"input": "inp", "output": "outp", "skip_bad_rows": "skip_bad_rows=True", "set": "settings",
         "method": "method"}
CHUNK_ROWS = 1024  # rows read, classified and written at a time (rounded down to whole batches, at least one)


@dataclass
class Rows:
    """What was read: the good rows (with their texts and where they came from) and the bad ones."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    where: list[str] = field(default_factory=list)
    bad: list[tuple[str, str]] = field(default_factory=list)  # (line 7, why)
    columns: list[str] = field(default_factory=list)
    counted: int = 0  # good rows counted but not kept (scan_rows)

    @property
    def good(self) -> int:
        return len(self.texts) + self.counted

    def add(self, where: str, row: dict[str, Any], text: Any, column: str) -> None:
        if column not in row:
            self.bad.append((where, f"no '{column}' field"))
        elif _missing(text):
            self.bad.append((where, f"'{column}' is empty"))
        elif not isinstance(text, str):
            self.bad.append((where, f"'{column}' is a {type(text).__name__}, not text"))
        elif not text.strip():
            self.bad.append((where, f"'{column}' is blank"))
        else:
            self.rows.append(row)
            self.texts.append(text)
            self.where.append(where)
        for k in row:
            if k not in self.columns:
                self.columns.append(k)


def _missing(value: Any) -> bool:
    """None, NaN, pandas' NA."""
    if value is None:
        return True
    try:
        return bool(value != value)
    except (TypeError, ValueError):  # pd.NA has no truth value; arrays are not missing, just not text
        return not hasattr(value, "__len__")


# ---------------------------------------------------------------------- reading


def iter_rows(path: Path, column: str = "text", chunk_rows: int | None = CHUNK_ROWS) -> Iterator[Rows]:
    """The rows of an input file in chunks of at most `chunk_rows` records, good or bad (None: one chunk), in
    file order; each chunk's `columns` are the fields seen so far. File-level problems raise."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file", "check the input file's path")
    suffix = path.suffix.lower()
    if suffix not in INPUTS:
        raise DataError(f"{path}: unsupported input type '{suffix}'", f"use one of {', '.join(INPUTS)}")
    if path.stat().st_size == 0:
        raise DataError(f"{path}: the file is empty", "give a file with reviews")
    out = Rows()
    for where, row, why in records(path, column, chunk_rows or CHUNK_ROWS):
        if row is None:
            out.bad.append((where, why))
        else:
            out.add(where, row, row.get(column), column)
        if chunk_rows and len(out.rows) + len(out.bad) >= chunk_rows:
            yield out
            out = Rows(columns=list(out.columns))
    yield out


def read_rows(path: Path, column: str = "text") -> Rows:
    """Every row of an input file, each good or bad (with where and why); file-level problems raise."""
    return next(iter_rows(path, column, None))


def scan_rows(path: Path, column: str = "text") -> Rows:
    """The bad rows, the fields and the number of good rows of a file, read in chunks (its rows are not kept)."""
    out = Rows()
    good = 0
    for chunk in iter_rows(path, column):
        out.bad += chunk.bad
        out.columns = chunk.columns
        good += chunk.good
    out.counted = good
    return out


def check_rows(path: Path, rows: Rows, skip_bad: bool, names: dict[str, str] = NAMES) -> None:
    """Bad rows stop the command (named with their line numbers), unless they are to be skipped."""
    if rows.bad and not skip_bad:
        listed = "; ".join(f"{w}: {why}" for w, why in rows.bad[:LISTED])
        more = f"; and {len(rows.bad) - LISTED} more" if len(rows.bad) > LISTED else ""
        raise DataError(f"{path}: {len(rows.bad)} bad row(s): {listed}{more}",
                        f"fix those rows, or pass {names['skip_bad_rows']} to classify the others (the skipped "
                        "rows are listed)")
    if not rows.good:
        raise DataError(f"{path}: no reviews to classify" + (f" ({len(rows.bad)} bad row(s))" if rows.bad else ""),
                        "give at least one row with a review text")


# ---------------------------------------------------------------------- writing


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):  # numpy scalars and arrays
        return value.tolist()
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return str(value)


def merge(row: dict[str, Any], prediction: dict[str, Any]) -> dict[str, Any]:
    """The input row with the prediction's fields added; a clashing input field becomes input_<name>."""
    out = {(f"input_{k}" if k in ADDED else k): v for k, v in row.items()}
    out.update(prediction)
    return out


@contextmanager
def atomic_output(path: Path) -> Iterator[Path]:
    """A temporary path beside `path`, renamed onto it when the block succeeds, removed when it fails."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _json_item(row: dict[str, Any]) -> str:
    """A row as json.dump(rows, indent=1) writes it inside the list: indented one more level."""
    return " " + json.dumps(row, ensure_ascii=False, default=_jsonable, indent=1).replace("\n", "\n ")


class _ParquetChunks:
    """Chunks appended to one Parquet file (pyarrow's ParquetWriter), each converted by pandas as to_parquet
    does; the first chunk fixes the schema (a column that is all null there is taken as text)."""

    def __init__(self, path: Path, columns: list[str]):
        self.path, self.columns, self.writer = path, columns, None

    def write(self, rows: list[dict[str, Any]]) -> None:
        import pandas as pd
        import pyarrow as pa
        import pyarrow.parquet as pq

        frame = pd.DataFrame(rows, columns=self.columns)
        if self.writer is None:
            schema = pa.Schema.from_pandas(frame, preserve_index=False)
            for i, f in enumerate(schema):
                if pa.types.is_null(f.type):
                    schema = schema.set(i, f.with_type(pa.string()))
            self.writer = pq.ParquetWriter(self.path, schema)
        try:
            table = pa.Table.from_pandas(frame, schema=self.writer.schema, preserve_index=False)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise DataError(f"{self.path.name}: a column changes type between rows ({exc})",
                            "write .jsonl or .csv output, or give the column one type") from None
        self.writer.write_table(table)

    def close(self) -> None:
        if self.writer is None:  # no rows: the empty table pandas writes
            import pandas as pd

            pd.DataFrame([], columns=self.columns).to_parquet(self.path, index=False)
        else:
            self.writer.close()


@contextmanager
def open_output(path: Path, columns: list[str]) -> Iterator[Callable[[list[dict[str, Any]]], None]]:
    """A function that appends rows (merged input rows and predictions) to the output; the file appears, complete,
    when the block succeeds (atomic_output), and never when it fails."""
    suffix = path.suffix.lower()
    columns = [(f"input_{c}" if c in ADDED else c) for c in columns] + list(ADDED)
    with atomic_output(path) as tmp:
        if suffix == ".parquet":
            chunks = _ParquetChunks(tmp, columns)
            try:
                yield chunks.write
            finally:
                chunks.close()
            return
        with open(tmp, "w", encoding="utf-8", newline="") as f:
            first = [True]
            if suffix == ".json":
                f.write("[")
            elif suffix != ".jsonl":
                w = csv.DictWriter(f, fieldnames=columns, delimiter="\t" if suffix == ".tsv" else ",",
                                   extrasaction="ignore")
                w.writeheader()

            def write(rows: list[dict[str, Any]]) -> None:
                if suffix == ".jsonl":
                    f.writelines(json.dumps(r, ensure_ascii=False, default=_jsonable) + "\n" for r in rows)
                elif suffix == ".json":
                    for r in rows:
                        f.write(("\n" if first[0] else ",\n") + _json_item(r))
                        first[0] = False
                else:
                    w.writerows({k: (json.dumps(v, ensure_ascii=False, default=_jsonable)
                                     if isinstance(v, (dict, list)) else v) for k, v in r.items()} for r in rows)
            yield write
            if suffix == ".json":
                f.write("]" if first[0] else "\n]")
            f.flush()
            os.fsync(f.fileno())


def write_rows(path: Path, rows: list[dict[str, Any]], columns: list[str]) -> None:
    with open_output(path, columns) as write:
        write(rows)


# ---------------------------------------------------------------------- classifying


def ttt_overrides(items: list[str], names: dict[str, str] = NAMES) -> dict[str, Any]:
    """`ttt.steps=3` -> {"steps": 3}; only ttt.* inference settings (the method is given on its own)."""
    from ttt_pipeline.classifier import inference_fields
    from ttt_pipeline.config import MOVED_KEYS, apply_overrides, flatten

    data = apply_overrides({}, items)
    other = sorted(k for k in data if k != "ttt")
    if other:
        raise ConfigError(f"{names['set']} {other[0]}.*: predict takes only ttt.* settings",
                          "the model is trained; set inference settings such as ttt.steps=3 or ttt.lr=1e-4")
    ttt = data.get("ttt", {})
    if not isinstance(ttt, dict):
        raise ConfigError(f"{names['set']} ttt: give a field, e.g. ttt.steps=3",
                          f"use {names['set']} ttt.<field>=<value>")
    if "methods" in ttt:
        raise ConfigError(f"{names['set']} ttt.methods: predict applies one method",
                          f"use {names['method']}, e.g. {names['method']} masked_ttt")
    fields, ttt = inference_fields(), flatten(ttt)
    unknown = sorted(set(ttt) - set(fields))
    if unknown and unknown[0] in MOVED_KEYS:
        raise ConfigError(f"{names['set']} ttt.{unknown[0]}: moved", f"use ttt.{MOVED_KEYS[unknown[0]]}")
    if unknown:
        raise ConfigError(f"{names['set']} ttt.{unknown[0]}: not an inference setting",
                          f"settings are ttt.{', ttt.'.join(fields)}")
    return ttt


def _check_settings(method: str | None, overrides: dict[str, Any]) -> None:
    """The method name and the --set values on their own, before any file is read or model loaded (the
    model's configuration is merged and checked again after loading)."""
    from pydantic import ValidationError

    from ttt_pipeline.classifier import settings_error
    from ttt_pipeline.config import TTTConfig, nest

    try:
        TTTConfig.model_validate({**nest(overrides), "methods": [method or "none"]})
    except ValidationError as exc:
        raise ConfigError(f"invalid inference settings: {settings_error(exc)}",
                          "see `ttt-pipeline config --schema` (section ttt) for the allowed values") from None


def classify_file(model: str, inp: str | Path, outp: str | Path, *, text_column: str = "text",
                  method: str | None = None, settings: Sequence[str] = (), skip_bad_rows: bool = False,
                  tracking_uri: str | None = None, device: str = "auto", capture: str | None = None,
                  capture_text: bool = True, names: dict[str, str] = NAMES, report: Report | None = None,
                  progress: ProgressFactory | None = None) -> dict[str, Any]:
    """Classify every review of `inp` into `outp` (complete, or not at all); every row and setting is checked
    before the model loads. `capture`: also record each review into that traffic store (a folder or fsspec URL;
    io.traffic_recorder), its text unless `capture_text` is false. Returns the summary (counts, timings, the
    settings applied, and what was captured). `report` receives the lines a user reads (the skipped rows, the
    closing line), `progress(total)` makes a callback `(done, total)` with a `close()`: the caller's, which prints;
    `names` are what errors call the inputs (the command line's flags)."""
    inp, outp = Path(inp).expanduser(), Path(outp).expanduser()
    if outp.suffix.lower() not in OUTPUTS:
        raise ConfigError(f"{names['output']} {outp}: unsupported type '{outp.suffix}'",
                          f"use one of {', '.join(OUTPUTS)}")
    if outp.resolve() == inp.resolve():
        raise ConfigError(f"{names['output']} is the input file", "write the predictions to another file")
    overrides = ttt_overrides(list(settings), names)
    report = report or (lambda line: None)
    _check_settings(method, overrides)
    scan = scan_rows(inp, text_column)  # every row is checked before the model loads
    check_rows(inp, scan, skip_bad_rows, names)
    for where, why in scan.bad[:LISTED]:
        report(f"skipped {inp.name} {where}: {why}")
    if len(scan.bad) > LISTED:
        report(f"skipped {len(scan.bad) - LISTED} more bad rows")

    from ttt_pipeline.io.mlflow_model import load_classifier
    from ttt_pipeline.modeling.train import set_threads

    set_threads()
    _quiet_transformers()
    t0 = time.perf_counter()
    clf = load_classifier(model, device=device, tracking_uri=tracking_uri)
    method, ttt = clf.settings(method, **overrides)  # validated before the long part
    clf.prepare(method, **overrides)  # spell's dictionary: loading, not classifying
    recorder = _recorder(clf, model, capture, capture_text, tracking_uri)
    load_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    try:
        counts = _predict_file(clf, inp, outp, scan, text_column, progress, method, ttt, overrides, recorder)
    finally:
        if recorder is not None:
            recorder.close()  # what is queued is written before the command ends
    predict_s = time.perf_counter() - t1
    n = sum(counts.values())
    rate = n / predict_s if predict_s > 0 else float("inf")
    report(f"{n} reviews classified with {method} in {predict_s:.1f} s ({rate:.1f} reviews/s; model "
           f"loaded in {load_s:.1f} s){f', {len(scan.bad)} bad rows skipped' if scan.bad else ''} -> {outp}")
    return {"output": str(outp), "n": n, "skipped": [w for w, _ in scan.bad],
            "method": method, "model": clf.source, "labels": counts, "load_s": round(load_s, 3),
            "predict_s": round(predict_s, 3), "reviews_per_s": round(rate, 2),
            "settings": _applied(ttt, overrides),
            **({"capture": {"uri": recorder.settings.uri, **recorder.stats()}} if recorder is not None else {})}


def _recorder(clf, model: str, capture: str | None, capture_text: bool, tracking_uri: str | None):
    """The traffic recorder of `--capture URI` (None without), naming the model as the registry does."""
    if not capture:
        return None
    from ttt_pipeline.io.mlflow_model import model_identity
    from ttt_pipeline.io.traffic_recorder import CaptureSettings, TrafficRecorder
    from ttt_pipeline.monitoring import traffic_location

    name, version = model_identity(model, tracking_uri)
    recorder = TrafficRecorder(clf, CaptureSettings(traffic_location(capture), capture_text, name, version))
    clf.prepare(recorder.descriptor_method)
    return recorder


def _applied(ttt, overrides: dict[str, Any]) -> dict[str, Any]:
    """The validated value of each `--set` setting, by its flat name (`spell.max_edit_distance`)."""
    from ttt_pipeline.config import flatten

    flat = flatten(ttt)
    return {k: flat[k] for k in overrides}


def chunk_size(ttt) -> int | None:
    """Rows per chunk: CHUNK_ROWS rounded down to whole batches (at least one), so batches are those of one pass;
    None (the whole input) for online TTT, whose adapted weights carry over the whole stream."""
    if getattr(ttt, "online", False):
        return None
    batch = max(int(getattr(ttt, "batch_size", 1)), 1)
    return max(CHUNK_ROWS // batch, 1) * batch


def _predict_file(clf, inp: Path, outp: Path, scan: Rows, text_column: str, progress, method: str, ttt,
                  overrides, recorder=None) -> dict[str, int]:
    """Classify the input chunk by chunk into the output (complete, or not at all), each chunk recorded by
    `recorder` when given; returns the label counts."""
    bar = progress(scan.good) if progress is not None else _Silent()
    counts: dict[str, int] = {}
    done = 0
    try:
        with open_output(outp, scan.columns) as write:
            for chunk in iter_rows(inp, text_column, chunk_size(ttt)):
                if not chunk.texts:
                    continue
                progress = lambda k, _n, at=done: bar(at + k, scan.good)  # noqa: E731
                preds = (clf.predict(chunk.texts, method, progress, **overrides) if recorder is None else
                         recorder.predict(chunk.texts, method, overrides, progress))
                write([merge(r, p) for r, p in zip(chunk.rows, preds)])
                done += len(preds)
                for p in preds:
                    counts[p["label"]] = counts.get(p["label"], 0) + 1
    finally:
        bar.close()
    return counts


class _Silent:
    """The progress callback of a caller that shows none."""

    def __call__(self, done: int, total: int) -> None:
        pass

    def close(self) -> None:
        pass


def _quiet_transformers() -> None:
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except Exception:  # only cosmetics
        pass
