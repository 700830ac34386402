"""Progress of long loops: for people, a bar (tqdm: done/total, rate, time left) on stderr when it is a terminal,
else a plain line every 20 s and at each quarter of the stage (so a fast stage still shows its rate and time
left in a log); for the UI, a Prefect progress artifact. TTT_PROGRESS=bar|lines|off overrides the
choice (1 = bar)."""

from __future__ import annotations

import os
import sys
import time

from tqdm.auto import tqdm


def _artifact(key: str):
    try:
        from prefect.artifacts import create_progress_artifact, update_progress_artifact

        aid = create_progress_artifact(0.0, key=key, description=f"{key}: progress")
        return lambda pct: update_progress_artifact(aid, pct)
    except Exception:  # outside a run context (plain library use) there is nothing to update
        return None


# library progress stage -> (what people read, unit of `done`)
STAGES = {"mlm_warmup": ("MLM-head warm-up (may stop early)", "steps"),
          "dapt": ("domain-adaptive MLM", "steps"), "finetune": ("fine-tuning (may stop early)", "steps"),
          # each test review is scored once per set (clean, each corrupted copy, each domain) and method (and
          # mask seed): the count is of those scorings, more than the test reviews, so the label says so
          "evaluate": ("evaluation (reviews x sets x methods)", "scorings"), "attribute": ("attribution", "items")}
LINE_EVERY_S = 20.0


def progress_mode() -> str:
    """bar (stderr is a terminal), lines (a log, a pipe, CI) or off; TTT_PROGRESS overrides."""
    forced = os.environ.get("TTT_PROGRESS", "").strip().lower()
    if forced in ("bar", "1"):
        return "bar"
    if forced in ("lines", "off"):
        return forced
    return "bar" if sys.stderr.isatty() and os.environ.get("TERM") != "dumb" else "lines"


def duration(seconds: float) -> str:
    """12 s, 3 min 05 s, 1 h 02 min."""
    s = int(round(max(0.0, seconds)))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def progress_line(label: str, done: int, total: int, unit: str, elapsed: float) -> str:
    """`fine-tuning: 120/450 steps (27%), 2.1 steps/s, about 2 min 37 s left` (rate and time left from the
    average since the stage started)."""
    pct = 100.0 * done / total if total else 100.0
    line = f"{label}: {done}/{total} {unit} ({pct:.0f}%)"
    if done > 0 and elapsed > 0:
        rate = done / elapsed
        line += f", {rate:.1f} {unit}/s" if rate >= 1 else f", {1 / rate:.1f} s per {unit[:-1] if unit.endswith('s') else unit}"
        line += f", about {duration((total - done) / rate)} left" if done < total else f", done in {duration(elapsed)}"
    return line


class Reporter:
    """Callable(stage, done, total, info) as the library's `progress` hook expects."""

    def __init__(self, key: str, mode: str | None = None):
        self.key = key
        self.bars: dict[str, tqdm] = {}
        self.mode = mode or progress_mode()
        self.enabled = self.mode == "bar"
        self.started: dict[str, float] = {}
        self.last_line: dict[str, float] = {}
        self.quarter: dict[str, int] = {}
        self.update_artifact = _artifact(key)
        self.last_push = 0.0

    def __call__(self, stage: str, done: int, total: int, info: dict) -> None:
        label, unit = STAGES.get(stage, (stage, "steps"))
        now = time.monotonic()
        self.started.setdefault(stage, now)
        if self.mode == "bar":
            bar = self.bars.get(stage)
            if bar is None:
                self.close()  # the previous stage (the MLM warm-up before fine-tuning) is over
                bar = self.bars[stage] = tqdm(total=total, desc=label, unit=unit.rstrip("s") or unit,
                                              file=sys.stderr, leave=False, dynamic_ncols=True)
            bar.total = total
            bar.n = done
            if info:
                bar.set_postfix({k: f"{v:.3f}" for k, v in info.items()}, refresh=False)
            bar.refresh()
        elif self.mode == "lines":
            last = self.last_line.get(stage)
            quarter = 4 * done // max(1, total)
            if last is None or now - last >= LINE_EVERY_S or done >= total or quarter > self.quarter.get(stage, 0):
                self.last_line[stage] = now
                self.quarter[stage] = quarter
                extra = "".join(f", {k.replace('_', ' ')} {v:.3f}" for k, v in info.items())
                print("  " + progress_line(label, done, total, unit, now - self.started[stage]) + extra,
                      file=sys.stderr, flush=True)
        if self.update_artifact and (now - self.last_push > 2.0 or done >= total):
            self.last_push = now
            try:
                self.update_artifact(100.0 * done / max(1, total))
            except Exception:
                self.update_artifact = None  # never let the UI feed break a training run

    def close(self) -> None:
        for bar in self.bars.values():
            if not bar.disable:
                bar.close()
