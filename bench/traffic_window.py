"""Reading a traffic window: wall time and peak memory of `read_window` over N recorded texts.

A spawned child writes N synthetic records (seeded) into a fresh store, in parts of `--part-rows` laid out as the
writer lays them (ttt_pipeline/io/traffic_capture.py's write_part, over `--days` date partitions); this process,
which has imported only the reader's libraries, then times read_window over the whole span twice (cold: every
part's footer checked; warm: the footers cached) and a 1,000-text sample_texts, and reports its peak RSS
(getrusage: DuckDB's native memory included) against the RSS it had before the first read.

    .venv/bin/python -m bench.traffic_window --records 1000000 --json
Last stdout line: one JSON object.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing
import os
import resource
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

START = dt.datetime(2024, 5, 1, tzinfo=dt.timezone.utc)
LABELS = ["1", "2", "4", "5"]


def synthetic(n: int, offset: int, total: int, days: int, seed: int):
    """Records `offset` to `offset + n` of `total`, spread evenly over `days` days from START, as a TRAFFIC_SCHEMA
    table."""
    import numpy as np
    import pyarrow as pa

    from ttt_pipeline.io.traffic_capture import TRAFFIC_SCHEMA

    rng = np.random.default_rng([seed, offset])
    idx = np.arange(offset, offset + n)
    step_ms = days * 86_400_000 // max(1, total)
    label = rng.integers(0, len(LABELS), n)
    raw = np.where(rng.random(n) < 0.1, rng.integers(0, len(LABELS), n), -1)
    words = rng.integers(1, 200, n).astype(np.int32)
    cols = {
        "ts": pa.array(int(START.timestamp() * 1000) + idx * step_ms, pa.int64()).cast(pa.timestamp("ms", "UTC")),
        "model_name": ["reviews"] * n, "model_version": [str(1 + i % 3) for i in idx.tolist()],
        "method": ["spell" if i % 2 else "none" for i in idx.tolist()],
        "label": [LABELS[k] for k in label], "probability": rng.random(n).astype(np.float32),
        "raw_label": [LABELS[k] if k >= 0 else None for k in raw],
        "text": [f"synthetic review {i} of the traffic window bench" for i in idx.tolist()],
        "text_length": (words * 5).astype(np.int32), "word_count": words,
        "oov_words_share": rng.random(n).astype(np.float32), "repaired_words_share": rng.random(n).astype(np.float32),
        "non_letter_character_share": rng.random(n).astype(np.float32),
        "foreign_script_share": rng.random(n).astype(np.float32), "truncated": rng.random(n) < 0.01,
    }
    return pa.Table.from_arrays([pa.array(cols[f.name], f.type) for f in TRAFFIC_SCHEMA], schema=TRAFFIC_SCHEMA)


def write_store(root: str, records: int, part_rows: int, days: int, seed: int) -> dict:
    """The child's work: the store, and what the machine is (torch imported here, not in the timed process)."""
    import fsspec
    import pyarrow as pa

    from ttt_pipeline.io.traffic_capture import write_part
    from ttt_pipeline.modeling.precision import machine_summary

    fs = fsspec.filesystem("file")
    t0, parts = time.perf_counter(), 0
    for offset in range(0, records, part_rows):
        table = synthetic(min(part_rows, records - offset), offset, records, days, seed)
        days_of = table.column("ts").cast(pa.int64()).to_numpy() // 86_400_000
        for day in sorted(set(days_of.tolist())):  # cut at midnight, as the writer does
            date = (dt.date(1970, 1, 1) + dt.timedelta(days=day)).isoformat()
            name = f"part-bench-{offset // part_rows:06d}-{day}.parquet"
            write_part(fs, f"{root}/date={date}", name, table.filter(pa.array(days_of == day)))
            parts += 1
    machine = machine_summary()
    return {"write_s": round(time.perf_counter() - t0, 2), "parts": parts,
            "cpu_capability": machine["cpu_capability"], "processor": machine["processor"]}


def log(*a) -> None:  # bench.common's, which would import torch into the measured process
    print(*a, file=sys.stderr, flush=True)


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--part-rows", type=int, default=2_000, help="rows per part (the writer's flush_rows)")
    p.add_argument("--days", type=int, default=7)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    from ttt_pipeline.io import traffic_window
    from ttt_pipeline.io.traffic_window import read_window, sample_texts

    with tempfile.TemporaryDirectory() as root:
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            wrote = pool.submit(write_store, root, args.records, args.part_rows, args.days, args.seed).result()
        log(f"[traffic-window] wrote {args.records} records in {wrote['parts']} parts, {wrote['write_s']} s")
        span = (START, START + dt.timedelta(days=args.days + 1))
        before = rss_mb()
        times = {}
        for run in ("cold", "warm"):
            t0 = time.perf_counter()
            win = read_window(root, *span)
            times[f"read_window_{run}_s"] = round(time.perf_counter() - t0, 3)
        t0 = time.perf_counter()
        sample = sample_texts(root, *span, 1000, seed=args.seed)
        times["sample_texts_1000_s"] = round(time.perf_counter() - t0, 3)
        store_mb = sum(f.stat().st_size for f in Path(root).rglob("*.parquet")) / 2**20
    out = {"records": args.records, "n": win["n"], "parts": win["parts"], "skipped_parts": len(win["skipped_parts"]),
           "sampled": len(sample), **times, "rss_before_read_mb": round(before, 1), "peak_rss_mb": round(rss_mb(), 1),
           "store_mb": round(store_mb, 1), "duckdb_memory_limit": traffic_window.MEMORY_LIMIT,
           "threads": os.cpu_count(), **wrote}
    print(json.dumps(out) if args.json else json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
