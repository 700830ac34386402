"""One set of readers: a file read as training data (`data.readers.read_local`) and as batch prediction's input
(`io.predict.read_rows`, streamed by `data.records`) gives the same review texts, in the same order, whatever its
format and encoding; and both refuse a file that is not UTF-8 with the same message."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from ttt_pipeline.data.readers import read_local
from ttt_pipeline.errors import DataError
from ttt_pipeline.io.predict import read_rows

# Quotes, the delimiters, a line break inside a review, non-ASCII letters, an emoji and a leading space.
TEXTS = ["Great little speaker, loud and clear.", 'Broke after a week, "sturdy" my foot.',
         "Two lines:\nthe strap is flimsy;\tthe sound is fine.", "Très bien, straße, 日本語 👍", " leading space"]
ROWS = [{"text": t, "label": i % 2} for i, t in enumerate(TEXTS)]


def _write(folder: Path, fmt: str, encoding: str = "utf-8") -> Path:
    frame = pd.DataFrame(ROWS)
    path = folder / f"reviews.{fmt}"
    if fmt in ("csv", "tsv"):
        frame.to_csv(path, index=False, sep="\t" if fmt == "tsv" else ",", encoding=encoding)
    elif fmt == "jsonl":
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in ROWS), encoding=encoding)
    elif fmt == "json":
        path.write_text(json.dumps({"reviews": ROWS}, ensure_ascii=False), encoding=encoding)
    else:
        frame.to_parquet(path)
    return path


@pytest.mark.parametrize("fmt, encoding", [("csv", "utf-8"), ("tsv", "utf-8"), ("jsonl", "utf-8"), ("json", "utf-8"),
                                           ("parquet", "utf-8"), ("csv", "utf-8-sig"), ("tsv", "utf-16"),
                                           ("jsonl", "utf-32")])
def test_training_and_predict_read_the_same_texts(tmp_path, fmt, encoding):
    path = _write(tmp_path, fmt, encoding)
    training = read_local(path, ["text", "label"])["text"].tolist()
    predict = read_rows(path, "text")
    assert not predict.bad
    assert training == predict.texts == TEXTS


def test_training_and_predict_refuse_a_latin1_file_alike(tmp_path):
    path = tmp_path / "reviews.csv"
    path.write_bytes("text,label\nCafé au lait,1\n".encode("latin-1"))
    with pytest.raises(DataError) as training:
        read_local(path, ["text", "label"])
    with pytest.raises(DataError) as predict:
        read_rows(path, "text")
    assert str(training.value) == str(predict.value)
    assert "not valid UTF-8" in str(training.value) and "iconv -f CP1252" in training.value.hint
