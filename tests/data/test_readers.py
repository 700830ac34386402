"""Every supported format reads to the same rows; every bad input is a DataError naming the file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest
import torch

from ttt_pipeline.data.readers import read_local
from ttt_pipeline.errors import DataError

ROWS = [{"text": "Great little speaker, loud and clear.", "label": 5},
        {"text": "Broke after a week, \"sturdy\" my foot.", "label": 1},
        {"text": "Okay for the price; the strap is flimsy.", "label": 3}]
COLS = ["text", "label", "input_ids"]


def _write(tmp: Path, fmt: str) -> Path:
    df = pd.DataFrame(ROWS)
    p = tmp / f"reviews.{fmt}"
    if fmt == "csv":
        df.to_csv(p, index=False)
    elif fmt == "tsv":
        df.to_csv(p, index=False, sep="\t")
    elif fmt == "jsonl":
        p.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n")
    elif fmt == "json":
        p.write_text(json.dumps(ROWS))
    elif fmt == "parquet":
        df.to_parquet(p)
    elif fmt == "pt":
        torch.save([(r["text"], r["label"], torch.tensor([101, 7, 102])) for r in ROWS], p)
    return p


@pytest.mark.parametrize("fmt", ["csv", "tsv", "jsonl", "json", "parquet", "pt"])
def test_each_format_reads_the_same_rows(tmp_path, fmt):
    df = read_local(_write(tmp_path, fmt), COLS)
    assert df["text"].tolist() == [r["text"] for r in ROWS]
    assert [int(x) for x in df["label"].tolist()] == [5, 1, 3]


def test_mdsd_folder_unescapes_entities(tmp_path):
    (tmp_path / "positive.review").write_text(
        "<reviews><review><rating>5.0</rating><title>ok</title>"
        "<review_text>\nIt &amp;quot;just works&amp;quot; &amp;amp; fast\n</review_text></review></reviews>")
    df = read_local(tmp_path, COLS)
    assert df["text"].tolist() == ['It "just works" & fast']
    assert df["rating"].tolist() == ["5.0"]


def test_real_mdsd_electronics(mdsd_dir):
    df = read_local(mdsd_dir / "electronics", COLS)
    assert len(df) == 2000
    assert sorted(df["rating"].unique()) == ["1.0", "2.0", "4.0", "5.0"]
    assert not df["text"].str.contains("&quot;").any()


class Evil:
    def __reduce__(self):
        return (os.system, ("touch /tmp/ttt-pwned-by-pt",))


def test_hostile_pt_is_refused_and_never_runs(tmp_path):
    marker = Path("/tmp/ttt-pwned-by-pt")
    marker.unlink(missing_ok=True)
    p = tmp_path / "evil.pt"
    torch.save([("text", 1, Evil())], p)
    with pytest.raises(DataError, match="refused"):
        read_local(p, COLS)
    assert not marker.exists()


@pytest.mark.parametrize("name,content,match", [
    ("empty.csv", b"", "empty"),
    ("bad.jsonl", b'{"text": "a", "label": 1}\n{"text": oops}\n', r"bad.jsonl:2: invalid JSON"),
    ("latin.csv", "text,label\ncaf\xe9 ok,1\n".encode("latin-1"), "not valid UTF-8"),
    ("bad.csv", b'text,label\n"unterminated,1\nx,2,3,4\n', "cannot parse"),
    ("scalar.json", b"42", "list of objects"),
    ("reviews.xlsx", b"PK..", "unsupported file type"),
    ("broken.parquet", b"PAR1nonsense", "Parquet"),
])
def test_bad_files_name_the_file(tmp_path, name, content, match):
    p = tmp_path / name
    p.write_bytes(content)
    with pytest.raises(DataError, match=match) as exc:
        read_local(p, COLS)
    assert name in str(exc.value)


def test_missing_path(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        read_local(tmp_path / "nope.csv", COLS)
