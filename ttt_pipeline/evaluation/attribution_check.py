"""TRAK's counterfactual checks at small scale: does removing a target's top-k supporting training reviews and
retraining lower its margin more than removing k random ones? And the linear datamodeling score (LDS).

Retraining the whole pipeline per removal is out of reach on two cores, so the checked training algorithm is
a small one, `A(S)`: from a fixed checkpoint (the pipeline's fine-tuned model), re-initialise the head with a
seed and train the attributed subset (`params`, as in ttt_pipeline.evaluation.attribution: the head, or the head and the
last N encoder layers) on the reviews S with AdamW for a few epochs; the lower layers are frozen, so their
outputs are computed once. Dropout is off and batches are length-sorted slices of S taken in a seeded order, so
A(S) is a deterministic function of S: a difference between two retrainings comes from the reviews removed.
TRAK then attributes A(S)'s own predictions (an ensemble of A(S) over head seeds), and the checks retrain A on
subsets of S. Pure: no Prefect, no MLflow (bench/attribution.py runs it).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ttt_pipeline.evaluation.attribution import Encoded, Tail, boundary_states, margins, tail_size
from ttt_pipeline.modeling.model import ReviewClassifier


@dataclass
class Cached:
    """Each review's hidden states entering the tail (unpadded), in length order (`order`)."""

    hidden: list[torch.Tensor]
    order: np.ndarray


def _cache(model: ReviewClassifier, tokenizer, texts: Sequence[str], n_layers: int, max_length: int,
           batch_size: int = 64) -> Cached:
    enc = Encoded.of(tokenizer, texts, max_length)
    hidden: list[torch.Tensor | None] = [None] * len(texts)
    for rows, ids, am in enc.batches(batch_size):
        h = boundary_states(model, ids, am, n_layers)
        for i, r in enumerate(rows):
            hidden[r] = h[i, :int(am[i].sum())].clone()
    return Cached(hidden, enc.order)  # type: ignore[arg-type]


