"""Fuzzing the loaders: whatever bytes or rows a user hands in, the only failure is a DataError.

Three angles: raw bytes under every suffix, mutations of valid files (near-misses reach deeper into the
parsers than noise does), and well-formed files of hostile rows (huge ints, NaN, lone surrogates, nested
values, mixed label types) pushed through `prepare_dataset`, which also has to write the splits.
"""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from pathlib import Path

import pandas as pd
import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ttt_pipeline.config import DataConfig
from ttt_pipeline.data.prepare import prepare_dataset
from ttt_pipeline.data.readers import read_local
from ttt_pipeline.errors import DataError

COLS = ["text", "label", "input_ids"]
SUFFIXES = ["csv", "tsv", "json", "jsonl", "parquet", "pt"]
FUZZ = settings(max_examples=int(os.environ.get("TTT_FUZZ_EXAMPLES", "60")), deadline=None, suppress_health_check=list(HealthCheck))


def _read(data: bytes, suffix: str) -> None:
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / f"fuzz.{suffix}"
        p.write_bytes(data)
        try:
            frame = read_local(p, COLS)
        except DataError as exc:
            assert exc.message and str(p) in exc.message  # names the file
            exc.message.encode("utf-8")  # printable: the CLI writes it to stderr
            return
        assert isinstance(frame, pd.DataFrame)


def _valid_bytes(suffix: str) -> bytes:
    rows = [{"text": f"review {i} is {'great' if i % 2 else 'bad'}", "label": i % 3} for i in range(6)]
    df = pd.DataFrame(rows)
    if suffix in ("csv", "tsv"):
        return df.to_csv(index=False, sep="," if suffix == "csv" else "\t").encode()
    if suffix == "jsonl":
        return "".join(json.dumps(r) + "\n" for r in rows).encode()
    if suffix == "json":
        return json.dumps(rows).encode()
    buf = io.BytesIO()
    if suffix == "parquet":
        df.to_parquet(buf)
    else:
        torch.save([(r["text"], r["label"], torch.tensor([101, i, 102])) for i, r in enumerate(rows)], buf)
    return buf.getvalue()


@FUZZ
@given(suffix=st.sampled_from(SUFFIXES), data=st.binary(max_size=3000))
def test_random_bytes_never_crash_the_readers(suffix, data):
    _read(data, suffix)


@FUZZ
@given(suffix=st.sampled_from(SUFFIXES), data=st.data())
def test_mutated_valid_files_never_crash_the_readers(suffix, data):
    raw = bytearray(_valid_bytes(suffix))
    for _ in range(data.draw(st.integers(1, 6), label="edits")):
        op = data.draw(st.sampled_from(["flip", "cut", "insert", "delete"]), label="op")
        pos = data.draw(st.integers(0, max(0, len(raw) - 1)), label="pos")
        if op == "flip" and raw:
            raw[pos] = data.draw(st.integers(0, 255), label="byte")
        elif op == "cut":
            del raw[pos:]
        elif op == "insert":
            raw[pos:pos] = data.draw(st.binary(min_size=1, max_size=20), label="bytes")
        elif raw:
            del raw[pos:pos + data.draw(st.integers(1, 50), label="n")]
    _read(bytes(raw), suffix)


# Values a real export can hold, and a few it should not: every Unicode category (lone surrogates too).
any_text = st.text(st.characters(blacklist_categories=()), max_size=40)
scalar = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=10**300, max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True), any_text,
    st.sampled_from(["1", "2", "1.0", " 2 ", "pos", "neg", "", "  ", "nan", "1e400", "-0"]))
value = st.one_of(scalar, st.lists(scalar, max_size=3), st.dictionaries(st.text(max_size=3), scalar, max_size=2))
KEYS = ["text", "label", "rating", "x"]
rows_strategy = st.lists(st.dictionaries(st.sampled_from(KEYS), value, max_size=4), max_size=30)


