"""Data-parallel fine-tuning on one multi-GPU worker (torchrun): `train.finetune` under DistributedDataParallel.

Each of the N processes (one per GPU; gloo on CPU for tests) calls the ordinary `steps.finetune(...,
parallel=DataParallel())`. Its classification epochs compute each batch's whole training loss in one module,
`train.TrainingLoss` (cross-entropy, plus mlm_weight x the MLM loss when joint: the Hugging Face Trainer's way
of putting the loss inside the model's forward), and `DataParallel.prepare` wraps that module in
`torch.nn.parallel.DistributedDataParallel`: its construction broadcasts rank 0's weights and buffers, and its
reducer averages the gradients during each backward. The MLM term's pass through the encoder is part of the
wrapped forward, so the reducer sees all of it; only a frozen (not joint) alignment leaves trainable parameters
without a gradient (the MLM head), and only then is `find_unused_parameters` on (those keep no gradient, as in
single-process training). Each rank trains on its own 1/N of every epoch's batches (`ShardedBatches`), so all
ranks stay identical and rank 0 writes the step output. The effective batch is N x finetune.batch_size and the
learning-rate schedule counts each rank's (N times fewer) steps. The MLM-head warm-up and DAPT before the
epochs run unsharded on every rank; wrapping then broadcasts rank 0's weights, so any difference (GPU
non-determinism) is gone before the first synchronised step.

The torchrun launcher and each rank's job are `ttt_pipeline/tasks/distributed.py`'s.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import Sampler


class ShardedBatches(Sampler[list[int]]):
    """Rank r of N gets batches r, r+N, r+2N ... of the wrapped batch sampler (the same list on every rank, as
    each draws it from the same seed); the list is padded by wrapping around so every rank takes the same
    number of steps, as DistributedSampler does."""

    def __init__(self, inner, rank: int, world: int):
        self.inner, self.rank, self.world = inner, rank, world

    @property
    def lengths(self):  # train.finetune reports throughput over the whole epoch (all ranks together)
        return self.inner.lengths

    def set_epoch(self, epoch: int) -> None:
        self.inner.set_epoch(epoch)

    def __len__(self) -> int:
        return math.ceil(len(self.inner) / self.world)

    def __iter__(self):
        batches = list(self.inner)
        total = len(self) * self.world
        while batches and len(batches) < total:
            batches += batches[: total - len(batches)]
        yield from batches[self.rank:total:self.world]


class DataParallel:
    """The `parallel` argument of train.finetune for an initialised process group (as accelerate's `prepare`)."""

    def __init__(self):
        if not dist.is_initialized():
            raise RuntimeError("DataParallel needs torch.distributed.init_process_group() first")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.batches_seen = 0
        self.module: torch.nn.Module | None = None  # the unwrapped loss module (train.TrainingLoss)

    def prepare(self, module: torch.nn.Module, sampler, find_unused_parameters: bool = False):
        """(`module` in DistributedDataParallel, this rank's share of `sampler`'s batches). Wrapping broadcasts
        rank 0's parameters and buffers. `module`'s inputs are already on its device, hence no device_ids."""
        self.module = module
        ddp = DistributedDataParallel(module, find_unused_parameters=find_unused_parameters)
        ddp.register_forward_pre_hook(self._count)
        return ddp, ShardedBatches(sampler, self.rank, self.world)

    def _count(self, *_) -> None:
        self.batches_seen += 1
