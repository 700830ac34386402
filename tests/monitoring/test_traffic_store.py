"""The traffic store: records in, a window's aggregates out; and every way the store can fail without the caller
seeing it (unwritable, full queue, bad rows, a part cut short, hostile texts, several writing processes)."""

from __future__ import annotations

import datetime as dt
import json
import logging
import multiprocessing
import threading
import time
import uuid

import fsspec
import pytest

from ttt_pipeline.errors import PipelineError
from ttt_pipeline.io.traffic_capture import TrafficWriter, writer_for
from ttt_pipeline.io.traffic_window import enforce_retention, read_window, sample_texts

UTC = dt.timezone.utc
T0 = dt.datetime(2024, 5, 1, 22, 0, tzinfo=UTC)


def row(i: int, **over) -> dict:
    base = dict(ts=T0 + dt.timedelta(minutes=30 * i), model_name="reviews", model_version=str(1 + i % 2),
                method="spell" if i % 2 else "none", label="pos" if i % 3 else "neg", probability=0.5 + 0.125 * (i % 3),
                raw_label=None, text=f"review {i}", text_length=10 + i, word_count=2 + i % 2,
                oov_words_share=0.25 * (i % 2), repaired_words_share=0.5, non_letter_character_share=0.125,
                foreign_script_share=0.0, truncated=i == 4)
    base.update(over)
    return base


def written(uri, rows, **kw) -> TrafficWriter:
    w = TrafficWriter(uri, **kw)
    w.record(rows)
    w.close()
    return w


def test_a_window_aggregates_exactly_the_records_in_it(tmp_path):
    rows = [row(i) for i in range(6)]  # 22:00 .. 00:30 next day: two date partitions
    rows[0]["raw_label"] = "pos"  # repair changed the text and the label (neg -> pos)
    rows[1]["raw_label"] = "pos"  # ... and the label stayed
    w = written(tmp_path, rows, flush_rows=3)  # parts: rows 0-2; rows 3-5, cut at midnight into 3 and 4-5
    assert w.stats()["written"] == 6 and w.stats()["dropped"] == 0 and w.stats()["parts"] == 3
    assert sorted(p.parent.name for p in tmp_path.glob("date=*/part-*.parquet")) == \
        ["date=2024-05-01", "date=2024-05-01", "date=2024-05-02"]
    # [start, end): the first row (at start) in, the last (at end) out
    win = read_window(tmp_path, T0, T0 + dt.timedelta(minutes=150))
    assert win["n"] == 5 and win["skipped_parts"] == [] and win["parts"] == 3
    assert win["sums"]["text_length"] == 10 + 11 + 12 + 13 + 14
    assert win["means"]["text_length"] == 12.0 and win["means"]["word_count"] == pytest.approx(2.4)
    assert win["sums"]["oov_words_share"] == 0.5 and win["means"]["oov_words_share"] == pytest.approx(0.1)
    assert win["sums"]["repaired_words_share"] == 2.5 and win["sums"]["foreign_script_share"] == 0
    assert win["mean_probability"] == pytest.approx((0.5 + 0.625 + 0.75 + 0.5 + 0.625) / 5)
    assert win["labels"] == {"neg": 2, "pos": 3} and win["methods"] == {"none": 3, "spell": 2}
    assert win["model_versions"] == {"reviews": {"1": 3, "2": 2}}
    assert (win["raw_label_recorded"], win["raw_label_changed"], win["truncated"]) == (2, 1, 1)
    only = read_window(tmp_path, T0, T0 + dt.timedelta(hours=1), columns=["probability"])
    assert only["n"] == 2 and only["sums"] == {"probability": 1.125}


def test_an_empty_window_counts_nothing(tmp_path):
    assert read_window(tmp_path / "never-written", T0, T0 + dt.timedelta(days=1))["n"] == 0
    written(tmp_path, [row(0)])
    win = read_window(tmp_path, T0 + dt.timedelta(minutes=1), T0 + dt.timedelta(days=3))
    assert (win["n"], win["labels"], win["means"]["text_length"], win["sums"]["text_length"]) == (0, {}, None, 0)
    with pytest.raises(PipelineError, match="timezone-aware"):
        read_window(tmp_path, T0.replace(tzinfo=None), T0)