def _serialise(rows: list[dict], suffix: str, layout: int) -> bytes | None:
    """Rows as a file of that format, or None when the format itself cannot hold them."""
    if suffix == "jsonl":
        return "".join(json.dumps(r) + "\n" for r in rows).encode()
    if suffix == "json":
        obj = [rows, {"data": rows}, {k: [r.get(k) for r in rows] for k in KEYS}][layout % 3]
        return json.dumps(obj).encode()
    if suffix in ("csv", "tsv"):
        buf = io.StringIO()
        w = csv.writer(buf, delimiter="," if suffix == "csv" else "\t")
        w.writerow(KEYS[:2 + layout % 3])
        for r in rows:
            w.writerow(["" if r.get(k) is None else r.get(k) for k in KEYS[:2 + layout % 3]])
        return buf.getvalue().encode("utf-8", "surrogatepass")
    if suffix == "parquet":
        buf = io.BytesIO()
        try:
            pd.DataFrame(rows).to_parquet(buf)
        except Exception:  # mixed column types: pyarrow cannot write them, so no user can hand them in
            return None
        return buf.getvalue()
    buf = io.BytesIO()
    if layout % 2:
        torch.save([tuple(r.values()) for r in rows], buf)
    else:
        torch.save({k: [r.get(k) for r in rows] for k in KEYS[:2]}, buf)
    return buf.getvalue()


VALID = [{"text": f"review {i} is {'fine' if i % 2 else 'poor'}", "label": 1 + i % 2, "rating": "pos"
          if i % 2 else "neg"} for i in range(16)]


@FUZZ
@given(suffix=st.sampled_from(SUFFIXES), rows=rows_strategy, with_valid=st.booleans(), layout=st.integers(0, 5),
       label_col=st.sampled_from(["label", "rating"]), names=st.sampled_from([None, ["1", "2"], ["pos", "neg"]]),
       val_fraction=st.sampled_from([0.0, 0.2]))
def test_hostile_rows_never_crash_prepare_dataset(suffix, rows, with_valid, layout, label_col, names, val_fraction):
    """with_valid: the hostile rows hide among good ones, so the run gets past validation into splitting."""
    if with_valid:
        rows = [r for pair in zip(VALID, rows + [None] * len(VALID)) for r in pair if r is not None] + rows[16:]
    data = _serialise(rows, suffix, layout)
    if data is None:
        return
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / f"fuzz.{suffix}"
        p.write_bytes(data)
        cfg = DataConfig(path=str(p), label_column=label_col, label_names=names, val_fraction=val_fraction,
                         max_text_chars=100)
        try:
            meta = prepare_dataset(cfg, Path(d) / "out", Path(d) / "raw")
        except DataError as exc:
            assert exc.message and exc.hint
            exc.message.encode("utf-8")  # printable: the CLI writes it to stderr
            event("DataError")
            return
    event("prepared")
    assert meta["num_labels"] >= 2 and meta["sizes"]["train"] >= 1 and meta["sizes"]["test"] >= 1


def _jsonl_with_rows(tmp: Path, rows: list[dict]) -> Path:
    p = tmp / "r.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


BASE = [{"text": f"review {i} of class {c}", "label": c} for c in (1, 2) for i in range(10)]


@pytest.mark.parametrize("name,content", [
    ("deep.json", b"[" * 100000 + b"]" * 100000),
    ("deep.jsonl", b'{"text": ' + b"[" * 100000 + b"]" * 100000 + b"}\n"),
    ("bom.jsonl", b'\xef\xbb\xbf{"text": "a", "label": 1}\n'),
])
def test_found_by_fuzzing_deep_nesting_and_bom(tmp_path, name, content):
    """Regressions: deep nesting was a RecursionError, a UTF-8 BOM made the first JSON line invalid."""
    p = tmp_path / name
    p.write_bytes(content)
    try:
        frame = read_local(p, COLS)
    except DataError as exc:
        assert "nest" in exc.message
    else:
        assert frame["text"].tolist() == ["a"]


def test_found_by_fuzzing_huge_int_label_is_a_clear_error_or_a_class(tmp_path):
    """Regression: a label of 10**400 raised OverflowError in the label canonicaliser."""
    rows = BASE + [{"text": "absurd label", "label": 10**400}]
    cfg = DataConfig(path=str(_jsonl_with_rows(tmp_path, rows)), label_column="label", label_names=["1", "2"])
    with pytest.raises(DataError, match="outside the classes"):
        prepare_dataset(cfg, tmp_path / "o", tmp_path / "raw")


def test_found_by_fuzzing_lone_surrogate_text_names_the_row(tmp_path):
    """Regression: a `\\ud800` escape in JSON made a str that cannot be written as UTF-8 (crash on save)."""
    rows = BASE[:5] + [{"text": "bad \ud800 escape", "label": 1}] + BASE[5:]
    cfg = DataConfig(path=str(_jsonl_with_rows(tmp_path, rows)), label_column="label", label_names=None)
    with pytest.raises(DataError) as exc:
        prepare_dataset(cfg, tmp_path / "o", tmp_path / "raw")
    assert ":6:" in exc.value.message and "surrogate" in exc.value.message  # file:line
