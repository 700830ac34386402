"""Input friendliness (issue 24): files with a byte-order mark are read, UTF-16 without one and Latin-1 are
refused with the conversion command; string labels under a preset's numeric classes get a hint that names
`data.label_names=null`; data.label_map turns star ratings into polarity."""

from __future__ import annotations

import codecs
import csv
import io
import json
import re

import pytest

from ttt_pipeline.config import DataConfig, load_config
from ttt_pipeline.data.prepare import load_prepared, prepare_dataset
from ttt_pipeline.data.readers import read_local, text_encoding
from ttt_pipeline.errors import ConfigError, DataError

COLS = ["text", "label"]
NAMES = ["Very Negative", "Negative", "Neutral", "Positive", "Very Positive"]


def _five_class_csv(n_per_class: int = 12) -> str:
    """A review export with string labels, quotes, commas and non-ASCII text."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\r\n")
    w.writerow(["text", "sentiment"])
    for i in range(n_per_class):
        for c, name in enumerate(NAMES):
            w.writerow([f'Review {i}, class {c}: "naïve" café — {name.lower()} ✓', name])
    return buf.getvalue()


@pytest.mark.parametrize("encoding,bom", [("utf-16-le", codecs.BOM_UTF16_LE), ("utf-16-be", codecs.BOM_UTF16_BE),
                                          ("utf-8", codecs.BOM_UTF8), ("utf-32-le", codecs.BOM_UTF32_LE)])
def test_csv_with_a_byte_order_mark_reads_like_utf8(tmp_path, encoding, bom):
    text = _five_class_csv()
    plain = tmp_path / "plain.csv"
    plain.write_bytes(text.encode("utf-8"))
    marked = tmp_path / "marked.csv"
    marked.write_bytes(bom + text.encode(encoding))
    a, b = read_local(plain, COLS), read_local(marked, COLS)
    assert list(b.columns) == ["text", "sentiment"]  # the mark is not part of the first column's name
    assert b.equals(a) and len(b) == 60
    assert b.loc[0, "text"] == 'Review 0, class 0: "naïve" café — very negative ✓'


def test_utf16_jsonl_and_json_with_a_mark(tmp_path):
    rows = [{"text": "très bien ✓", "label": "Positive"}, {"text": "nul", "label": "Negative"}]
    jl = tmp_path / "r.jsonl"
    jl.write_bytes("\n".join(json.dumps(r, ensure_ascii=False) for r in rows).encode("utf-16"))
    js = tmp_path / "r.json"
    js.write_bytes(json.dumps(rows, ensure_ascii=False).encode("utf-16"))
    for p in (jl, js):
        assert read_local(p, COLS).to_dict("records") == rows
    assert text_encoding(jl) == "utf-16"


def test_utf16_without_a_mark_is_refused_with_the_iconv_command(tmp_path):
    p = tmp_path / "export.csv"
    p.write_bytes(_five_class_csv().encode("utf-16-le"))  # valid UTF-8 bytes (NULs), but not the text
    with pytest.raises(DataError) as exc:
        read_local(p, COLS)
    assert "UTF-16 text without a byte-order mark (UTF-16LE" in exc.value.message
    assert f"iconv -f UTF-16LE -t UTF-8 {p} > {tmp_path / 'export-utf8.csv'}" in exc.value.hint


def test_latin1_is_refused_with_the_conversion_command(tmp_path):
    p = tmp_path / "r.csv"
    p.write_bytes("text,label\ncafé au lait,1\n".encode("latin-1"))
    with pytest.raises(DataError) as exc:
        read_local(p, COLS)
    assert "not valid UTF-8 (byte 0xe9 at offset 14)" in exc.value.message
    assert f"iconv -f CP1252 -t UTF-8 {p} >" in exc.value.hint


def test_a_broken_utf16_file_names_its_mark(tmp_path):
    p = tmp_path / "r.csv"
    p.write_bytes(codecs.BOM_UTF16_LE + "text,label\n".encode("utf-16-le") + b"\x00\xd8")  # a lone surrogate
    with pytest.raises(DataError, match="UTF-16 byte-order mark but is not valid UTF-16"):
        read_local(p, COLS)


def _settings_in(hint: str) -> list[str]:
    """The `--set KEY=VALUE` overrides a hint tells the user to run with."""
    return re.findall(r"--set (\S+=[^\s`]+)", hint)


def _prepare(tmp_path, name: str, overrides: list[str]) -> dict:
    cfg = load_config("demo", overrides)
    return prepare_dataset(cfg.data, tmp_path / name, tmp_path / "raw")


def test_string_labels_under_the_demo_preset_hint_gives_the_settings_that_work(tmp_path):
    """The 5-class string-label CSV, UTF-16 with a mark as Excel saves it, run under the demo preset (numeric or
    polarity classes): the hint names `data.label_names=null`, and running with what it says works."""
    src = tmp_path / "reviews.csv"
    src.write_bytes(codecs.BOM_UTF16_LE + _five_class_csv().encode("utf-16-le"))
    user = [f"data.path={src}", "data.label_column=sentiment"]
    with pytest.raises(DataError) as exc:
        _prepare(tmp_path, "a", user)
    assert "Negative', 'Neutral', 'Positive', 'Very Negative', 'Very Positive'] " in exc.value.message
    assert "`--set data.label_names=null`" in exc.value.hint or \
        "`--set data.label_map=null --set data.label_names=null`" in exc.value.hint
    assert "(5 values: Negative, Neutral, Positive, Very Negative, Very Positive)" in exc.value.hint
    fixes = _settings_in(exc.value.hint)
    assert "data.label_names=null" in fixes
    meta = _prepare(tmp_path, "b", user + fixes)  # five classes from the data, every review kept
    assert meta["label_names"] == sorted(NAMES) and sum(meta["sizes"].values()) == 60
    assert sorted(load_prepared(tmp_path / "b")[1].values()) == sorted(NAMES)


def test_string_labels_under_numeric_classes(tmp_path):
    src = tmp_path / "reviews.csv"
    src.write_text(_five_class_csv(), encoding="utf-8")
    cfg = DataConfig(path=str(src), label_column="sentiment", label_names=["1", "2", "3", "4", "5"])
    with pytest.raises(DataError) as exc:
        prepare_dataset(cfg, tmp_path / "a", tmp_path / "raw")
    assert "are outside the classes ['1', '2', '3', '4', '5']" in exc.value.message
    assert exc.value.hint.startswith("run with `--set data.label_names=null` to take the classes from the data "
                                     "(5 values: Negative, Neutral, Positive, Very Negative, Very Positive)")


def test_a_partial_label_mismatch_keeps_the_general_hint(tmp_path):
    src = tmp_path / "r.csv"
    src.write_text("text,sentiment\n" + "".join(f"t{i},{1 + i % 5}\n" for i in range(40)) + "odd one,6\n")
    cfg = DataConfig(path=str(src), label_column="sentiment", label_names=["1", "2", "3", "4", "5"])
    with pytest.raises(DataError) as exc:
        prepare_dataset(cfg, tmp_path / "a", tmp_path / "raw")
    assert "labels ['6'] are outside" in exc.value.message
    assert "fix those rows" in exc.value.hint and "`--set data.label_names=null`" in exc.value.hint


POLARITY = {1: "negative", 2: "negative", 3: None, 4: "positive", 5: "positive"}


def test_label_map_turns_stars_into_polarity_and_drops_the_middle(tmp_path):
    src = tmp_path / "r.jsonl"
    src.write_text("".join(json.dumps({"text": f"review {i} with {s} stars", "rating": s}) + "\n"
                           for s in (1, 2, 3, 4, 5) for i in range(10)))
    cfg = DataConfig(path=str(src), label_column="rating", label_map=POLARITY, label_names=["negative", "positive"],
                     test_fraction=0.3, val_fraction=0.2)
    assert cfg.label_map == {"1": "negative", "2": "negative", "3": None, "4": "positive", "5": "positive"}
    meta = prepare_dataset(cfg, tmp_path / "o", tmp_path / "raw")
    assert meta["dropped_by_label_map"] == 10 and meta.get("dropped_missing_label", 0) == 0
    assert sum(meta["sizes"].values()) == 40
    assert {s: sum(c.values()) for s, c in meta["class_counts"].items()} == meta["sizes"]
    assert meta["class_counts"]["test"] == {"negative": 6, "positive": 6}


def test_label_map_refuses_an_unmapped_value_and_a_class_outside_label_names(tmp_path):
    src = tmp_path / "r.jsonl"
    src.write_text("".join(json.dumps({"text": f"t{i}", "rating": 1 + i % 6}) + "\n" for i in range(30)))
    cfg = DataConfig(path=str(src), label_column="rating", label_map=POLARITY, label_names=None)
    with pytest.raises(DataError) as exc:
        prepare_dataset(cfg, tmp_path / "o", tmp_path / "raw")
    assert "labels ['6'] (first on row 6) are not in data.label_map" in exc.value.message
    assert "null drops" in exc.value.hint
    with pytest.raises(ConfigError, match="label_map maps to \\['good'\\], which are not in label_names"):
        load_config("demo", ["data.label_map={1: bad, 5: good}", "data.label_names=[bad, neutral]"])
