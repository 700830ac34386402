"""Review files read record by record, for batch prediction: CSV, TSV, JSON Lines, JSON, Parquet and plain text
(one review per line). Memory does not grow with the file, and a bad record is reported, not raised, so the caller
can list every bad row with its line number before any work. File-level problems (the encoding, a missing column,
a damaged file) raise a DataError. The codec check is the training readers' (`encodings`); the JSON layouts and
the Parquet message are theirs too (`readers`)."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any, Iterator

from ttt_pipeline.data.encodings import stream_encoding
from ttt_pipeline.data.readers import JSON_LIST_KEYS, parquet_error
from ttt_pipeline.errors import DataError

STREAMED = (".csv", ".tsv", ".jsonl", ".json", ".parquet", ".txt")
BATCH_ROWS = 1024  # Parquet rows converted at a time

# Each reader yields (where, row, None) for a record or (where, None, why) for a bad one, lazily, so that
# a caller can cut the file into chunks. CSV/TSV and JSON Lines use the standard library's streaming readers
# (csv.reader, line iteration) rather than pandas' chunked readers: they give each record's line number and the
# exact field count, which the bad-row messages name.
Records = Iterator[tuple[str, Any, Any]]


def delimited_records(path: Path, sep: str, column: str) -> Records:
    encoding = stream_encoding(path)
    csv.field_size_limit(2**31 - 1)
    with open(path, encoding=encoding, newline="") as f:
        reader = csv.reader(f, delimiter=sep, strict=True)  # an unclosed quote is an error, not one huge field
        prev = 0
        try:
            header = next(reader, None)
            if not header:
                raise DataError(f"{path}: the file is empty", "give a header row, then one review per row")
            if column not in header:
                raise DataError(f"{path}: no column '{column}' (columns: {header})",
                                "name the review column with --text-column")
            prev = reader.line_num
            for rec in reader:
                start, prev = prev + 1, reader.line_num
                if not rec:  # a blank line
                    continue
                if len(rec) != len(header):
                    yield f"line {start}", None, f"{len(rec)} fields, the header has {len(header)}"
                    continue
                yield f"line {start}", dict(zip(header, rec)), None
        except csv.Error as exc:  # structural: the rest of the file cannot be trusted
            raise DataError(f"{path}: line {prev + 1}: cannot parse as {'TSV' if sep == chr(9) else 'CSV'} ({exc})",
                            "check the quoting of the row starting on that line (a quote opened and never "
                            "closed swallows the lines after it)") from None


def jsonl_records(path: Path, column: str) -> Records:
    encoding = stream_encoding(path)
    with open(path, encoding=encoding) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"line {lineno}"
            try:
                obj = json.loads(line)
            except (json.JSONDecodeError, RecursionError, ValueError) as exc:
                yield where, None, f"invalid JSON ({getattr(exc, 'msg', type(exc).__name__)})"
                continue
            if not isinstance(obj, dict):
                yield where, None, f"a JSON {type(obj).__name__}, not an object"
                continue
            yield where, obj, None


def json_records(path: Path, column: str) -> Records:
    """One JSON array, parsed whole (the json module has no streaming parser; JSON Lines streams)."""
    text = path.read_text(encoding=stream_encoding(path))
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        del text
        yield from jsonl_records(path, column)  # .json files holding JSON Lines are common
        return
    except (RecursionError, ValueError) as exc:
        raise DataError(f"{path}: JSON too deeply nested or a number too long ({type(exc).__name__})",
                        "give a list of review objects") from None
    del text
    if isinstance(obj, dict):
        obj = next((obj[k] for k in JSON_LIST_KEYS if isinstance(obj.get(k), list)), obj)
    if not isinstance(obj, list):
        raise DataError(f"{path}: expected a list of objects", f'give [{{"{column}": "..."}}, ...] or JSON Lines')
    for i, row in enumerate(obj, 1):
        if not isinstance(row, dict):
            yield f"record {i}", None, f"a JSON {type(row).__name__}, not an object"
            continue
        yield f"record {i}", row, None


def parquet_records(path: Path, column: str, batch_rows: int = BATCH_ROWS) -> Records:
    """Record batches of pyarrow's ParquetFile.iter_batches, each converted by pandas as pd.read_parquet does
    (the index columns it stored are not review fields)."""
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
        index = {c for c in (pf.schema_arrow.pandas_metadata or {}).get("index_columns", []) if isinstance(c, str)}
    except Exception as exc:  # pyarrow raises many types for a damaged file
        raise parquet_error(path, exc) from None
    columns = [c for c in pf.schema_arrow.names if c not in index]
    if column not in columns:
        raise DataError(f"{path}: no column '{column}' (columns: {columns})",
                        "name the review column with --text-column")
    i = 0
    batches = pf.iter_batches(batch_size=batch_rows)
    while True:
        try:
            batch = next(batches, None)
            records = None if batch is None else batch.to_pandas().to_dict("records")
        except Exception as exc:
            raise parquet_error(path, exc) from None
        if records is None:
            return
        for row in records:
            i += 1
            yield f"row {i}", row, None


def text_records(path: Path, column: str) -> Records:
    encoding = stream_encoding(path)
    lineno = 0
    with open(path, encoding=encoding, newline="") as f:
        for chunk in f:  # split on \n, \r, \r\n; splitlines() also on the rarer breaks str.splitlines knows
            for line in chunk.splitlines():
                lineno += 1
                yield f"line {lineno}", {column: line}, None


def records(path: Path, column: str, batch_rows: int = BATCH_ROWS) -> Records:
    """The records of a file of one of the STREAMED types, by its suffix."""
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return delimited_records(path, ",", column)
    if suffix == ".tsv":
        return delimited_records(path, "\t", column)
    if suffix == ".parquet":
        return parquet_records(path, column, batch_rows)
    return {".jsonl": jsonl_records, ".json": json_records, ".txt": text_records}[suffix](path, column)
