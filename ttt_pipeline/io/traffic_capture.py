"""The traffic store's write side: what the served model and `ttt-pipeline predict` were asked, one row per text.

`TrafficWriter.record(rows)` is a side effect that must never slow down or break a prediction: it only puts the rows
on a bounded queue (dropping and counting them when it is full) and returns. A daemon thread turns the queue into
Parquet parts, by size (`flush_rows`) and by time (`flush_seconds`), under a local folder or any fsspec URL:

    <uri>/date=YYYY-MM-DD/part-<host>-<pid>-<writer uuid>-<seq>.parquet

named per process and writer, so several server workers write into one store at once. A part is written to a
hidden `.tmp-` name in its folder and renamed into place, so a reader (ttt_pipeline/io/traffic_window.py, which
ignores names starting with `.`) never sees half of one. A store that is slow, full or unwritable costs records,
counted in `stats()`, and one logged warning a minute at most; never an exception to the caller.
"""

from __future__ import annotations

import atexit
import datetime as dt
import logging
import os
import queue
import re
import socket
import threading
import time
import uuid
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ttt_pipeline.errors import PipelineError

log = logging.getLogger(__name__)

# What a text looks like, computed by the caller (ttt_pipeline/evaluation/descriptors.py); extend here, the reader
# aggregates whatever this lists (older parts without a new column read it as null).
DESCRIPTOR_FIELDS = [
    pa.field("text_length", pa.int32(), nullable=False),
    pa.field("word_count", pa.int32(), nullable=False),
    pa.field("oov_words_share", pa.float32(), nullable=False),
    pa.field("repaired_words_share", pa.float32(), nullable=False),
    pa.field("non_letter_character_share", pa.float32(), nullable=False),
    pa.field("foreign_script_share", pa.float32(), nullable=False),
]
DESCRIPTOR_COLUMNS = [f.name for f in DESCRIPTOR_FIELDS]

TRAFFIC_SCHEMA = pa.schema([
    pa.field("ts", pa.timestamp("ms", tz="UTC"), nullable=False),
    pa.field("model_name", pa.string(), nullable=False),
    pa.field("model_version", pa.string(), nullable=False),
    pa.field("method", pa.string(), nullable=False),
    pa.field("label", pa.string(), nullable=False),
    pa.field("probability", pa.float32(), nullable=False),  # of the top class
    pa.field("raw_label", pa.string()),  # the prediction on the unrepaired text, only where the repair changed it
    pa.field("text", pa.string()),  # null where `monitoring.store_text: false`
    *DESCRIPTOR_FIELDS,
    pa.field("truncated", pa.bool_(), nullable=False),  # the model's own truncation of the text
])

WARN_EVERY_S = 60.0
MAX_NAME_CHARS = 1_000  # labels, names, methods: a request's `method` param is the caller's own string
_SURROGATE = re.compile("[\ud800-\udfff]")
_HOST = re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname())[:40] or "host"


def clean_text(value: Any, max_chars: int | None = None) -> Any:
    """A string Parquet can store: cut at `max_chars`, lone surrogates (invalid in UTF-8) as U+FFFD, NUL kept."""
    if not isinstance(value, str):
        return value
    if max_chars is not None and len(value) > max_chars:
        value = value[:max_chars]
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        value = _SURROGATE.sub("\ufffd", value)
    return value


def rows_table(rows: list[Any], stamp_ms: list[int], max_text_chars: int) -> tuple[pa.Table, int, str | None]:
    """The rows as a TRAFFIC_SCHEMA table, a row without `ts` stamped with its `stamp_ms`; a batch that does not
    convert is retried row by row, the rows that still fail left out. Returns (table, rows left out, last error)."""
    try:
        return _columns_table(rows, stamp_ms, max_text_chars), 0, None
    except Exception as exc:  # any bad value: find the rows that hold it
        first = repr(exc)
    good, bad = [], 0
    for row, ms in zip(rows, stamp_ms):
        try:
            good.append(_columns_table([row], [ms], max_text_chars))
        except Exception:
            bad += 1
    table = pa.concat_tables(good) if good else TRAFFIC_SCHEMA.empty_table()
    return table, bad, first


