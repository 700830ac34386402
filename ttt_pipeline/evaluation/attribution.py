"""Training-data attribution with TRAK: which training reviews make the classifier say what it says.

TRAK (Park et al. 2023, the `traker` package) scores every (training review, target) pair by how much training
on that review raises the target's model output. Here the output is the multi-class margin of the attributed
class (its logit minus the log-sum-exp of the others, as in TRAK's classification tutorial), the out-to-loss
term is 1 - p(class), and gradients are taken only for a parameter subset, `params`:

- `head`: the classification head on the pooled vector;
- `head+lastN` (default `head+last1`): the head and the last N encoder layers.

The subset is cut out of the model as its own module (`Tail`): the frozen lower layers run once per batch
without gradients, and only the tail is differentiated per example, so 2,000 training reviews fit in minutes on
two CPU cores. traker's own `BasicProjector` (a seeded Gaussian JL projection) projects on CPU and its fast
`CudaProjector` (fast_jl, Rademacher) on a GPU when fast_jl is installed; fast_jl is never required.

Targets come from the evaluate step's stored predictions: the corrupted test reviews whose prediction the
corruption flipped, and the reviews a defense fixed or broke. A target's attributed class is the undefended
model's prediction on the text it saw, so its supporting reviews are those that push the model towards that
prediction and its opposing ones those that push away from it.

Pure core: no Prefect, no MLflow (io/step_logging.py and ttt_pipeline/tasks/ add those).
"""

from __future__ import annotations

import copy
import logging
import math
import re
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch
from torch import nn

from ttt_pipeline.errors import ConfigError, require_extra
from ttt_pipeline.modeling.model import ReviewClassifier, pool

PARAMS_RE = re.compile(r"^head(?:\+last([1-9][0-9]*))?$")
REASONS = ("flip", "fixed", "broke")
CPU_PROJECTOR_BYTES = 256 << 20  # the CPU projector's random block: regenerated per batch, kept this small


def tail_size(params: str) -> int:
    """Encoder layers in the attributed subset: `head` -> 0, `head+lastN` -> N."""
    m = PARAMS_RE.match(params)
    if not m:
        raise ValueError(f"'{params}' is not head or head+lastN (N >= 1), e.g. head+last1")
    return int(m.group(1) or 0)


def encoder_layers(model: ReviewClassifier) -> nn.ModuleList:
    """The encoder's transformer layers (BERT, RoBERTa and relatives keep them in `encoder.layer`)."""
    layers = getattr(getattr(model.encoder, "encoder", None), "layer", None)
    if not isinstance(layers, nn.ModuleList):
        raise ConfigError(f"attribution.params: the {type(model.encoder).__name__} encoder has no encoder.layer list "
                          "to take the last layers from", "set attribution.params=head")
    return layers


class Tail(nn.Module):
    """The attributed parameters as one module: copies of the last `n_layers` encoder layers and the head.

    Input: the hidden states entering the first copied layer (`boundary_states`) and the attention mask;
    output: class logits, equal to the full model's. Its attention runs in the `eager` implementation (plain
    matmuls, which torch.func.vmap differentiates per example)."""

    def __init__(self, model: ReviewClassifier, n_layers: int):
        super().__init__()
        layers = encoder_layers(model) if n_layers else nn.ModuleList()
        if n_layers > len(layers):
            raise ConfigError(f"attribution.params asks for the last {n_layers} encoder layers; the encoder has "
                              f"{len(layers)}", f"use head+last1 .. head+last{len(layers)}, or head")
        self.layers = copy.deepcopy(nn.ModuleList(list(layers)[len(layers) - n_layers:]))
        for module in self.layers.modules():
            config = getattr(module, "config", None)
            if config is not None:  # the copies' own config (deepcopy): the source model is untouched
                config._attn_implementation = "eager"
        self.head = copy.deepcopy(model.head)
        self.pooling = model.meta.pooling
        self.n_layers = n_layers
        self.eval()

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if len(self.layers):
            additive = (1.0 - attention_mask[:, None, None, :].to(hidden.dtype)) * torch.finfo(hidden.dtype).min
            for layer in self.layers:
                out = layer(hidden, attention_mask=additive)
                hidden = out[0] if isinstance(out, tuple) else out
        return self.head(pool(hidden, attention_mask, self.pooling))


