"""A trained review classifier as one object: texts in; label, its probability and the class probabilities out,
under any defense (`none`, `spell`, `masked_ttt`, `spell+masked_ttt`, ...).

    from ttt_pipeline import load_classifier
    clf = load_classifier("models:/ttt-review-classifier@champion", tracking_uri="sqlite:///mlflow.db")
    clf.predict(["Great sound, battery lasts all day."], method="masked_ttt", steps=3)
    # [{"label": "5", "probability": 0.61, "probabilities": {"1": 0.02, ..., "5": 0.61}}]

The inference configuration is a flat dict: `method` plus the scalar `ttt.*` settings (mask_prob, steps, lr,
seed, batch_size, spell.max_edit_distance, tent.lr, ...; `inference_fields`). A logged MLflow Model stores it as its
model config; every call may override any of it. Predictions go through `evaluate.predict_texts`, the code the
evaluate step scores with, so the same texts in the same batches give the evaluate step's numbers.

Masked TTT and Tent adapt the shared model in place and restore it after every batch: a lock serialises the
calls of one Classifier, so concurrent callers (the threads of `mlflow models serve`) never see each other's
adapted weights. Calls of the methods whose answer is the text's alone (plain prediction and the text repairs,
which act on each text by itself) that arrive while the model is busy are scored together in its next pass
(batching.RequestBatcher; `batch_requests`); the adapting engines keep one call per episode, as their statistics
are per request.

No MLflow here: folders load directly; `ttt_pipeline.io.mlflow_model.load_classifier` also takes run ids and
`models:/` URIs (downloaded, then loaded from here).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import logging
import threading
import typing
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from ttt_pipeline.batching import RequestBatcher
from ttt_pipeline.errors import ConfigError, PipelineError
from ttt_pipeline.metrics import softmax
from ttt_pipeline.modeling.layout import is_model_folder, model_folder  # noqa: F401 (model_folder: callers import it here)

log = logging.getLogger(__name__)

# TTTConfig fields that are not per-request inference settings
_NOT_INFERENCE = {"methods", "mask_seeds", "score_clean", "signal_every"}
_TYPES = {bool: "boolean", int: "long", float: "double", str: "string"}
BATCH_TEXTS, BATCH_WAIT_MS = 64, 0.0  # request batching's defaults: texts per pass, the leader's wait
PREFIX_CHARS_PER_TOKEN = 16  # Classifier.truncated: characters of a long text's head per token the model reads
# The pyfunc loader a logged model names (ttt_pipeline.io.mlflow_model); models logged before the package
# layout named ttt_pipeline.mlflow_model, which stays importable for them.
LOADER_MODULE = "ttt_pipeline.io.mlflow_model"
OLD_LOADER_MODULES = ("ttt_pipeline.mlflow_model",)


@functools.cache
def inference_fields() -> dict[str, str]:
    """The scalar `ttt.*` settings a caller may set per request, a defense's own as `<defense>.<knob>`
    (`spell.max_edit_distance`): name -> MLflow param type. The schema is fixed, so it is read once, not on every
    request (callers must not change the dict)."""
    from ttt_pipeline.config import TTTConfig

    return {k: v for k, v in _scalar_fields(TTTConfig).items() if k.split(".")[0] not in _NOT_INFERENCE}


def _scalar_fields(model_type, prefix: str = "") -> dict[str, str]:
    from pydantic import BaseModel

    out = {}
    for name, field in model_type.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out.update(_scalar_fields(ann, f"{prefix}{name}."))
            continue
        if typing.get_origin(ann) is typing.Literal:
            kinds = {type(a) for a in typing.get_args(ann)}
            ann = kinds.pop() if len(kinds) == 1 else None
        if ann in _TYPES:
            out[prefix + name] = _TYPES[ann]
    return out


def inference_config(ttt=None, method: str = "none") -> dict[str, Any]:
    """`method` (the defense the model applies unless a request names another: the pipeline logs its
    `evaluation.default_defense`) plus every inference setting of a TTTConfig (defaults when None)."""
    from ttt_pipeline.config import TTTConfig, flatten

    flat = flatten(ttt if ttt is not None else TTTConfig())
    return {"method": method, **{k: flat[k] for k in inference_fields()}}


def settings_error(exc) -> str:
    parts = []
    for e in exc.errors():
        loc = [str(p) for p in e["loc"]]
        name = "method" if loc[:1] == ["methods"] else "ttt." + ".".join(loc)
        parts.append(f"{name}: {e['msg'].removeprefix('Value error, ')}")
    return "; ".join(parts)


def _head(text: str, chars: int) -> str:
    """The text's first `chars` characters less the word the cut fell in; the whole text when they hold no space."""
    cut = text[:chars].rsplit(None, 1)
    return cut[0] if len(cut) == 2 else text