def test_a_memory_url_store_round_trips():
    uri = f"memory://traffic-{uuid.uuid4().hex}"
    try:
        written(uri, [row(i) for i in range(4)])
        win = read_window(uri, T0, T0 + dt.timedelta(days=1))
        assert win["n"] == 4 and win["sums"]["text_length"] == 46 and win["labels"] == {"neg": 2, "pos": 2}
        assert sorted(sample_texts(uri, T0, T0 + dt.timedelta(days=1), 10, seed=0)) == [f"review {i}" for i in range(4)]
    finally:
        fs, path = fsspec.core.url_to_fs(uri)
        fs.rm(path, recursive=True)


def test_an_unwritable_store_drops_and_counts_with_one_warning(tmp_path, caplog):
    (tmp_path / "afile").write_text("a file, not a folder")  # runs as root: chmod would not stop the writes
    caplog.set_level(logging.WARNING, logger="ttt_pipeline.io.traffic_capture")
    w = TrafficWriter(tmp_path / "afile" / "sub", flush_rows=2)
    assert w.record([row(i) for i in range(6)]) is None
    w.close()
    s = w.stats()
    assert (s["written"], s["dropped"], s["failed_parts"]) == (0, 6, 3) and "sub" in s["last_error"]
    assert len([r for r in caplog.records if "dropped" in r.getMessage()]) == 1  # once a minute at most


class GatedFS:
    """A local filesystem whose first makedirs waits for `release`: a store that hangs."""

    def __init__(self):
        self.fs = fsspec.filesystem("file")
        self.entered, self.release = threading.Event(), threading.Event()

    def makedirs(self, *a, **kw):
        self.entered.set()
        assert self.release.wait(10)
        return self.fs.makedirs(*a, **kw)

    def __getattr__(self, name):
        return getattr(self.fs, name)


def test_a_full_queue_drops_and_counts_without_blocking(tmp_path):
    gate = GatedFS()
    w = TrafficWriter(str(tmp_path), fs=gate, max_queue=5, flush_rows=1)
    w.record([row(0)])
    assert gate.entered.wait(10)  # the thread holds row 0 and hangs in the store
    t = time.perf_counter()
    w.record([row(i) for i in range(1, 11)])
    assert time.perf_counter() - t < 0.5
    assert w.stats()["dropped"] == 5 and w.stats()["queued"] == 5
    gate.release.set()
    w.close()
    assert (w.stats()["written"], w.stats()["dropped"]) == (6, 5)
    assert read_window(tmp_path, T0, T0 + dt.timedelta(days=2))["n"] == 6


def test_rows_that_do_not_fit_are_dropped_alone(tmp_path):
    w = written(tmp_path, [row(0), {"label": "pos"}, row(1, probability="high"), "not a row", row(2)])
    assert (w.stats()["written"], w.stats()["dropped"]) == (2, 3)
    assert w.record(None) is None and w.record([row(3)]) is None  # after close: dropped, never raised
    assert w.stats()["dropped"] == 4
    assert read_window(tmp_path, T0, T0 + dt.timedelta(days=2))["n"] == 2


def test_rows_without_a_time_are_stamped_and_flushed_by_time(tmp_path):
    w = TrafficWriter(tmp_path, flush_rows=1000, flush_seconds=0.2)
    before = dt.datetime.now(UTC).replace(microsecond=0)
    w.record([row(0, ts=None), row(1, ts=None)])
    deadline = time.monotonic() + 10
    while w.stats()["written"] < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert w.stats()["written"] == 2  # by time, not by size, and before close()
    w.close()
    assert read_window(tmp_path, before, dt.datetime.now(UTC) + dt.timedelta(seconds=1))["n"] == 2


def test_a_part_cut_short_is_skipped_and_named(tmp_path):
    written(tmp_path, [row(i) for i in range(3)])
    good = next(tmp_path.glob("date=2024-05-01/part-*.parquet"))
    cut = good.with_name("part-crashed.parquet")
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    (good.parent / ".tmp-part-inflight.parquet").write_bytes(b"PAR1 half")  # a writer's temp: ignored
    win = read_window(tmp_path, T0, T0 + dt.timedelta(days=1))
    assert win["n"] == 3 and win["skipped_parts"] == [str(cut)] and win["parts"] == 1
    cut.write_bytes(good.read_bytes())  # same name, new size: read again (a copy of the good part's 3 rows)
    assert read_window(tmp_path, T0, T0 + dt.timedelta(days=1))["n"] == 6