@torch.no_grad()
def boundary_states(model: ReviewClassifier, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    n_layers: int) -> torch.Tensor:
    """Hidden states entering the last `n_layers` encoder layers (the last hidden state for 0)."""
    if n_layers == 0:
        return model.encode(input_ids, attention_mask)
    states = model.encoder(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True).hidden_states
    return states[len(states) - 1 - n_layers]


def margins(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Multi-class margin: logit of `labels` minus the log-sum-exp of the other logits (any leading shape)."""
    chosen = torch.arange(logits.shape[-1], device=logits.device) == labels.unsqueeze(-1)
    correct = (logits * chosen).sum(-1)
    return correct - logits.masked_fill(chosen, float("-inf")).logsumexp(-1)


def require_traker():
    """traker's module `trak`, or the error that asks for the optional extra `attribution`."""
    return require_extra("attribution", "attribution.enabled (the attribute step, TRAK)",
                         "set attribution.enabled=false")


def _trak():
    """traker, imported late (it configures logging on import) and quietened."""
    trak = require_traker()
    for name in ("TRAK", "GradientComputer", "ScoreComputer", "MmapSaver", "trak"):
        logging.getLogger(name).setLevel(logging.WARNING)
    return trak


def _model_output_class():
    from trak.modelout_functions import AbstractModelOutput

    class MarginOutput(AbstractModelOutput):
        """TRAK's model output for the Tail: f = margin of the attributed class; Q = 1 - p(attributed class)."""

        def __init__(self, temperature: float = 1.0) -> None:
            super().__init__()
            self.temperature = temperature

        @staticmethod
        def get_output(model, weights, buffers, hidden, attention_mask, label):
            logits = torch.func.functional_call(model, (weights, buffers), (hidden.unsqueeze(0),
                                                                            attention_mask.unsqueeze(0)))
            return margins(logits, label.unsqueeze(0)).sum()

        def get_out_to_loss_grad(self, model, weights, buffers, batch):
            hidden, attention_mask, labels = batch
            logits = torch.func.functional_call(model, (weights, buffers), (hidden, attention_mask))
            p = torch.softmax(logits / self.temperature, -1)[torch.arange(logits.shape[0]), labels]
            return (1 - p).clone().detach().unsqueeze(-1)

    return MarginOutput


def _gradient_computer_class(chunk: int):
    from trak.gradient_computers import FunctionalGradientComputer
    from trak.utils import vectorize

    class ChunkedGradientComputer(FunctionalGradientComputer):
        """traker's functional (vmap) per-example gradients, `chunk` examples at a time, returned as one flat
        batch x parameters matrix: a large batch is then projected in one call, so the CPU projector generates
        its random matrix once per batch instead of once per chunk."""

        def compute_per_sample_grad(self, batch):
            n = batch[0].shape[0]
            out = torch.empty(n, self.grad_dim, dtype=torch.float32, device=batch[0].device)
            for s in range(0, n, chunk):
                grads = super().compute_per_sample_grad([b[s:s + chunk] for b in batch])
                vectorize(grads, arr=out[s:s + chunk], device=out.device)
            return out

    return ChunkedGradientComputer


def _projector(grad_dim: int, proj_dim: int, seed: int, device: torch.device):
    """(projector, name): traker's CudaProjector on a GPU with fast_jl (proj_dim a multiple of 512), else its
    BasicProjector, whose random block is sized to stay under CPU_PROJECTOR_BYTES."""
    _trak()
    from trak.projectors import BasicProjector, ProjectionType

    if device.type == "cuda" and proj_dim % 512 == 0:
        try:
            import fast_jl  # noqa: F401  (CUDA-only; optional)
            from trak.projectors import CudaProjector

            return CudaProjector(grad_dim, proj_dim, seed, ProjectionType.rademacher, device,
                                 max_batch_size=32), "cuda"
        except (ImportError, RuntimeError, ValueError, AttributeError):
            pass
    block = max(1, min(proj_dim, CPU_PROJECTOR_BYTES // (4 * grad_dim)))
    # normal on CPU: torch cannot draw Bernoulli in float16 there, and traker picks normal on CPU too
    kind = ProjectionType.normal if device.type == "cpu" else ProjectionType.rademacher
    return BasicProjector(grad_dim, proj_dim, seed, kind, device, block_size=block, dtype=torch.float32), \
        f"basic-{kind.value}"


def _restore_projection(projector) -> None:
    """traker 0.3.2's finalize_features frees the projector's matrix, and BasicProjector regenerates it before
    projecting only when it has several blocks: a single-block projector would then fail to score the targets.
    Regenerated from its stored generator state, the matrix is the one the training reviews were projected with."""
    if getattr(projector, "proj_matrix_available", True) is False and getattr(projector, "num_blocks", 0) == 1:
        projector.generate_sketch_matrix(projector.generator_states[0])


def effective_proj_dim(proj_dim: int, n_train: int) -> int:
    """TRAK inverts the projected gradients' Gram matrix (proj_dim x proj_dim): at most half the training
    reviews (a multiple of 8, at least 8) keeps it well conditioned."""
    return max(8, min(proj_dim, (n_train // 2) // 8 * 8))


@dataclass
class Encoded:
    """Token ids of texts, in length order so batches pad little (`order[i]` = row of the i-th longest)."""

    ids: list[list[int]]
    order: np.ndarray
    pad_id: int

    @classmethod
    def of(cls, tokenizer, texts: Sequence[str], max_length: int) -> "Encoded":
        ids = tokenizer(list(texts), truncation=True, max_length=max_length, padding=False)["input_ids"]
        order = np.argsort(-np.array([len(x) for x in ids]), kind="stable")
        return cls(ids, order, tokenizer.pad_token_id or 0)

    def batches(self, size: int):
        for s in range(0, len(self.order), size):
            rows = self.order[s:s + size]
            width = max(len(self.ids[r]) for r in rows)
            ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
            am = torch.zeros((len(rows), width), dtype=torch.long)
            for i, r in enumerate(rows):
                ids[i, :len(self.ids[r])] = torch.tensor(self.ids[r])
                am[i, :len(self.ids[r])] = 1
            yield rows, ids, am


@dataclass
class TrakResult:
    scores: np.ndarray  # targets x training reviews
    target_margins: np.ndarray  # targets x models: each model's margin of the attributed class
    proj_dim: int
    grad_dim: int
    n_models: int
    projector: str
    timings: dict = field(default_factory=dict)


def trak_scores(models: Sequence[ReviewClassifier] | Sequence[Callable[[], ReviewClassifier]], tokenizer,
                train_texts: Sequence[str], train_labels: Sequence[int], target_texts: Sequence[str],
                target_labels: Sequence[int], *, params: str = "head+last1", proj_dim: int = 512,
                max_length: int = 128, batch_size: int = 64, chunk: int = 16, seed: int = 0,
                device: torch.device | str = "cpu",
                progress: Callable[[int, int], None] | None = None) -> TrakResult:
    """TRAK scores (targets x training reviews) over an ensemble of checkpoints of one architecture.

    `models`: ReviewClassifiers, or callables that load one (so only one checkpoint is in memory at a time).
    Each model is featurized with its own projection (traker's model ids); scores are averaged over models as in
    TRAK. A positive score: training on that review raises the target's margin for its attributed class."""
    trak = _trak()
    device = torch.device(device)
    n_layers = tail_size(params)
    n_train, n_targets = len(train_texts), len(target_texts)
    if n_train < 16:
        raise ConfigError(f"attribution needs at least 16 training reviews, got {n_train}",
                          "raise attribution.max_train or use more training data")
    proj = effective_proj_dim(proj_dim, n_train)
    train = Encoded.of(tokenizer, train_texts, max_length)
    targets = Encoded.of(tokenizer, target_texts, max_length)
    y_train = torch.as_tensor(list(train_labels), dtype=torch.long)
    y_target = torch.as_tensor(list(target_labels), dtype=torch.long)
    n_steps = len(models) * (math.ceil(n_train / batch_size) + math.ceil(n_targets / batch_size))
    step = 0
    timings = {"featurize_s": 0.0, "score_s": 0.0}
    tail_margins = np.zeros((n_targets, len(models)), dtype=np.float64)

    def load(i: int) -> ReviewClassifier:
        m = models[i] if isinstance(models[i], nn.Module) else models[i]()
        return m.to(device).eval()

    with tempfile.TemporaryDirectory(prefix="trak-") as save_dir:
        traker = None
        name = ""
        for i in range(len(models)):
            model = load(i)
            tail = Tail(model, n_layers).to(device)
            if traker is None:
                grad_dim = sum(p.numel() for p in tail.parameters())
                projector, name = _projector(grad_dim, proj, seed, device)
                traker = trak.TRAKer(model=tail, task=_model_output_class()(), train_set_size=n_train,
                                     save_dir=save_dir, load_from_save_dir=True, device=str(device),
                                     gradient_computer=_gradient_computer_class(chunk), projector=projector,
                                     use_half_precision=False, projector_seed=seed, logging_level=logging.WARNING)
            traker.load_checkpoint(tail.state_dict(), model_id=i)
            t0 = time.perf_counter()
            for rows, ids, am in train.batches(batch_size):
                hidden = boundary_states(model, ids.to(device), am.to(device), n_layers)
                traker.featurize(batch=(hidden, am.to(device), y_train[rows].to(device)), inds=np.asarray(rows))
                step += 1
                if progress:
                    progress(step, n_steps)
            timings["featurize_s"] += time.perf_counter() - t0
            del model
        t0 = time.perf_counter()
        traker.finalize_features()
        _restore_projection(traker.projector)
        for i in range(len(models)):
            model = load(i)
            tail = Tail(model, n_layers).to(device)
            traker.start_scoring_checkpoint(exp_name="targets", checkpoint=tail.state_dict(), model_id=i,
                                            num_targets=n_targets)
            for rows, ids, am in targets.batches(batch_size):
                hidden = boundary_states(model, ids.to(device), am.to(device), n_layers)
                y = y_target[rows].to(device)
                traker.score(batch=(hidden, am.to(device), y), inds=np.asarray(rows))
                with torch.no_grad():
                    tail_margins[rows, i] = margins(tail(hidden, am.to(device)), y).double().cpu().numpy()
                step += 1
                if progress:
                    progress(step, n_steps)
            del model
        scores = np.array(traker.finalize_scores(exp_name="targets"), dtype=np.float64).T.copy()
        timings["score_s"] = time.perf_counter() - t0
    return TrakResult(scores=scores, target_margins=tail_margins, proj_dim=proj, grad_dim=grad_dim,
                      n_models=len(models), projector=name, timings=timings)


# ---- targets from the stored predictions -------------------------------------------------------------------


def select_targets(preds, reasons: Sequence[str] = REASONS, max_targets: int = 20, seed: int = 0) -> list[dict]:
    """Test reviews worth explaining, from `steps.read_predictions` (one row per set x method x seed x review).

    - `flip`: a corrupted review whose undefended prediction differs from the clean review's;
    - `fixed` / `broke`: a review (any set) that a defense got right / wrong where no defense got it wrong /
      right (masked methods: their first mask seed).

    One target per (set, review), with every reason that applies; at most `max_targets`, drawn round-robin over
    the reasons (flips whose clean prediction was right first) in a seeded order. Sorted by set and review."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    p = preds.copy()
    seed = p["mask_seed"].astype("float64").fillna(-1.0)  # -1: an unmasked method's one row per review
    p = p[(seed == seed.groupby(p["method"]).transform("min")).to_numpy()]
    none = p[p["method"] == "none"].set_index(["set", "index"])
    if none.empty:
        return []
    found: dict[tuple, dict] = {}

    def add(set_name: str, idx: int, reason: str, **info) -> None:
        row = none.loc[(set_name, idx)]
        t = found.setdefault((set_name, idx), {
            "set": set_name, "kind": row["kind"], "family": None if pd.isna(row["family"]) else row["family"],
            "severity": None if pd.isna(row["severity"]) else int(row["severity"]), "index": int(idx),
            "label": int(row["label"]), "pred": int(row["pred"]), "reasons": [], "methods": {}})
        if reason not in t["reasons"]:
            t["reasons"].append(reason)
        t.update({k: v for k, v in info.items() if k != "methods"})
        t["methods"].update(info.get("methods", {}))

    pools: dict[str, list[tuple]] = {r: [] for r in REASONS}
    if "flip" in reasons and "clean" in set(none.index.get_level_values(0)):
        clean = none.loc["clean"]["pred"]
        for (s, i), row in none[none["kind"] == "corrupted"].iterrows():
            if i in clean.index and int(clean.loc[i]) != int(row["pred"]):
                was_right = int(clean.loc[i]) == int(row["label"])
                pools["flip"].append((0 if was_right else 1, s, int(i), {"pred_clean": int(clean.loc[i])}))
    for method, rows in p[p["method"] != "none"].groupby("method"):
        rows = rows.set_index(["set", "index"])
        both = rows.join(none[["pred"]], rsuffix="_none", how="inner")
        for (s, i), row in both.iterrows():
            right, right_none = int(row["pred"]) == int(row["label"]), int(row["pred_none"]) == int(row["label"])
            if right != right_none and ("fixed" if right else "broke") in reasons:
                pools["fixed" if right else "broke"].append((0, s, int(i), {"methods": {method: int(row["pred"])}}))
    queues = {}
    for reason, items in pools.items():
        perm = rng.permutation(len(items))
        queues[reason] = sorted((items[j] for j in perm), key=lambda x: x[0])  # stable: priority, then seeded
    chosen: list[tuple] = []
    while len(chosen) < max_targets and any(queues.values()):
        for reason in REASONS:
            if queues.get(reason) and len(chosen) < max_targets:
                _, s, i, _ = queues[reason].pop(0)
                if (s, i) not in chosen:
                    chosen.append((s, i))
    keep = set(chosen)
    for reason, items in pools.items():  # every reason (and method verdict) of a chosen review, not only the drawn
        for _, s, i, info in items:
            if (s, i) in keep:
                add(s, i, reason, **info)
    return [found[k] for k in sorted(found, key=lambda k: (k[0], k[1]))]


# ---- the step's result -------------------------------------------------------------------------------------

TEXT_CHARS = 400


def sample_train(n: int, max_train: int, seed: int) -> np.ndarray:
    """Positions of the attributed training reviews: all of them, or a seeded sample of `max_train` (sorted)."""
    if n <= max_train:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, max_train, replace=False))


def _short(text: str, n: int = TEXT_CHARS) -> str:
    return text if len(text) <= n else text[:n - 1] + "…"


def explain(preds, text_of: Callable[[str, int], str], models, tokenizer, train_texts: Sequence[str],
            train_labels: Sequence[int], label_names: Sequence[str], *, top_k: int = 10, params: str = "head+last1",
            proj_dim: int = 512, max_train: int = 2000, max_targets: int = 20, reasons: Sequence[str] = REASONS,
            batch_size: int = 128, seed: int = 0, max_length: int = 128, device: torch.device | str = "cpu",
            progress: Callable[[int, int], None] | None = None) -> tuple[dict, np.ndarray]:
    """(attribution.json's content, scores: targets x attributed training reviews).

    Each target (see `select_targets`) gets its `top_k` supporting training reviews (highest TRAK scores: they
    raise its margin for the attributed class, the undefended model's prediction on the text it saw) and its
    `top_k` opposing ones (lowest scores), each with its label and score."""
    targets = select_targets(preds, reasons, max_targets, seed)
    train_index = sample_train(len(train_texts), max_train, seed)
    texts = [train_texts[i] for i in train_index]
    labels = [int(train_labels[i]) for i in train_index]
    out = {"params": params, "top_k": top_k, "n_train": len(train_index), "n_targets": len(targets),
           "train_index": train_index.tolist(), "label_names": list(label_names), "targets": []}
    if not targets:
        return {**out, "proj_dim": None, "grad_dim": None, "n_models": len(models), "projector": None,
                "timings": {}}, np.zeros((0, len(train_index)))
    target_texts = [text_of(t["set"], t["index"]) for t in targets]
    res = trak_scores(models, tokenizer, texts, labels, target_texts, [t["pred"] for t in targets], params=params,
                      proj_dim=proj_dim, max_length=max_length, batch_size=batch_size, seed=seed, device=device,
                      progress=progress)
    name = list(label_names)

    def entry(j: int, c: int) -> dict:
        return {"train_index": int(train_index[c]), "label": name[labels[c]], "score": float(res.scores[j, c]),
                "text": _short(texts[c])}

    for j, t in enumerate(targets):
        order = np.argsort(-res.scores[j], kind="stable")
        out["targets"].append({
            "id": j, "set": t["set"], "kind": t["kind"], "family": t["family"], "severity": t["severity"],
            "index": t["index"], "reasons": t["reasons"], "label": name[t["label"]], "pred": name[t["pred"]],
            "attributed": name[t["pred"]], "attributed_id": t["pred"],
            **({"pred_clean": name[t["pred_clean"]]} if "pred_clean" in t else {}),
            "methods": {m: name[p] for m, p in sorted(t["methods"].items())},
            "margin": float(res.target_margins[j].mean()), "text": _short(target_texts[j], 2000),
            "supporting": [entry(j, int(c)) for c in order[:top_k]],
            "opposing": [entry(j, int(c)) for c in order[::-1][:top_k]]})
    out.update({"proj_dim": res.proj_dim, "grad_dim": res.grad_dim, "n_models": res.n_models,
                "projector": res.projector, "timings": res.timings})
    return out, res.scores


def table_rows(result: dict) -> list[dict]:
    """attribution.json flattened: one row per target x direction x rank (the MLflow and Prefect tables)."""
    rows = []
    for t in result["targets"]:
        for direction in ("supporting", "opposing"):
            for rank, e in enumerate(t[direction], 1):
                rows.append({"target": t["id"], "set": t["set"], "index": t["index"], "reasons": ",".join(t["reasons"]),
                             "label": t["label"], "pred": t["pred"], "attributed": t["attributed"],
                             "direction": direction, "rank": rank, "train_index": e["train_index"],
                             "train_label": e["label"], "score": e["score"], "train_text": e["text"],
                             "target_text": _short(t["text"], 200)})
    return rows


def format_target(t: dict, k: int | None = None) -> str:
    """One target as text: what was predicted and why (`ttt-pipeline explain`)."""
    lines = [f"example {t['index']} of {t['set']} ({', '.join(t['reasons'])}): label {t['label']}, "
             f"predicted {t['pred']}" + (f" (clean text: {t['pred_clean']})" if t.get("pred_clean") else "")
             + "".join(f"; {m}: {p}" for m, p in t.get("methods", {}).items()),
             f"  text: {_short(t['text'], 300)}",
             f"  attributed class {t['attributed']} (margin {t['margin']:+.3f})"]
    for direction, what in (("supporting", "raise"), ("opposing", "lower")):
        lines.append(f"  {direction} training reviews (they {what} the margin of {t['attributed']}):")
        for rank, e in enumerate(t[direction][:k], 1):
            lines.append(f"   {rank:2d}. #{e['train_index']:<6d} label {e['label']:<4s} score {e['score']:+.3e}  "
                         f"{_short(e['text'], 100)}")
    return "\n".join(lines)