def check_texts(texts: Iterable[Any]) -> list[str]:
    """A list of strings; a lone string is one text. Anything else names the offending position."""
    if isinstance(texts, str):
        return [texts]
    out = list(texts)
    for i, t in enumerate(out):
        if not isinstance(t, str):
            raise PipelineError(f"text {i} is {type(t).__name__}, not a string",
                                "give every review as a string (missing texts cannot be classified)")
    return out


@dataclasses.dataclass(frozen=True)
class _BatchKey:
    """What calls sharing a pass have in common: the method, its settings (as JSON; `ttt` rides along) and whether
    the unrepaired texts are scored too."""

    name: str
    settings: str
    repairs: bool
    engine: str
    raw: bool  # the pass also scores the unrepaired texts its repairs changed (traffic capture)
    ttt: Any = dataclasses.field(compare=False, hash=False)


class Classifier:
    """A ReviewClassifier with its tokenizer, label names, inference configuration and spell vocabulary."""

    def __init__(self, model, tokenizer, config: dict[str, Any] | None = None,
                 vocabulary: dict[str, int] | None = None, device="cpu", source: str | None = None):
        self.model, self.tokenizer = model, tokenizer
        self.label_names: list[str] = list(model.meta.label_names)
        self.max_length: int = model.meta.max_length
        self.vocabulary = vocabulary
        self.device = device
        self.source = source
        self._lock = threading.Lock()
        # `truncated` runs outside the model's lock (a served answer's flag must not queue behind a forward pass)
        # on its own copy of the tokenizer: a fast tokenizer keeps its truncation setting in shared state, so
        # two threads that tokenise with different max_length through one instance read each other's setting.
        self._length_lock = threading.Lock()
        self._length_tokenizer = None
        self._repair_cache: dict[tuple, Callable[[list[str]], list[str]]] = {}
        self._runtimes: dict[str, Any] = {}
        self._batcher: RequestBatcher | None = None
        self.config = inference_config(method="none")
        self.configure(**(config or {}))
        self.batch_requests(BATCH_TEXTS, BATCH_WAIT_MS)

    def batch_requests(self, max_texts: int = BATCH_TEXTS, max_wait_ms: float = BATCH_WAIT_MS) -> "Classifier":
        """Score concurrent calls of a batch-independent method together, up to `max_texts` texts a pass, the
        first caller waiting `max_wait_ms` for others before it takes the model (0: only while the model is busy);
        `max_texts` 0 scores every call alone. Returns self."""
        if max_texts < 0 or max_wait_ms < 0:
            raise ConfigError(f"request batching: max_texts {max_texts} and max_wait_ms {max_wait_ms} must be >= 0",
                              "give max_texts 0 to score each call alone, else the texts per pass (64)")
        self._batcher = (RequestBatcher(self._score_batch, self._lock, max_texts, max_wait_ms / 1000)
                         if max_texts else None)
        return self

    @property
    def batching(self):
        """The request batcher's counts (batching.BatchStats), None when calls are scored alone."""
        return None if self._batcher is None else self._batcher.stats()

    # ------------------------------------------------------------------ configuration

    def configure(self, **settings) -> "Classifier":
        """Change the default inference configuration (validated); returns self."""
        method, ttt = self.settings(**settings)
        self.config = inference_config(ttt, method)
        return self

    @property
    def method(self) -> str:
        return self.config["method"]

    def settings(self, method: str | None = None, **overrides) -> tuple[str, Any]:
        """(method name, validated TTTConfig) of one call: the configuration with `overrides` on top."""
        from pydantic import ValidationError

        from ttt_pipeline.config import MOVED_KEYS, TTTConfig, nest

        fields = inference_fields()
        unknown = sorted(set(overrides) - set(fields) - {"method"})
        if unknown:
            moved = [f"{k} is now {MOVED_KEYS[k]}" for k in unknown if k in MOVED_KEYS]
            raise ConfigError(f"unknown inference setting(s) {unknown}",
                              "; ".join(moved) if moved else
                              f"settings are method and the ttt.* fields {', '.join(fields)}")
        merged = {**self.config, **{k: v for k, v in overrides.items() if v is not None}}
        name = method or merged.pop("method", None) or "none"
        merged.pop("method", None)
        try:
            # no held-out probes when serving: they are the evaluation's measurement, not the prediction's
            ttt = TTTConfig.model_validate({**nest(merged), "methods": [name], "signal_every": 0})
        except ValidationError as exc:
            raise ConfigError(f"invalid inference settings: {settings_error(exc)}",
                              "see `ttt-pipeline config --schema` (section ttt) for the allowed values") from None
        self._check_runnable(name)
        return name, ttt

    def _check_runnable(self, name: str) -> None:
        """A method this model cannot run is refused, never answered by another (masked TTT without an MLM head)."""
        from ttt_pipeline.defenses import registry

        if registry.needs_mlm(name) and getattr(self.model, "mlm_head", None) is None:
            runnable = [m for m, kind, _ in registry.describe() if not (kind == "engine" and registry.needs_mlm(m))]
            raise ConfigError(f"method {name} adapts on an MLM head, and this model has none",
                              f"use one of {', '.join(runnable)}; or evaluate the model again with "
                              "--set ttt.mlm_from=BASE_CHECKPOINT (the masked LM it was fine-tuned from)")

    # ------------------------------------------------------------------ prediction

    def _repairs(self, name: str, ttt) -> list[Callable[[list[str]], list[str]]]:
        """The method's text repairs, built once per setting (a spelling dictionary and its index take about a
        second)."""
        from ttt_pipeline.config import flatten
        from ttt_pipeline.defenses import registry

        repairs = registry.parse(name).repairs
        key = (*((k, v) for k, v in flatten(ttt).items() if k.split(".")[0] in repairs), self.vocabulary is not None)
        for r in repairs:  # said once per repair, when it is built
            wants = getattr(registry.own_settings(r, ttt), "vocabulary", None) == "train"
            if wants and self.vocabulary is None and (r, *key) not in self._repair_cache:
                log.warning("%s: no training vocabulary stored with this model; %s uses its dictionary only",
                            self.source or "classifier", r)
        context = {"vocabulary": self.vocabulary} if self.vocabulary is not None else {}
        return registry.build_repairs(name, ttt, context, self._repair_cache, key)

    def runtime(self, precision: str):
        """The machine choices of calls at this `ttt.precision` (modeling/precision.py `Runtime`), resolved once per
        value and logged then: the Classifier is where a user's calls start, so it decides what the pipeline's
        `steps.runtime` decides for a run."""
        if precision not in self._runtimes:
            from ttt_pipeline.modeling.precision import resolve_runtime

            found = resolve_runtime(self.device, score_precision=precision)
            log.info("%s: scoring precision %s (%s)", self.source or "classifier", found.score.name,
                     found.score.reason)
            self._runtimes[precision] = found
        return self._runtimes[precision]

    def prepare(self, method: str | None = None, **overrides) -> "Classifier":
        """Build what a method needs before the first call (spell's dictionary and index take about a second)
        and decide its precision; returns self."""
        name, ttt = self.settings(method, **overrides)
        with self._lock:
            self._repairs(name, ttt)
            self.runtime(ttt.precision)
        return self

    def predict_logits(self, texts: Iterable[str], method: str | None = None,
                       progress: Callable[[int, int], None] | None = None, **overrides) -> np.ndarray:
        """Class logits (n x classes) under the configured method, or `method` and `overrides` for this call."""
        return self._predict(texts, method, progress, overrides)[0]

    def predict_traced(self, texts: Iterable[str], method: str | None = None,
                       progress: Callable[[int, int], None] | None = None,
                       **overrides) -> tuple[np.ndarray, str, list[str] | None]:
        """(class probabilities, the method's name, the texts its engine saw: after its repairs, None when it has
        none). The same probabilities as `predict_proba`; the caller learns which texts the repairs changed
        without repairing twice (traffic capture)."""
        logits, name, seen, _ = self._predict(texts, method, progress, overrides)
        return softmax(logits), name, seen

    def predict_with_raw(self, texts: Iterable[str], method: str | None = None,
                         progress: Callable[[int, int], None] | None = None,
                         **overrides) -> tuple[np.ndarray, str, list[str] | None, dict[int, np.ndarray]]:
        """`predict_traced`'s (probabilities, method, texts seen) and {index: class probabilities} of each text the
        repairs changed, unrepaired, by the method's engine alone: what the repair changed in the answer (traffic
        capture's raw_label), scored under the same hold of the model (in the same pass where the method batches)."""
        logits, name, seen, raw = self._predict(texts, method, progress, overrides, raw=True)
        changed = np.flatnonzero(~np.isnan(raw[:, 0]))
        return softmax(logits), name, seen, dict(zip(changed.tolist(), softmax(raw[changed])))

    def _predict(self, texts, method, progress, overrides: dict, raw: bool = False) -> tuple:
        """(logits, method name, texts seen or None, the changed texts' unrepaired logits or None): through the
        request batcher where the call may share a pass, else alone under the lock (the engines adapt the shared
        weights in place and restore them: one call at a time)."""
        texts = check_texts(texts)
        name, ttt = self.settings(method, **overrides)
        key = self._batch_key(name, ttt, raw)
        if not texts:
            empty = np.zeros((0, len(self.label_names)), dtype=np.float32)
            return empty, name, [] if key.repairs else None, empty
        if self._batcher is not None and progress is None and key.engine == "none":
            logits, seen, raw_logits = self._batcher.submit(key, texts)
        else:  # batching off, a caller watching its own call's progress, or an engine that adapts per call
            with self._lock:
                logits, seen, raw_logits = self._score_batch(key, texts, 1, progress)
        return logits, name, seen, raw_logits

    def _batch_key(self, name: str, ttt, raw: bool) -> "_BatchKey":
        from ttt_pipeline.defenses import registry

        parsed = registry.parse(name)
        return _BatchKey(name, ttt.model_dump_json(), bool(parsed.repairs), parsed.engine, raw, ttt)

    def _score_batch(self, key: "_BatchKey", texts: list[str], calls: int = 1, progress=None) -> tuple:
        """One pass (the caller holds the lock) for `calls` callers: (logits, the texts after the repairs or None,
        with `key.raw` the changed texts' logits unrepaired by the engine alone, NaN rows where the repairs changed
        nothing, else None)."""
        seen = self._repaired(key.name, key.ttt, texts)
        # A pass of several calls goes shortest first: each mini-batch pads to its longest text, and a plain
        # forward pass's answer does not depend on its neighbours (but for the last float bits), so it costs less
        # padding; every row comes back in the callers' order. A lone call keeps its own order: the evaluate
        # step's batches, its numbers bit for bit.
        order = sorted(range(len(seen)), key=lambda i: len(seen[i])) if calls > 1 else list(range(len(seen)))
        logits = np.empty((len(seen), len(self.label_names)), dtype=np.float32)
        logits[order] = self._forward(key.name, key.ttt, [seen[i] for i in order], progress)
        raw = None
        if key.raw:
            changed = [i for i, (a, b) in enumerate(zip(texts, seen)) if a != b]
            raw = np.full_like(logits, np.nan)
            if changed:
                raw[changed] = self._forward(key.engine, key.ttt, [texts[i] for i in changed])
        return logits, (list(seen) if key.repairs else None), raw

    def _repaired(self, name: str, ttt, texts: list[str]) -> list[str]:
        for fix in self._repairs(name, ttt):
            texts = fix(texts)
        return texts

    def _forward(self, method: str, ttt, texts: list[str], progress=None) -> np.ndarray:
        """`method`'s logits of texts already repaired (the evaluate step's code: predict_texts)."""
        from ttt_pipeline.evaluation.scoring import predict_texts

        return predict_texts(self.model, self.tokenizer, texts, method, ttt, self.max_length, ttt.batch_size,
                             self.device, progress, [], self.runtime(ttt.precision).score.dtype)

    def repair_texts(self, texts: Iterable[str], method: str | None = None, **overrides) -> list[str] | None:
        """The texts after `method`'s repairs (default: the configured method's); None when it has none."""
        from ttt_pipeline.defenses import registry

        texts = check_texts(texts)
        name, ttt = self.settings(method, **overrides)
        if not registry.parse(name).repairs:
            return None
        with self._lock:  # the repairs' cache is shared with predictions
            return list(self._repaired(name, ttt, texts))

    def truncated(self, texts: Iterable[str]) -> list[bool]:
        """Whether each text is longer than the model reads (`max_length` tokens, special tokens included). A long
        text is first tokenised as its head only, cut at a space after PREFIX_CHARS_PER_TOKEN characters a token:
        the words of the head are words of the text, so a head of more tokens proves the text truncated, and a
        1 MB review costs a few KB of tokenising; only a head of fewer tokens sends the whole text through."""
        texts = check_texts(texts)
        chars = PREFIX_CHARS_PER_TOKEN * self.max_length
        heads = [t if len(t) <= chars else _head(t, chars) for t in texts]
        longer = self._longer(heads)
        again = [i for i, (t, h, long) in enumerate(zip(texts, heads, longer)) if not long and h is not t]
        for i, long in zip(again, self._longer([texts[i] for i in again])):
            longer[i] = long
        return longer

    def _longer(self, texts: list[str]) -> list[bool]:
        if not texts:
            return []
        with self._length_lock:
            if self._length_tokenizer is None:
                self._length_tokenizer = copy.deepcopy(self.tokenizer)
            ids = self._length_tokenizer(texts, truncation=True, max_length=self.max_length + 1)["input_ids"]
        return [len(row) > self.max_length for row in ids]

    def predict_proba(self, texts: Iterable[str], method: str | None = None, **overrides) -> np.ndarray:
        """Class probabilities (n x classes, columns in `label_names` order)."""
        return softmax(self.predict_logits(texts, method, **overrides))

    def predict(self, texts: Iterable[str], method: str | None = None,
                progress: Callable[[int, int], None] | None = None, **overrides) -> list[dict[str, Any]]:
        """One dict per text: `label`, its `probability` and every class's `probabilities`."""
        return self.records(softmax(self.predict_logits(texts, method, progress, **overrides)))

    def records(self, probs: np.ndarray) -> list[dict[str, Any]]:
        names = self.label_names
        out = []
        for row in probs:
            k = int(row.argmax())
            out.append({"label": names[k], "probability": float(row[k]),
                        "probabilities": {n: float(p) for n, p in zip(names, row)}})
        return out

    def __repr__(self) -> str:
        return (f"Classifier({self.source or 'in memory'}: labels {self.label_names}, method {self.method!r}, "
                f"{self.model.meta.base_model})")