def _pad(hidden: list[torch.Tensor], rows: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(hidden[r].shape[0] for r in rows)
    h = torch.zeros(len(rows), width, hidden[rows[0]].shape[1])
    am = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        h[i, :hidden[r].shape[0]] = hidden[r]
        am[i, :hidden[r].shape[0]] = 1
    return h, am


class TailTrainer:
    """The algorithm A of the module docstring, on fixed training reviews and targets."""

    def __init__(self, model: ReviewClassifier, tokenizer, train_texts: Sequence[str], train_labels: Sequence[int],
                 target_texts: Sequence[str], *, params: str = "head+last1", max_length: int = 128,
                 epochs: int = 2, lr: float = 1e-3, layer_lr: float | None = None, batch_size: int = 32,
                 weight_decay: float = 0.01):
        self.model = model.eval()
        self.n_layers = tail_size(params)
        self.epochs, self.lr, self.batch_size, self.weight_decay = epochs, lr, batch_size, weight_decay
        self.layer_lr = lr if layer_lr is None else layer_lr  # the encoder layers' rate (the head learns from scratch)
        self.labels = torch.as_tensor(list(train_labels), dtype=torch.long)
        self.train_cache = _cache(model, tokenizer, train_texts, self.n_layers, max_length)
        self.target_cache = _cache(model, tokenizer, target_texts, self.n_layers, max_length)
        self.steps = 0

    def train(self, keep: Sequence[int] | np.ndarray, seed: int = 0) -> Tail:
        """A(S) for S = the training reviews at positions `keep`.

        Batches are fixed slots of the full training list (length order) visited in a seeded order that does not
        depend on `keep`; a removed review leaves its slot empty, and each batch's loss is its kept reviews'
        summed loss over the slot count. Removing reviews therefore changes exactly their own terms of every
        step's gradient, not which reviews meet in a batch (which would make two retrainings differ by far more
        than the removal: a chaotic path, not an effect)."""
        keep_mask = np.zeros(len(self.train_cache.hidden), dtype=bool)
        keep_mask[np.asarray(keep, dtype=np.int64)] = True
        order = [int(r) for r in self.train_cache.order]
        slots = [order[s:s + self.batch_size] for s in range(0, len(order), self.batch_size)]
        torch.manual_seed(seed)
        tail = Tail(self.model, self.n_layers)
        for module in tail.head.modules():
            if isinstance(module, torch.nn.Linear):
                module.reset_parameters()  # seeded: the head is learned from S alone
        tail.eval()  # no dropout: A(S) is a deterministic function of S
        groups = [{"params": list(tail.head.parameters()), "lr": self.lr}]
        if self.n_layers:
            groups.append({"params": list(tail.layers.parameters()), "lr": self.layer_lr})
        opt = torch.optim.AdamW(groups, lr=self.lr, weight_decay=self.weight_decay)
        gen = np.random.default_rng(seed)
        for _ in range(self.epochs):
            for b in gen.permutation(len(slots)):
                rows = [r for r in slots[b] if keep_mask[r]]
                opt.zero_grad()
                if rows:
                    h, am = _pad(self.train_cache.hidden, rows)
                    loss = F.cross_entropy(tail(h, am), self.labels[rows], reduction="sum") / len(slots[b])
                    loss.backward()
                    opt.step()  # (an emptied slot is skipped: no gradient, no step)
                self.steps += 1
        return tail

    @torch.no_grad()
    def target_logits(self, tail: Tail) -> torch.Tensor:
        n = len(self.target_cache.hidden)
        out = torch.zeros(n, tail.head.net[-1].out_features)
        rows = [int(r) for r in self.target_cache.order]
        for s in range(0, n, 64):
            h, am = _pad(self.target_cache.hidden, rows[s:s + 64])
            out[rows[s:s + 64]] = tail(h, am)
        return out

    def target_margins(self, tail: Tail, labels: Sequence[int]) -> np.ndarray:
        return margins(self.target_logits(tail), torch.as_tensor(list(labels))).double().numpy()

    def full_model(self, tail: Tail) -> ReviewClassifier:
        """The checkpoint with `tail`'s weights in place of its last layers and head (what TRAK attributes)."""
        from ttt_pipeline.evaluation.attribution import encoder_layers

        m = copy.deepcopy(self.model)
        if self.n_layers:
            layers = encoder_layers(m)
            for dst, src in zip(list(layers)[len(layers) - self.n_layers:], tail.layers):
                dst.load_state_dict(src.state_dict())
        m.head.load_state_dict(tail.head.state_dict())
        return m.eval()


def removal_check(trainer: TailTrainer, scores: np.ndarray, labels: Sequence[int], k: int, seed: int = 0,
                  progress: Callable[[int, int], None] | None = None) -> dict:
    """Per target j: margin drop after removing its k highest-scored training reviews vs k random ones (the
    same count, seeded per target), each against A(S) on all of S (head seed 0)."""
    n_targets, n_train = scores.shape
    full = trainer.target_margins(trainer.train(np.arange(n_train), 0), labels)
    rng = np.random.default_rng(seed)
    top_drop, rand_drop = np.zeros(n_targets), np.zeros(n_targets)
    for j in range(n_targets):
        top = np.argsort(-scores[j], kind="stable")[:k]
        rand = rng.choice(n_train, k, replace=False)
        top_drop[j] = full[j] - trainer.target_margins(trainer.train(np.setdiff1d(np.arange(n_train), top), 0),
                                                       labels)[j]
        rand_drop[j] = full[j] - trainer.target_margins(trainer.train(np.setdiff1d(np.arange(n_train), rand), 0),
                                                        labels)[j]
        if progress:
            progress(j + 1, n_targets)
    return {"margin_full": full, "drop_topk": top_drop, "drop_random": rand_drop}


def lds(trainer: TailTrainer, scores: np.ndarray, labels: Sequence[int], n_subsets: int, fraction: float = 0.5,
        seed: int = 0, progress: Callable[[int, int], None] | None = None) -> dict:
    """Linear datamodeling score: per target, the Spearman correlation over random subsets S' (a `fraction` of
    S each) between TRAK's prediction (the sum of the target's scores over S') and A(S')'s actual margin;
    averaged over targets."""
    from scipy.stats import spearmanr

    n_targets, n_train = scores.shape
    rng = np.random.default_rng(seed + 1)
    predicted, actual = np.zeros((n_subsets, n_targets)), np.zeros((n_subsets, n_targets))
    for i in range(n_subsets):
        subset = np.sort(rng.choice(n_train, int(round(fraction * n_train)), replace=False))
        predicted[i] = scores[:, subset].sum(1)
        actual[i] = trainer.target_margins(trainer.train(subset, 0), labels)
        if progress:
            progress(i + 1, n_subsets)
    per_target = np.array([spearmanr(predicted[:, j], actual[:, j]).statistic for j in range(n_targets)])
    return {"lds": float(np.nanmean(per_target)), "per_target": per_target, "n_subsets": n_subsets,
            "fraction": fraction}