def _columns_table(rows: list[Any], stamp_ms: list[int], max_text_chars: int) -> pa.Table:
    arrays = []
    for field in TRAFFIC_SCHEMA:
        if field.name == "ts":
            values = [ms if r.get("ts") is None else r["ts"] for r, ms in zip(rows, stamp_ms)]
        elif pa.types.is_string(field.type):
            cap = max_text_chars if field.name == "text" else MAX_NAME_CHARS
            values = [clean_text(r.get(field.name), cap) for r in rows]
        else:
            values = [r.get(field.name) for r in rows]
        array = pa.array(values, type=field.type)
        if array.null_count and not field.nullable:  # from_arrays does not check it, the Parquet writer would
            raise ValueError(f"{field.name}: {array.null_count} row(s) without a value")
        arrays.append(array)
    return pa.Table.from_arrays(arrays, schema=TRAFFIC_SCHEMA)


class TrafficWriter:
    """Records rows (dicts keyed by TRAFFIC_SCHEMA's names) into the store at `uri` from a background thread.

    `fs`: an fsspec filesystem, `uri` then a path on it; else `uri` is a local folder or an fsspec URL. The thread
    does not survive a fork: a forked process gets its own writer from `writer_for`."""

    def __init__(self, uri: str | os.PathLike, *, max_queue: int = 10_000, flush_rows: int = 2_000,
                 flush_seconds: float = 5.0, fs=None, max_text_chars: int = 100_000):
        if max_queue < 1 or flush_rows < 1 or flush_seconds <= 0 or max_text_chars < 1:
            raise PipelineError(f"traffic store {uri}: max_queue, flush_rows, max_text_chars must be >= 1 and "
                                f"flush_seconds > 0", "check the monitoring settings")
        self.fs, self.base = (fs, str(uri)) if fs is not None else store_fs(uri)
        self.base = self.base.rstrip("/")
        self.flush_rows, self.flush_seconds, self.max_text_chars = flush_rows, flush_seconds, max_text_chars
        self.pid, self.ident = os.getpid(), uuid.uuid4().hex
        self.written = self.dropped = self.failed_parts = self.parts = 0
        self.last_error: str | None = None
        self._queue: queue.Queue = queue.Queue(maxsize=max_queue)
        self._lock = threading.Lock()
        self._seq = 0
        self._last_warning = float("-inf")
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"traffic-writer-{self.ident[:8]}", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    # -- the caller's side ---------------------------------------------------------------------------------
    def record(self, rows: list[dict]) -> None:
        """Queue `rows` for the store; never blocks, never raises (rows that do not fit are dropped and counted)."""
        try:
            stamp = int(time.time() * 1000)
            if self._closing.is_set():
                self._count_dropped(len(rows), "record() after close()")
                return
            for i, row in enumerate(rows):
                try:
                    self._queue.put_nowait((stamp, row))
                except queue.Full:
                    self._count_dropped(len(rows) - i, "queue full: the store is slower than the traffic")
                    return
        except Exception as exc:  # a side effect never breaks the prediction it records
            self._count_dropped(0, f"record(): {exc!r}")

    def stats(self) -> dict:
        with self._lock:
            return {"written": self.written, "dropped": self.dropped, "failed_parts": self.failed_parts,
                    "parts": self.parts, "queued": self._queue.qsize(), "last_error": self.last_error}

    def close(self, timeout: float = 10.0) -> None:
        """Flush what is queued (waiting `timeout` seconds at most) and stop the thread."""
        self._closing.set()
        try:
            self._queue.put_nowait(None)
        except queue.Full:  # the thread is busy and sees the flag next
            pass
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        atexit.unregister(self.close)

    @property
    def closed(self) -> bool:
        return self._closing.is_set()

    # -- the thread's side ---------------------------------------------------------------------------------
    def _run(self) -> None:
        buffer: list[tuple[int, Any]] = []
        deadline = None  # when the buffer's first row has waited flush_seconds
        while True:
            closing = self._closing.is_set()
            wait = 0.0 if closing else 1.0 if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                item = self._queue.get(timeout=wait)
                if item is not None:  # None: close()'s wake-up
                    buffer.append(item)
                    deadline = deadline or time.monotonic() + self.flush_seconds
            except queue.Empty:
                if closing:
                    self._flush(buffer)
                    return
            if buffer and (len(buffer) >= self.flush_rows or time.monotonic() >= deadline):
                self._flush(buffer)
                buffer, deadline = [], None

    def _flush(self, buffer: list[tuple[int, Any]]) -> None:
        if not buffer:
            return
        try:
            table, bad, error = rows_table([r for _, r in buffer], [ms for ms, _ in buffer], self.max_text_chars)
        except Exception as exc:
            table, bad, error = TRAFFIC_SCHEMA.empty_table(), len(buffer), repr(exc)
        if bad:
            self._count_dropped(bad, f"rows that do not fit the traffic schema: {error}")
        if table.num_rows:
            days = table.column("ts").cast(pa.int64()).to_numpy() // 86_400_000  # UTC days since the epoch
            distinct = sorted(set(days.tolist()))
            for day in distinct:
                part = table.filter(pa.array(days == day)) if len(distinct) > 1 else table
                self._write_part(part, dt.date(1970, 1, 1) + dt.timedelta(days=day))

    def _write_part(self, table: pa.Table, day: dt.date) -> None:
        with self._lock:
            self._seq += 1
            seq = self._seq
        folder = f"{self.base}/date={day.isoformat()}"
        name = f"part-{_HOST}-{self.pid}-{self.ident}-{seq:06d}.parquet"
        try:
            write_part(self.fs, folder, name, table)
        except Exception as exc:  # slow, full or unwritable store: drop, count, warn
            with self._lock:
                self.failed_parts += 1
            self._count_dropped(table.num_rows, f"writing {folder}/{name}: {exc!r}")
            return
        with self._lock:
            self.written += table.num_rows
            self.parts += 1

    def _count_dropped(self, n: int, why: str) -> None:
        with self._lock:
            self.dropped += n
            self.last_error = why
            warn = time.monotonic() - self._last_warning >= WARN_EVERY_S
            if warn:
                self._last_warning = time.monotonic()
        if warn:
            log.warning("traffic store %s: dropped %d record(s) (%d in all): %s", self.base, n, self.dropped, why)