# ---------------------------------------------------------------------- loading


def mlflow_model_parts(path: Path) -> tuple[Path, dict[str, Any]] | None:
    """(classifier folder, stored inference configuration) of an MLflow Model folder logged by this package,
    read from its MLmodel file (YAML) without importing MLflow; None when `path` holds no MLmodel."""
    import yaml

    mlmodel = path / "MLmodel"
    if not mlmodel.is_file():
        return None
    try:
        spec = yaml.safe_load(mlmodel.read_text(encoding="utf-8")) or {}
        pyfunc = spec["flavors"]["python_function"]
    except (yaml.YAMLError, KeyError, TypeError):
        raise PipelineError(f"{path}: MLmodel has no python_function flavour",
                            "give a model logged by ttt-pipeline (its finetune step)") from None
    if pyfunc.get("loader_module") not in (LOADER_MODULE, *OLD_LOADER_MODULES):
        raise PipelineError(f"{path}: an MLflow Model of another kind (loader {pyfunc.get('loader_module')!r})",
                            f"give a model logged by ttt-pipeline (loader {LOADER_MODULE})")
    folder = model_folder(path / pyfunc.get("data", "data/model"))
    if folder is None:
        raise PipelineError(f"{path}: the MLflow Model holds no classifier files under {pyfunc.get('data')}",
                            "the model folder is incomplete: download it again")
    return folder, known_settings(dict(pyfunc.get("config") or {}), path)


