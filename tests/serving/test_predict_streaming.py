"""`ttt-pipeline predict` streams: many rows in small chunks give the bytes a single pass gives, bad rows keep
their line numbers across chunks, and reading a file takes memory bounded by the chunk, not the file."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pandas as pd
import pytest
from serving_helpers import TEXTS

from ttt_pipeline.cli.main import main
from ttt_pipeline.errors import DataError
from ttt_pipeline.io import predict as P

N = 300  # rows of the generated input: ten chunks of 32 rows (one tiny-model batch each)


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    from ttt_pipeline.io.mlflow_model import load_classifier

    return load_classifier(tiny_model_dir, device="cpu")


def rows(n: int) -> list[dict]:
    return [{"id": i, "text": f"{TEXTS[i % len(TEXTS)]} Review {i}.", "stars": i % 5 + 1} for i in range(n)]


def single_pass(reference, src: Path, out: Path) -> bytes:
    """The output as predict wrote it before streaming: every row read, classified and written at once."""
    whole = P.read_rows(src)
    preds = reference.predict(whole.texts, "none")
    P.write_rows(out, [P.merge(r, p) for r, p in zip(whole.rows, preds)], whole.columns)
    return out.read_bytes()


@pytest.mark.parametrize("fmt_in, fmt_out", [("csv", "jsonl"), ("jsonl", "csv"), ("parquet", "json"),
                                             ("txt", "tsv"), ("jsonl", "parquet")])
def test_many_rows_in_chunks_give_the_single_pass_output(fmt_in, fmt_out, tiny_model_dir, reference, tmp_path,
                                                         monkeypatch, capsys):
    src = tmp_path / f"in.{fmt_in}"
    frame = pd.DataFrame(rows(N))
    {"csv": lambda: frame.to_csv(src, index=False), "parquet": lambda: frame.to_parquet(src, index=False),
     "jsonl": lambda: frame.to_json(src, orient="records", lines=True),
     "txt": lambda: src.write_text("\n".join(frame["text"]) + "\n", encoding="utf-8")}[fmt_in]()
    monkeypatch.setattr(P, "CHUNK_ROWS", 40)  # rounded down to 32 rows: whole batches (ttt.batch_size 32)
    calls = []
    real = P.iter_rows
    monkeypatch.setattr(P, "iter_rows", lambda *a, **k: calls.append(a[2] if len(a) > 2 else "default") or real(*a, **k))
    out = tmp_path / f"out.{fmt_out}"
    assert main(["predict", "--model", str(tiny_model_dir), "--input", str(src), "--output", str(out)]) == 0
    assert calls == ["default", 32]  # checked in default chunks, then classified in 32-row chunks
    want = single_pass(reference, src, tmp_path / f"want.{fmt_out}")
    if fmt_out == "parquet":  # the rows, not the file's bytes (a writer may lay out row groups differently)
        got, expected = pd.read_parquet(out), pd.read_parquet(tmp_path / f"want.{fmt_out}")
        assert len(got) == N and got.to_json() == expected.to_json()
    else:
        assert out.read_bytes() == want
    assert f"{N} reviews classified" in capsys.readouterr().err


def test_json_output_is_what_json_dump_writes(tmp_path):
    data = [{"text": "a\nb \u2028 é", "probabilities": {"x": 0.5, "y": [1, {}]}, "n": None}, {"text": "c"}]
    P.write_rows(tmp_path / "o.json", data, ["text", "n"])
    assert (tmp_path / "o.json").read_text(encoding="utf-8") == json.dumps(data, ensure_ascii=False, indent=1)
    P.write_rows(tmp_path / "e.json", [], ["text"])
    assert (tmp_path / "e.json").read_text() == "[]"


def test_bad_rows_keep_their_line_numbers_across_chunks(tiny_model_dir, tmp_path, monkeypatch, capsys):
    lines = ["text,stars"] + [f'"{TEXTS[i % 5]}",{i % 5}' for i in range(200)]
    lines[150] = '"too many",1,2'  # file line 151
    lines[90] = ",3"  # file line 91: blank text
    (tmp_path / "in.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    monkeypatch.setattr(P, "CHUNK_ROWS", 32)
    chunks = list(P.iter_rows(tmp_path / "in.csv", "text", 32))
    assert [len(c.rows) + len(c.bad) for c in chunks] == [32] * 6 + [8]
    assert [b for c in chunks for b in c.bad] == [("line 91", "'text' is blank"),
                                                   ("line 151", "3 fields, the header has 2")]
    out = tmp_path / "out.jsonl"
    assert main(["predict", "--model", str(tiny_model_dir), "--input", str(tmp_path / "in.csv"),
                 "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert "2 bad row(s): line 91: 'text' is blank; line 151: 3 fields, the header has 2" in err
    assert not out.exists()
    assert main(["predict", "--model", str(tiny_model_dir), "--input", str(tmp_path / "in.csv"),
                 "--output", str(out), "--skip-bad-rows", "--quiet"]) == 0
    assert len(out.read_text().splitlines()) == 198


def test_a_failure_mid_stream_leaves_no_output(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """A chunk that fails after others were written: the previous output stays, no partial file appears."""
    pd.DataFrame(rows(100)).to_csv(tmp_path / "in.csv", index=False)
    out = tmp_path / "out.jsonl"
    out.write_text("previous\n")
    monkeypatch.setattr(P, "CHUNK_ROWS", 32)
    real, seen = P.merge, []

    def failing(row, pred):
        seen.append(row)
        if len(seen) > 64:
            raise DataError("boom", "test")
        return real(row, pred)
    monkeypatch.setattr(P, "merge", failing)
    assert main(["predict", "--model", str(tiny_model_dir), "--input", str(tmp_path / "in.csv"),
                 "--output", str(out), "--quiet"]) == 2
    assert out.read_text() == "previous\n" and sorted(p.name for p in tmp_path.iterdir()) == ["in.csv", "out.jsonl"]


def test_online_ttt_reads_the_whole_input_at_once():
    from ttt_pipeline.config import TTTConfig

    assert P.chunk_size(TTTConfig(batch_size=32)) == P.CHUNK_ROWS // 32 * 32
    assert P.chunk_size(TTTConfig(batch_size=5000)) == 5000
    assert P.chunk_size(TTTConfig(online=True)) is None


def _write(fmt: str, path: Path, n: int) -> None:
    text = "The battery lasts all day, the sound is clear and the remote works from across the room. " * 2
    with open(path, "w", encoding="utf-8") as f:
        if fmt == "csv":
            f.write("id,text,stars\n")
            f.writelines(f'{i},"{text}{i}",{i % 5}\n' for i in range(n))
        elif fmt == "jsonl":
            f.writelines(json.dumps({"id": i, "text": f"{text}{i}"}) + "\n" for i in range(n))
        else:
            f.writelines(f"{text}{i}\n" for i in range(n))


def _peak(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "txt"])
def test_reading_takes_memory_bounded_by_the_chunk_not_the_file(fmt, tmp_path):
    """Scanning (the checking pass) and iterating chunks of 500 rows: the peak of Python allocations for a
    file of 40,000 rows (8 MB) is about that of 10,000 rows (2 MB; both past the encoding check's 1 MiB piece),
    and far below what holding every row takes."""
    small, large = tmp_path / f"small.{fmt}", tmp_path / f"large.{fmt}"
    _write(fmt, small, 10_000)
    _write(fmt, large, 40_000)

    def chunks(path):
        assert max(len(c.rows) + len(c.bad) for c in P.iter_rows(path, "text", 500)) == 500
    peaks = {p: _peak(lambda p=p: chunks(p)) for p in (small, large)}
    scans = {p: _peak(lambda p=p: P.scan_rows(p, "text")) for p in (small, large)}
    held = _peak(lambda: P.read_rows(large, "text"))
    assert P.scan_rows(large, "text").good == 40_000
    assert peaks[large] < 1.2 * peaks[small] + 100_000 and peaks[large] < held / 5
    assert scans[large] < 1.2 * scans[small] + 100_000 and scans[large] < held / 5


def test_parquet_is_read_by_record_batches(tmp_path):
    pd.DataFrame(rows(1000)).to_parquet(tmp_path / "in.parquet", index=False, row_group_size=300)
    chunks = list(P.iter_rows(tmp_path / "in.parquet", "text", 128))
    assert [len(c.rows) for c in chunks] == [128] * 7 + [104]
    assert [r["id"] for c in chunks for r in c.rows] == list(range(1000))
    indexed = pd.DataFrame(rows(10)).set_index("id")  # a stored index is not a review field, as pd.read_parquet
    indexed.to_parquet(tmp_path / "ix.parquet")
    assert P.read_rows(tmp_path / "ix.parquet").columns == ["text", "stars"]