def write_part(fs, folder: str, name: str, table: pa.Table) -> None:
    """One Parquet part, atomically: written under a hidden `.tmp-` name in `folder`, then renamed to `name`."""
    fs.makedirs(folder, exist_ok=True)
    tmp, final = f"{folder}/.tmp-{name}", f"{folder}/{name}"
    try:
        with fs.open(tmp, "wb") as f:
            pq.write_table(table, f, compression="zstd")
        fs.mv(tmp, final)
    except BaseException:
        try:
            fs.rm(tmp)
        except Exception:  # the first error is the one to report
            pass
        raise


def store_fs(uri: str | os.PathLike):
    """(fsspec filesystem, path on it) of a local folder or fsspec URL."""
    import fsspec

    try:
        return fsspec.core.url_to_fs(str(uri))
    except (ImportError, ValueError) as exc:
        raise PipelineError(f"traffic store {uri!r}: {exc}",
                            "install the fsspec backend of that scheme (e.g. pip install s3fs) or use a local "
                            "folder") from None


_WRITERS: dict[str, TrafficWriter] = {}
_WRITERS_LOCK = threading.Lock()


def writer_for(uri: str | os.PathLike, **kw) -> TrafficWriter:
    """This process's one writer for `uri` (a new one after a fork or a close; `kw` counts on first use only)."""
    key = str(uri).rstrip("/")
    with _WRITERS_LOCK:
        writer = _WRITERS.get(key)
        if writer is None or writer.closed or writer.pid != os.getpid():
            writer = _WRITERS[key] = TrafficWriter(key, **kw)
        return writer