def known_settings(config: dict[str, Any], where) -> dict[str, Any]:
    """A stored configuration's settings this version knows (a model logged by another version of the package
    keeps the rest of its configuration; the unknown ones are named in a warning)."""
    from ttt_pipeline.config import moved_keys

    config = moved_keys(config)  # a model logged before each defense owned its settings
    known = {"method", *inference_fields()}
    dropped = sorted(set(config) - known)
    if dropped:
        log.warning("%s: inference settings %s are not known to this version; ignored", where, dropped)
    return {k: v for k, v in config.items() if k in known}


def from_folder(folder: Path, config: dict[str, Any] | None = None, device: str = "auto",
                vocabulary: dict[str, int] | None = None, source: str | None = None) -> Classifier:
    """A Classifier from a saved model folder (encoder/ safetensors, head.safetensors, tokenizer/, meta.json;
    optional vocabulary.json). No remote code and no pickles are loaded."""
    from ttt_pipeline.defenses.vocabulary import FILE, read_vocabulary
    from ttt_pipeline.modeling.loading import load_model
    from ttt_pipeline.modeling.model import pick_device

    folder = Path(folder)
    if not any(f.suffix == ".safetensors" for sub in ("encoder", "classifier") for f in (folder / sub).glob("*")):
        raise PipelineError(f"{folder}: no safetensors weights under encoder/ (or classifier/)",
                            "only models saved by ttt-pipeline (safetensors, no pickles) are loaded")
    dev = pick_device(device)
    model, tokenizer = load_model(folder, dev)
    if vocabulary is None:
        vocabulary = read_vocabulary(folder / FILE)
    return Classifier(model, tokenizer, config, vocabulary, dev, source or str(folder))


def load_local(path: Path, config: dict[str, Any] | None = None, device: str = "auto",
               source: str | None = None) -> Classifier:
    """A local MLflow Model folder (its stored configuration, `config` on top) or a plain model folder."""
    path = Path(path).expanduser()
    parts = mlflow_model_parts(path)
    if parts is not None:
        folder, stored = parts
        return from_folder(folder, {**stored, **(config or {})}, device, source=source or str(path))
    folder = model_folder(path)
    if folder is None:
        raise PipelineError(f"{path}: no classifier here (no MLmodel, no meta.json + head.safetensors)",
                            "give the finetune step's model folder, an MLflow Model folder, a run id or "
                            "models:/<name>@<alias>")
    return from_folder(folder, config, device, source=source or str(path))
