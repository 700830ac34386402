"""Local file readers: every format becomes a pandas DataFrame, or a clear DataError naming the file.

The training data's readers: whole files, any bad record an error. Batch prediction streams the same formats
record by record (`records`); both take their codec from `encodings` and share the messages below."""

from __future__ import annotations

import bz2
import gzip
import html
import io
import json
import lzma
import xml.etree.ElementTree as ET
from pathlib import Path

import pandas as pd

from ttt_pipeline.data.encodings import text_encoding
from ttt_pipeline.errors import DataError

SUFFIXES = {".csv", ".tsv", ".json", ".jsonl", ".parquet", ".pt"}
# A text format compressed as a whole (reviews.csv.bz2): read in memory, at most MAX_DECOMPRESSED bytes of it
COMPRESSED = {".bz2": bz2.open, ".gz": gzip.open, ".xz": lzma.open}
TEXT_SUFFIXES = {".csv", ".tsv", ".json", ".jsonl"}
MAX_DECOMPRESSED = 1 << 31
# The keys under which a JSON object may hold its list of records ({"data": [...]})
JSON_LIST_KEYS = ("data", "rows", "records", "reviews")


def decompressed(path: Path) -> bytes:
    """The whole content of a .bz2 / .gz / .xz file; a damaged file or one past MAX_DECOMPRESSED is a DataError."""
    kind = path.suffix.lower()[1:]
    try:
        with COMPRESSED[path.suffix.lower()](path, "rb") as f:
            raw = f.read(MAX_DECOMPRESSED + 1)
    except (OSError, EOFError, lzma.LZMAError) as exc:  # not that format, or cut short
        raise DataError(f"{path}: not a readable {kind} file ({type(exc).__name__})",
                        "check the file is complete and compressed as its name says") from None
    if len(raw) > MAX_DECOMPRESSED:
        raise DataError(f"{path}: more than {MAX_DECOMPRESSED >> 30} GiB once decompressed",
                        "decompress it yourself and give the plain file")
    return raw


def read_delimited(path: Path, sep: str, raw: bytes | None = None) -> pd.DataFrame:
    encoding = text_encoding(path, raw)
    try:
        return pd.read_csv(path if raw is None else io.BytesIO(raw), sep=sep, dtype=object, keep_default_na=False,
                           na_values=[""], encoding=encoding, on_bad_lines="error")
    except pd.errors.EmptyDataError:
        raise DataError(f"{path}: the file is empty", "give a file with a header row and reviews") from None
    except (pd.errors.ParserError, ValueError, csv_error()) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataError(f"{path}: cannot parse as {'TSV' if sep == chr(9) else 'CSV'}: {first}",
                        "check quoting and the number of fields on the line named") from None


def _has_surrogate(obj) -> bool:
    if isinstance(obj, str):
        try:
            obj.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(obj, dict):
        return any(_has_surrogate(k) or _has_surrogate(v) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return any(_has_surrogate(v) for v in obj)
    return False


def _frame(data, path: Path, linenos: list[int] | None = None) -> pd.DataFrame:
    """pd.DataFrame(data); text that cannot be UTF-8 (a lone `\\ud800` escape) is a DataError naming the row."""
    try:
        return pd.DataFrame(data)
    except UnicodeEncodeError:
        rows = data if isinstance(data, list) else [dict(zip(data, vals)) for vals in zip(*data.values())]
        bad = next((i for i, r in enumerate(rows) if _has_surrogate(r)), None)
        where = "" if bad is None else (f":{linenos[bad]}" if linenos else f": row {bad + 1}")
        raise DataError(f"{path}{where}: text with an unpaired surrogate escape (\\ud800-\\udfff), "
                        "which is not valid Unicode",
                        "fix or remove that escape (half of an emoji cut by an exporter, usually)") from None


def csv_error():
    import csv

    return csv.Error


def read_jsonl(path: Path, raw: bytes | None = None) -> pd.DataFrame:
    encoding = text_encoding(path, raw)  # a byte-order mark (Windows editors) is not data: the codec drops it
    rows, linenos = [], []
    handle = open(path, encoding=encoding) if raw is None else io.StringIO(raw.decode(encoding), newline=None)
    with handle as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{lineno}: invalid JSON ({exc.msg})",
                                "each line must be one JSON object") from None
            except (RecursionError, ValueError) as exc:  # absurd nesting, ints past 4300 digits
                raise DataError(f"{path}:{lineno}: JSON too deeply nested or a number too long "
                                f"({type(exc).__name__})", "each line must be one flat JSON object") from None
            if not isinstance(obj, dict):
                raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}",
                                "each line must be one JSON object with the text and label fields")
            rows.append(obj)
            linenos.append(lineno)
    if not rows:
        raise DataError(f"{path}: no records", "give at least one JSON object per line")
    return _frame(rows, path, linenos)


