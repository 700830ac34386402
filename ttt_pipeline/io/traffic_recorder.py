"""Traffic capture for one classifier: each predicted text as a TRAFFIC_SCHEMA row, handed to the store's writer.

`TrafficRecorder.predict(texts, method, overrides)` answers as `Classifier.predict` does and records, per text: the
time, the model's name and version, the method, the predicted label and its probability, the label-free
descriptors (evaluation.descriptors.text_descriptors against the model's training vocabulary, vocabulary.json, and
the scripts of its words), `raw_label` (the prediction on the unrepaired text) only where the method's repair
changed the text, `truncated` (longer than the model reads) and the text unless `store_text` is false.

Cost on the request path: the descriptors (regular expressions, linear in the text), one tokenisation for
`truncated` (the served answer's flag too), and the texts the repair changed scored once more unrepaired, by the
method's engine alone (in the same pass where the method batches: Classifier.predict_with_raw); a descriptor
repair of its own only when the request's method repairs differently from the model's default. The
writing is off the path (the writer's queue and thread, io/traffic_capture.py). Recording never fails a request:
a fault in the descriptors or the rows is counted (`stats()`) and logged once a minute at most; the prediction
is answered as without capture.

Settings: `CaptureSettings`, from arguments (`ttt-pipeline predict --capture URI`) or from the environment of a
served model (`from_env`: TTT_MONITORING_CAPTURE=1, TTT_MONITORING_TRAFFIC_URI, TTT_MONITORING_STORE_TEXT,
TTT_MODEL_NAME, TTT_MODEL_VERSION), which `ttt-pipeline serve` sets from the configuration's monitoring section.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from ttt_pipeline.errors import ConfigError

log = logging.getLogger(__name__)

ENV_CAPTURE = "TTT_MONITORING_CAPTURE"
ENV_URI = "TTT_MONITORING_TRAFFIC_URI"
ENV_STORE_TEXT = "TTT_MONITORING_STORE_TEXT"
ENV_MODEL_NAME = "TTT_MODEL_NAME"
ENV_MODEL_VERSION = "TTT_MODEL_VERSION"
UNKNOWN = "unknown"
WARN_EVERY_S = 60.0
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off", ""}


def _flag(environ: Mapping[str, str], name: str, default: bool) -> bool:
    value = environ.get(name)
    if value is None:
        return default
    text = value.strip().lower()
    if text not in _TRUE | _FALSE:
        raise ConfigError(f"{name}={value!r} is not a yes/no value", f"set {name} to 1 or 0 (true / false)")
    return text in _TRUE


@dataclass(frozen=True)
class CaptureSettings:
    """Where and what to record: the store (a folder or fsspec URL), whether texts are kept, and the model's name
    and version as the records name them."""

    uri: str
    store_text: bool = True
    model_name: str = UNKNOWN
    model_version: str = UNKNOWN

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, fallback_version: str | None = None
                 ) -> "CaptureSettings | None":
        """The served model's settings from its environment; None unless TTT_MONITORING_CAPTURE is on. Without
        TTT_MODEL_NAME / TTT_MODEL_VERSION (a model served by `mlflow models serve` directly), the name is
        `unknown` and the version `fallback_version` (the model's run id), else `unknown`."""
        environ = os.environ if environ is None else environ
        if not _flag(environ, ENV_CAPTURE, False):
            return None
        uri = (environ.get(ENV_URI) or "").strip() or "traffic"
        return cls(uri=uri if "://" in uri else str(Path(uri).expanduser().resolve()),
                   store_text=_flag(environ, ENV_STORE_TEXT, True),
                   model_name=(environ.get(ENV_MODEL_NAME) or "").strip() or UNKNOWN,
                   model_version=(environ.get(ENV_MODEL_VERSION) or "").strip() or fallback_version or UNKNOWN)


def capture_env(monitoring, model_name: str, model_version: str) -> dict[str, str]:
    """The environment a served model captures under (the configuration's monitoring section; the store's local
    folder made absolute, so every worker of every back end writes the same one); {} when capture is off."""
    if not monitoring.capture:
        return {}
    uri = monitoring.traffic_uri
    return {ENV_CAPTURE: "1", ENV_URI: uri if "://" in uri else str(Path(uri).expanduser().resolve()),
            ENV_STORE_TEXT: "1" if monitoring.store_text else "0", ENV_MODEL_NAME: str(model_name),
            ENV_MODEL_VERSION: str(model_version)}


def vocabulary_scripts(vocabulary: Mapping[str, int]) -> frozenset[str]:
    """The training data's scripts (descriptors.training_scripts' rule: at least MIN_SCRIPT_SHARE of the letters)
    from the stored vocabulary, each word's letters counted as often as the word occurred in training: the
    scripts the calibration read off the training texts, less the words seen once (not in vocabulary.json)."""
    from collections import Counter

    from ttt_pipeline.evaluation.descriptors import MIN_SCRIPT_SHARE, script_counts

    total: Counter = Counter()
    for word, n in vocabulary.items():
        for name, k in script_counts(word).items():
            total[name] += k * n
    letters = sum(total.values())
    return frozenset(name for name, k in total.items() if letters and k / letters >= MIN_SCRIPT_SHARE)


class TrafficRecorder:
    """Predicts and records through one classifier (`ttt_pipeline.classifier.Classifier`); `writer` defaults to
    this process's writer of the store (io.traffic_capture.writer_for)."""

    def __init__(self, classifier, settings: CaptureSettings, writer=None):
        from ttt_pipeline.monitoring import descriptor_method

        self.clf, self.settings = classifier, settings
        self._writer = writer
        vocabulary = classifier.vocabulary
        if vocabulary:
            self.vocabulary, self.scripts = frozenset(vocabulary), vocabulary_scripts(vocabulary)
        else:  # said once, at load: the shares then read against nothing the model was trained on
            log.warning("%s: no training vocabulary stored with the model: captured oov_words_share counts every "
                        "word and foreign_script_share every non-Latin letter", classifier.source or "classifier")
            self.vocabulary, self.scripts = frozenset(), frozenset({"LATIN"})
        self.descriptor_method = descriptor_method(classifier.method)
        self.failed = self.recorded = 0
        self.last_error: str | None = None
        self._lock = threading.Lock()
        self._last_warning = float("-inf")

    @property
    def writer(self):
        if self._writer is None:
            from ttt_pipeline.io.traffic_capture import writer_for

            self._writer = writer_for(self.settings.uri)
        return self._writer

    def predict(self, texts: list[str], method: str | None = None, overrides: Mapping[str, Any] | None = None,
                progress: Callable[[int, int], None] | None = None) -> list[dict[str, Any]]:
        """`Classifier.predict`'s answer for `texts`, each text recorded (never an error from the recording)."""
        overrides = dict(overrides or {})
        probs, name, seen, raw = self.clf.predict_with_raw(texts, method, progress, **overrides)
        truncated = self.record(texts, name, probs, seen, overrides, raw)
        records = self.clf.records(probs)
        if truncated is not None:  # the served answer's flag, without tokenising twice
            for r, cut in zip(records, truncated):
                r["truncated"] = cut
        return records

    def record(self, texts: list[str], method: str, probs, seen: list[str] | None,
               overrides: Mapping[str, Any], raw: Mapping[int, Any]) -> list[bool] | None:
        """Hands the rows of one prediction to the writer; a fault is counted and logged, never raised. Returns
        each text's `truncated` as recorded (None when the rows could not be made)."""
        try:
            rows = self.rows(texts, method, probs, seen, overrides, raw)
            writer = self.writer  # made on first use: a store that cannot open is a fault like any other
        except Exception as exc:  # a side effect never breaks the prediction it records
            self._failed(len(texts), repr(exc))
            return
        writer.record(rows)  # never raises: the writer drops and counts what it cannot store
        with self._lock:
            self.recorded += len(rows)
        return [r["truncated"] for r in rows]

    def rows(self, texts: list[str], method: str, probs, seen: list[str] | None,
             overrides: Mapping[str, Any], raw_probs: Mapping[int, Any]) -> list[dict[str, Any]]:
        """The TRAFFIC_SCHEMA rows (less `ts`, stamped by the writer) of one prediction; `raw_probs` the class
        probabilities of the texts the repair changed, unrepaired (Classifier.predict_with_raw)."""
        from ttt_pipeline.evaluation.descriptors import text_descriptors

        if not texts:
            return []
        names = self.clf.label_names
        top = probs.argmax(axis=1)
        raw = {i: names[int(np.argmax(p))] for i, p in raw_probs.items()}
        repaired = seen if self._same_repair(method, overrides) else self.clf.repair_texts(texts,
                                                                                            self.descriptor_method)
        described = text_descriptors(texts, repaired, self.vocabulary, self.scripts)
        truncated = self.clf.truncated(seen if seen is not None else texts)
        s = self.settings
        return [{"model_name": s.model_name, "model_version": s.model_version, "method": method,
                 "label": names[int(k)], "probability": float(probs[i, int(k)]), "raw_label": raw.get(i),
                 "text": texts[i] if s.store_text else None, "truncated": bool(truncated[i]),
                 **{d: float(v[i]) for d, v in described.items()}}
                for i, k in enumerate(top)]

    def _same_repair(self, method: str, overrides: Mapping[str, Any]) -> bool:
        """Whether the request's repairs are the descriptors' own, at the model's settings (then the texts the
        engine saw are the repaired texts, and no second repair runs)."""
        from ttt_pipeline.defenses import registry

        repairs = registry.parse(method).repairs
        touched = any(k.split(".")[0] in repairs for k in overrides)
        return "+".join(repairs) == self.descriptor_method and not touched

    def _failed(self, n: int, why: str) -> None:
        with self._lock:
            self.failed += n
            self.last_error = why
            warn = time.monotonic() - self._last_warning >= WARN_EVERY_S
            if warn:
                self._last_warning = time.monotonic()
        if warn:
            log.warning("traffic capture: %d text(s) not recorded (%d in all): %s", n, self.failed, why)

    def stats(self) -> dict:
        """What was recorded and what failed here, and the writer's own counts (written, dropped, ...)."""
        with self._lock:
            own = {"recorded": self.recorded, "failed": self.failed, "last_capture_error": self.last_error}
        try:
            return {**self.writer.stats(), **own}
        except Exception as exc:  # a writer that cannot even start (a bad URL): its error is the figure
            return {**own, "writer_error": repr(exc)}

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