def test_hostile_texts_are_stored(tmp_path):
    nul, lone, big = "a\x00b", "bad \ud800 surrogate", "x" * 1_000_000
    written(tmp_path / "capped", [row(0, text=nul), row(1, text=lone), row(2, text=big)])
    texts = sample_texts(tmp_path / "capped", T0, T0 + dt.timedelta(days=1), 10, seed=0)
    assert sorted(texts, key=len) == [nul, "bad \ufffd surrogate", "x" * 100_000]
    written(tmp_path / "whole", [row(2, text=big)], max_text_chars=2_000_000)
    assert sample_texts(tmp_path / "whole", T0, T0 + dt.timedelta(days=1), 10, seed=0) == [big]


def test_a_sample_is_fixed_by_its_seed(tmp_path):
    written(tmp_path, [row(i % 4, text=f"t{i}") for i in range(200)] + [row(1, text=None)])
    span = (T0, T0 + dt.timedelta(days=2))
    first = sample_texts(tmp_path, *span, 20, seed=1)
    assert len(first) == len(set(first)) == 20 and first == sample_texts(tmp_path, *span, 20, seed=1)
    assert first != sample_texts(tmp_path, *span, 20, seed=2)
    assert len(sample_texts(tmp_path, *span, 1000, seed=1)) == 200  # the row without a stored text left out


def write_marked(uri: str, proc: int, n: int, close: bool) -> None:
    w = writer_for(uri, flush_rows=700)
    for start in range(0, n, 50):
        w.record([row(0, text=f"p{proc}-{k}") for k in range(start, min(n, start + 50))])
    if close:
        w.close(timeout=60)
    # else: the atexit flush writes what is queued


def test_two_processes_write_one_store_at_once(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=write_marked, args=(str(tmp_path), p, 5_000, p == 0)) for p in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    assert read_window(tmp_path, T0, T0 + dt.timedelta(days=1))["n"] == 10_000
    texts = sample_texts(tmp_path, T0, T0 + dt.timedelta(days=1), 20_000, seed=0)
    assert len(texts) == len(set(texts)) == 10_000
    assert {t.split("-")[0] for t in texts} == {"p0", "p1"}
    assert not list(tmp_path.rglob(".tmp-*"))


def test_retention_removes_old_partitions_only(tmp_path):
    days = [dt.datetime(2024, 5, d, 12, tzinfo=UTC) for d in (1, 2, 3, 9)]
    written(tmp_path, [row(0, ts=t) for t in days])
    (tmp_path / "date=notadate").mkdir()
    removed = enforce_retention(tmp_path, 7, now=dt.datetime(2024, 5, 10, 6, tzinfo=UTC))  # cut: 2024-05-03
    assert sorted(removed) == [str(tmp_path / "date=2024-05-01"), str(tmp_path / "date=2024-05-02")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["date=2024-05-03", "date=2024-05-09", "date=notadate"]
    assert read_window(tmp_path, days[0], days[-1] + dt.timedelta(days=1))["n"] == 2
    assert enforce_retention(tmp_path, 7, now=dt.datetime(2024, 5, 10, 6, tzinfo=UTC)) == []
    with pytest.raises(PipelineError, match="retention"):
        enforce_retention(tmp_path, -1, now=days[0])


def test_one_writer_per_process_and_store(tmp_path):
    a = writer_for(tmp_path / "s")
    assert writer_for(str(tmp_path / "s") + "/") is a
    a.close()
    b = writer_for(tmp_path / "s")
    assert b is not a and not b.closed
    b.close()


def test_the_window_bench_reads_back_every_record(capsys):
    from bench import traffic_window

    traffic_window.main(["--records", "3000", "--part-rows", "1000", "--days", "2", "--json"])
    out = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert (out["records"], out["n"], out["skipped_parts"], out["sampled"]) == (3000, 3000, 0, 1000)
    assert out["parts"] >= 3 and out["peak_rss_mb"] >= out["rss_before_read_mb"] > 0