def wrapped_records(obj):
    """`{"reviews": [{...}, ...]}`: the list of objects under one of JSON_LIST_KEYS, as batch prediction reads it
    (rather than a one-column table whose cells are the objects); anything else as it is."""
    if isinstance(obj, dict):
        for key in JSON_LIST_KEYS:
            value = obj.get(key)
            if isinstance(value, list) and value and all(isinstance(r, dict) for r in value):
                return value
    return obj


def read_json(path: Path, raw: bytes | None = None) -> pd.DataFrame:
    encoding = text_encoding(path, raw)
    text = path.read_text(encoding=encoding) if raw is None else raw.decode(encoding)
    if not text.strip():
        raise DataError(f"{path}: the file is empty", "give a JSON array of objects or JSON Lines")
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return read_jsonl(path, raw)  # .json files holding JSON Lines are common
    except (RecursionError, ValueError) as exc:  # absurd nesting, ints past 4300 digits
        raise DataError(f"{path}: JSON too deeply nested or a number too long ({type(exc).__name__})",
                        "give a flat list of review objects") from None
    obj = wrapped_records(obj)
    if isinstance(obj, dict):
        if all(isinstance(v, list) for v in obj.values()):
            if len({len(v) for v in obj.values()}) > 1:
                raise DataError(f"{path}: columns of different lengths", "give equal-length lists")
            return _frame(obj, path)
        for key in JSON_LIST_KEYS:
            if isinstance(obj.get(key), list):
                obj = obj[key]
                break
    if not isinstance(obj, list) or not all(isinstance(r, dict) for r in obj):
        raise DataError(f"{path}: expected a list of objects", "give [{\"text\": ..., \"label\": ...}, ...]")
    if not obj:
        raise DataError(f"{path}: no records", "give at least one review")
    return _frame(obj, path)


def parquet_error(path: Path, exc: Exception) -> DataError:
    return DataError(f"{path}: cannot read as Parquet ({type(exc).__name__})",
                     "check the file is a complete Parquet file")


def read_parquet(path: Path) -> pd.DataFrame:
    try:
        return pd.read_parquet(path)
    except Exception as exc:  # pyarrow raises many types for a damaged file
        raise parquet_error(path, exc) from None


def read_pt(path: Path, columns: list[str]) -> pd.DataFrame:
    """A torch-saved list of tuples (the tutorial's files) or dict of lists, never unpickling objects."""
    import pickle

    import torch

    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise DataError(
            f"{path}: refused to load: it needs code execution to unpickle ({str(exc).splitlines()[0][:160]})",
            "only tensors, lists, dicts, strings and numbers are accepted; re-save the data plainly",
        ) from None
    except Exception as exc:
        raise DataError(f"{path}: not a readable torch file ({type(exc).__name__})",
                        "give a file written by torch.save") from None
    if isinstance(obj, dict):
        obj = {k: (v.tolist() if isinstance(v, torch.Tensor) else v) for k, v in obj.items()}
        try:
            return _frame(obj, path)
        except (ValueError, TypeError):
            raise DataError(f"{path}: dict columns of different lengths", "give equal-length lists") from None
    if isinstance(obj, (list, tuple)):
        if not obj:
            raise DataError(f"{path}: no records", "give at least one review")
        if all(isinstance(r, dict) for r in obj):
            return _frame([{k: (v.tolist() if isinstance(v, torch.Tensor) else v) for k, v in r.items()}
                           for r in obj], path)
        if all(isinstance(r, (list, tuple)) for r in obj):
            width = min(len(r) for r in obj)
            names = columns[:width] + [f"col{i}" for i in range(len(columns), width)]
            rows = [{n: (v.tolist() if isinstance(v, torch.Tensor) else v) for n, v in zip(names, r)} for r in obj]
            return _frame(rows, path)
    raise DataError(f"{path}: unsupported torch object {type(obj).__name__}",
                    "give a list of (text, label, ...) tuples or a dict of columns")


