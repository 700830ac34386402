"""The traffic store's read side: a time window's aggregates, a sample of its texts, and retention.

Embedded DuckDB reads the window's Parquet parts (written by ttt_pipeline/io/traffic_capture.py) and computes
every aggregate in SQL, streaming over the parts, so a window of millions of records never sits in memory
(`memory_limit` MEMORY_LIMIT). A local store is read by DuckDB directly; an fsspec URL (s3://, gs://, memory://)
through its fsspec filesystem registered with the connection, so no DuckDB extension (httpfs) has to be fetched.

DuckDB fails a whole query on one unreadable file, and a part cut short by a crash (or copied in by hand) is one,
so every part is checked first by its Parquet footer (pyarrow.parquet.read_metadata: a few KB per part, cached by
path and size) and DuckDB gets the explicit list of good parts; the others are named in `skipped_parts`. Only the
date partitions that overlap the window are listed, and names starting with `.` (a writer's temp files) never.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import threading

import pyarrow as pa
import pyarrow.parquet as pq

from ttt_pipeline.errors import PipelineError
from ttt_pipeline.io.traffic_capture import DESCRIPTOR_COLUMNS, TRAFFIC_SCHEMA, store_fs

MEMORY_LIMIT = "1GB"
_DATE_DIR = re.compile(r"^date=(\d{4}-\d{2}-\d{2})$")
_FOOTERS: dict[str, dict[tuple[str, int], frozenset | None]] = {}  # per store: (path, size) -> columns, None: bad
_FOOTERS_LOCK = threading.Lock()


def read_window(uri: str | os.PathLike, start: dt.datetime, end: dt.datetime, *, columns: list[str] | None = None,
                fs=None, model_name: str | None = None, model_version: str | None = None,
                threshold: float | None = None) -> dict:
    """Aggregates of the records with `start` <= ts < `end` (timezone-aware datetimes): n; per descriptor column
    (`columns`, default DESCRIPTOR_COLUMNS) its sum and mean; the mean top-class probability; the truncated texts;
    counts per label, per method and per model name and version; the rows with a raw_label (the repair changed
    the text) and those whose raw_label differs from the label; the parts read and the parts skipped as unreadable.
    `model_name` / `model_version`: only that model's (version's) records; `threshold`: also `above_threshold`,
    the records whose top-class probability exceeds it (ATC's count; None when no threshold is given).
    """
    columns = _numeric_columns(columns)
    fs, base = (fs, str(uri).rstrip("/")) if fs is not None else store_fs(uri)
    good, skipped, present = window_parts(fs, base.rstrip("/"), *_window(start, end))
    out = {"start": start.isoformat(), "end": end.isoformat(), "n": 0, "sums": dict.fromkeys(columns, 0),
           "means": dict.fromkeys(columns), "mean_probability": None, "truncated": 0, "labels": {}, "methods": {},
           "model_versions": {}, "raw_label_recorded": 0, "raw_label_changed": 0, "parts": len(good),
           "skipped_parts": skipped, "above_threshold": None if threshold is None else 0}
    if not good:
        return out
    aggs = [f"sum({c}), avg({c})" if c in present else "NULL, NULL" for c in columns]
    where, params = "ts >= ? AND ts < ?", [start, end]
    for column, value in (("model_name", model_name), ("model_version", model_version)):
        if value is not None:
            where, params = f"{where} AND {column} = ?", [*params, str(value)]
    above = "count(*) FILTER (WHERE probability > ?)" if threshold is not None else "NULL"
    sql = (f"SELECT grouping(label), grouping(method), grouping(model_name), label, method, model_name, "
           f"model_version, count(*), avg(probability), count(*) FILTER (WHERE truncated), count(raw_label), "
           f"count(*) FILTER (WHERE raw_label <> label), {above}, {', '.join(aggs)} "
           f"FROM {_SOURCE} WHERE {where} "
           f"GROUP BY GROUPING SETS ((), (label), (method), (model_name, model_version))")
    args = [*([float(threshold)] if threshold is not None else []), _duck_paths(fs, good), *params]
    with _connect(fs) as con:
        rows = con.execute(sql, args).fetchall()
    for g_label, g_method, g_model, label, method, name, version, n, *rest in rows:
        if not g_label:
            out["labels"][label] = n
        elif not g_method:
            out["methods"][method] = n
        elif not g_model:
            out["model_versions"].setdefault(name, {})[version] = n
        elif n:
            mean_p, truncated, recorded, changed, n_above, *descr = rest
            out.update(n=n, mean_probability=mean_p, truncated=truncated, raw_label_recorded=recorded,
                       raw_label_changed=changed, above_threshold=n_above)
            for i, c in enumerate(columns):
                out["sums"][c] = descr[2 * i] if descr[2 * i] is not None else 0
                out["means"][c] = descr[2 * i + 1]
    for key in ("labels", "methods"):
        out[key] = dict(sorted(out[key].items(), key=lambda kv: str(kv[0])))
    return out


def sample_texts(uri: str | os.PathLike, start: dt.datetime, end: dt.datetime, limit: int, seed: int, *,
                 fs=None) -> list[str]:
    """Up to `limit` stored texts of the window (rows whose text was not stored left out), a sample fixed by
    `seed`: the rows of the smallest hashes of (text, seed), whatever DuckDB's thread count, in a streaming top-N.
    """
    if limit < 0:
        raise PipelineError(f"sample_texts: limit {limit} < 0", "ask for 0 or more texts")
    fs, base = (fs, str(uri).rstrip("/")) if fs is not None else store_fs(uri)
    good, _, present = window_parts(fs, base.rstrip("/"), *_window(start, end))
    if not good or not limit or "text" not in present:
        return []
    sql = (f"SELECT text FROM {_SOURCE} WHERE ts >= ? AND ts < ? AND text IS NOT NULL "
           f"ORDER BY hash(text, ?::BIGINT), text, ts LIMIT ?")
    with _connect(fs) as con:
        return [t for (t,) in con.execute(sql, [_duck_paths(fs, good), start, end, int(seed), int(limit)]).fetchall()]


def enforce_retention(uri: str | os.PathLike, retention_days: int, now: dt.datetime, *, fs=None) -> list[str]:
    """Remove the date partitions whose whole day is older than `retention_days` before `now` (a partition of the
    day the cut falls in stays); returns the removed folders."""
    if isinstance(retention_days, bool) or not isinstance(retention_days, int) or retention_days < 0:
        raise PipelineError(f"traffic retention {retention_days!r} days: not a whole number >= 0",
                            "set monitoring.retention_days to 0 or more")
    cut = (_utc(now, "now") - dt.timedelta(days=retention_days)).date()
    fs, base = (fs, str(uri).rstrip("/")) if fs is not None else store_fs(uri)
    removed = []
    for folder, day in _date_folders(fs, base.rstrip("/")):
        if day < cut:
            fs.rm(folder, recursive=True)
            removed.append(folder)
    return removed


def window_parts(fs, base: str, first: dt.date, last: dt.date) -> tuple[list[str], list[str], frozenset]:
    """(readable parts, unreadable parts, the columns the readable ones hold) of the date partitions `first` to
    `last`; each part's footer read once per path and size."""
    listed = {}
    for folder, day in _date_folders(fs, base):
        if first <= day <= last:
            for info in fs.ls(folder, detail=True):
                name = info["name"].rstrip("/").rsplit("/", 1)[-1]
                if info.get("type") == "file" and name.endswith(".parquet") and not name.startswith("."):
                    listed[(info["name"], int(info.get("size") or 0))] = None
    store = fs.unstrip_protocol(base)
    with _FOOTERS_LOCK:
        known = _FOOTERS.get(store, {})
    footers = {key: known[key] if key in known else _footer_columns(fs, key[0]) for key in listed}
    with _FOOTERS_LOCK:
        _FOOTERS[store] = footers  # only what is listed now: removed parts leave the cache
    good = sorted(p for (p, _), cols in footers.items() if cols is not None)
    bad = sorted(p for (p, _), cols in footers.items() if cols is None)
    present = frozenset().union(*(cols for cols in footers.values() if cols is not None))
    return good, bad, present


_SOURCE = "read_parquet(?, hive_partitioning = true, union_by_name = true)"


def _footer_columns(fs, path: str) -> frozenset | None:
    try:
        with fs.open(path, "rb") as f:
            return frozenset(pq.read_metadata(f).schema.to_arrow_schema().names)
    except Exception:  # any unreadable footer: the part is skipped and named
        return None


def _date_folders(fs, base: str) -> list[tuple[str, dt.date]]:
    if not fs.isdir(base):
        return []
    out = []
    for info in fs.ls(base, detail=True):
        match = _DATE_DIR.match(info["name"].rstrip("/").rsplit("/", 1)[-1])
        if match and info.get("type") == "directory":
            try:
                out.append((info["name"].rstrip("/"), dt.date.fromisoformat(match.group(1))))
            except ValueError:  # date=2024-13-01: not a partition of this store
                continue
    return sorted(out, key=lambda fd: fd[1])


def _window(start: dt.datetime, end: dt.datetime) -> tuple[dt.date, dt.date]:
    """The UTC days a window [start, end) touches, which are the partitions that may hold its records."""
    start, end = _utc(start, "start"), _utc(end, "end")
    if end < start:
        raise PipelineError(f"traffic window ends ({end.isoformat()}) before it starts ({start.isoformat()})",
                            "give start <= end")
    return start.date(), max(start, end - dt.timedelta(milliseconds=1)).date()


def _utc(when: dt.datetime, what: str) -> dt.datetime:
    if not isinstance(when, dt.datetime) or when.tzinfo is None or when.utcoffset() is None:
        raise PipelineError(f"traffic window: {what} {when!r} is not a timezone-aware datetime",
                            "pass e.g. datetime.now(timezone.utc)")
    return when.astimezone(dt.timezone.utc)


def _numeric_columns(columns: list[str] | None) -> list[str]:
    columns = list(DESCRIPTOR_COLUMNS if columns is None else columns)
    numeric = {f.name for f in TRAFFIC_SCHEMA if pa.types.is_integer(f.type) or pa.types.is_floating(f.type)}
    unknown = [c for c in columns if c not in numeric]
    if unknown:
        raise PipelineError(f"traffic window: no numeric column {unknown} in the traffic schema",
                            f"pick from {sorted(numeric)}")
    return columns


def _connect(fs):
    import duckdb

    con = duckdb.connect(":memory:", config={"memory_limit": MEMORY_LIMIT, "threads": os.cpu_count() or 1})
    if not _is_local(fs):
        con.register_filesystem(fs)
    return con


def _is_local(fs) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    return "file" in protocol or "local" in protocol


def _duck_paths(fs, paths: list[str]) -> list[str]:
    """The parts as DuckDB opens them: local paths as they are, others as URLs of the registered filesystem."""
    return paths if _is_local(fs) else [fs.unstrip_protocol(p) for p in paths]
