"""Progress of long loops: a bar on stderr for people, a Prefect progress artifact for the UI."""

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


class Reporter:
    """Callable(stage, done, total, info) as the library's `progress` hook expects."""

    def __init__(self, key: str):
        self.key = key
        self.bars: dict[str, tqdm] = {}
        self.enabled = sys.stderr.isatty() or os.environ.get("TTT_PROGRESS") == "1"
        self.update_artifact = _artifact(key)
        self.last_push = 0.0

    def __call__(self, stage: str, done: int, total: int, info: dict) -> None:
        if self.enabled:
            bar = self.bars.get(stage)
            if bar is None:
                bar = self.bars[stage] = tqdm(total=total, desc=stage, file=sys.stderr, leave=False)
            bar.total = total
            bar.n = done
            if info:
                bar.set_postfix({k: f"{v:.3f}" for k, v in info.items()}, refresh=False)
            bar.refresh()
        now = time.monotonic()
        if self.update_artifact and (now - self.last_push > 2.0 or done >= total):
            self.last_push = now
            try:
                self.update_artifact(100.0 * done / max(1, total))
            except Exception:
                self.update_artifact = None  # never let the UI feed break a training run

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()