def read_mdsd_folder(folder: Path, field: str = "data.path") -> pd.DataFrame:
    """Multi-Domain Sentiment `.review` XML files; HTML entities in the text are unescaped."""
    files = sorted(folder.glob("*.review"))
    if not files:
        raise DataError(f"{folder}: no .review files", f"point {field} at an MDSD domain folder")
    rows = []
    for f in files:
        try:
            root = ET.parse(f).getroot()
        except ET.ParseError as exc:
            raise DataError(f"{f}: not well-formed XML ({exc})", "check the file is a complete .review file") from None
        for r in root.iter("review"):
            def field(name: str, r=r) -> str:
                el = r.find(name)
                return html.unescape((el.text or "").strip()) if el is not None else ""

            rows.append({"text": field("review_text"), "rating": field("rating"), "title": field("title"),
                         "product_type": field("product_type"), "asin": field("asin"),
                         "source_file": f.name})
    if not rows:
        raise DataError(f"{folder}: the .review files hold no <review> elements", "check the files")
    return pd.DataFrame(rows)


MDSD_HINT = ("the MDSD reviews (Multi-Domain Sentiment Dataset: Blitzer, Dredze, Pereira, ACL 2007) are not shipped: "
             "download the ACL 2007 set (domain_sentiment_data.tar.gz) from "
             "https://www.cs.jhu.edu/~mdredze/datasets/sentiment/ and set {field} to its electronics folder "
             "(docs/data.md has the files' checksums)")


def missing_path_hint(path: Path | str, field: str) -> str:
    """The hint of a missing local source: where relative paths start, and where a preset's data comes from."""
    hint = f"check {field} (relative paths start at the current folder; `./` in a config file at that file)"
    return f"{hint}; {MDSD_HINT.format(field=field)}" if "mdsd" in str(path).lower() else hint


def read_local(path: Path, pt_columns: list[str], field: str = "data.path") -> pd.DataFrame:
    """One local file or MDSD folder as a frame; `field` names the config field in error hints."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: no such file or folder", missing_path_hint(path, field))
    if path.is_dir():
        return read_mdsd_folder(path, field)
    suffix = path.suffix.lower()
    if path.stat().st_size == 0:
        raise DataError(f"{path}: the file is empty", "give a file with reviews")
    raw = None
    if suffix in COMPRESSED:
        inner = Path(path.stem).suffix.lower()
        if inner not in TEXT_SUFFIXES:
            raise DataError(f"{path}: unsupported compressed file type '{inner}{suffix}'",
                            f"compress one of {', '.join(sorted(TEXT_SUFFIXES))} (e.g. reviews.csv{suffix})")
        raw, suffix = decompressed(path), inner
    if suffix == ".csv":
        return read_delimited(path, ",", raw)
    if suffix == ".tsv":
        return read_delimited(path, "\t", raw)
    if suffix == ".jsonl":
        return read_jsonl(path, raw)
    if suffix == ".json":
        return read_json(path, raw)
    if suffix == ".parquet":
        return read_parquet(path)
    if suffix == ".pt":
        return read_pt(path, pt_columns)
    raise DataError(f"{path}: unsupported file type '{suffix}'",
                    f"use one of {', '.join(sorted(SUFFIXES))} (csv, tsv, json and jsonl also compressed: "
                    ".bz2, .gz, .xz) or an MDSD folder of .review files")
