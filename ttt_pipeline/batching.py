"""Request batching: calls that arrive while the model is busy are scored together in its next pass.

A served model is called from many threads at once (`mlflow models serve` runs each request in a worker thread).
Scored one call at a time, a request of one review leaves the matrix units idle between tiny batches, and under
concurrency its latency is the queue in front of the model's lock. `RequestBatcher` gathers the calls that wait:
the first caller of a batch leads it: it waits for the model (the lock every pass takes), and every call with the
same key that arrives meanwhile joins its batch, up to `max_texts` texts; when the model is free the leader closes
the batch, scores all its texts in one call of `score` and hands each caller its own rows. A call that finds no
open batch (or only a full one) opens the next. A lone request on an idle model is scored at once, without waiting,
unless `max_wait_s` asks the leader to hold its batch open that long first (more joiners, more latency).

Only calls whose answer does not depend on the rest of the batch may share one: the caller decides by the key (the
classifier batches plain prediction and the text repairs, which act on each text alone, and keeps the adapting
engines' one-request episodes: their statistics are per request). The pass pads each of its mini-batches to its
longest text, so a text's logits may differ from its lone answer in the last float bits, never by more.

A failure in `score` reaches every caller of that batch; a caller's own bad input is found before it joins.
Plain threads and a lock: the callers are threads, and nothing here outlives a call (no thread of its own).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable

import numpy as np


@dataclass
class _Batch:
    key: Hashable
    texts: list[str] = field(default_factory=list)
    calls: int = 1
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None


@dataclass(frozen=True)
class BatchStats:
    """Counts since the batcher was made: calls, passes (model calls), texts, and the largest pass."""

    calls: int
    passes: int
    texts: int
    largest: int


class RequestBatcher:
    """Coalesces concurrent `submit(key, texts)` calls of one key into single `score(key, texts, calls)` passes
    (`calls`: how many callers share it).

    `score` returns a tuple whose items are row-aligned with `texts` (arrays or lists) or None; each caller gets
    the same tuple cut to its rows. `model_lock` is the lock a pass holds (shared with the callers that do not
    batch, so the two never run at once)."""

    def __init__(self, score: Callable[[Hashable, list[str], int], tuple], model_lock: threading.Lock,
                 max_texts: int = 64, max_wait_s: float = 0.0):
        if max_texts < 1 or max_wait_s < 0:
            raise ValueError(f"max_texts must be >= 1 and max_wait_s >= 0, got {max_texts}, {max_wait_s}")
        self.score, self.model_lock = score, model_lock
        self.max_texts, self.max_wait_s = max_texts, max_wait_s
        self._open: dict[Hashable, _Batch] = {}
        self._guard = threading.Lock()
        self._calls = self._passes = self._texts = self._largest = 0

    def submit(self, key: Hashable, texts: list[str]) -> tuple:
        """This call's rows of the pass its texts were scored in."""
        batch, start, leader = self._join(key, texts)
        if leader:
            self._lead(batch)
        else:
            batch.done.wait()
        if batch.error is not None:
            raise batch.error
        return tuple(_rows(part, start, start + len(texts)) for part in batch.result)

    def stats(self) -> BatchStats:
        with self._guard:
            return BatchStats(self._calls, self._passes, self._texts, self._largest)

    def _join(self, key: Hashable, texts: list[str]) -> tuple[_Batch, int, bool]:
        """(the batch the call is in, where its rows start, whether it leads): the key's open batch while it has
        room (a call larger than `max_texts` always leads a batch of its own), else a new one."""
        with self._guard:
            self._calls += 1
            batch = self._open.get(key)
            if batch is not None and batch.texts and len(batch.texts) + len(texts) <= self.max_texts:
                start = len(batch.texts)
                batch.texts.extend(texts)
                batch.calls += 1
                return batch, start, False
            batch = _Batch(key, list(texts))
            self._open[key] = batch
            return batch, 0, True

    def _lead(self, batch: _Batch) -> None:
        if self.max_wait_s > 0:
            time.sleep(self.max_wait_s)
        with self.model_lock:
            with self._guard:  # no one joins once the model is ours
                if self._open.get(batch.key) is batch:
                    del self._open[batch.key]
                texts, calls = list(batch.texts), batch.calls
                self._passes += 1
                self._texts += len(texts)
                self._largest = max(self._largest, len(texts))
            try:
                batch.result = self.score(batch.key, texts, calls)
            except BaseException as exc:  # every caller of the batch learns it
                batch.error = exc
            finally:
                batch.done.set()


def _rows(part, start: int, end: int):
    if part is None:
        return None
    return part[start:end] if isinstance(part, (np.ndarray, list)) else part
