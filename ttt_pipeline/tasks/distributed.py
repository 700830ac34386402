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

Run by the `fine-tune` flow when the worker sets TTT_NPROC_PER_NODE > 1:
    torchrun --standalone --nproc-per-node N -m ttt_pipeline.cli.distributed finetune JOB.json
(`ttt_pipeline.cli.distributed` reads the command line and calls `run_finetune_job` on every rank).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

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


# ---------------------------------------------------------------------------------------------------------------
# The fine-tune step under torchrun.


def launch_finetune(cfg, data: dict, tokens: dict, nproc: int, extra_args: tuple[str, ...] = (),
                    timeout_s: float | None = None) -> None:
    """Run the fine-tune step on `nproc` local processes (torchrun); rank 0 writes its output into the store."""
    from ttt_pipeline.errors import PipelineError

    with tempfile.TemporaryDirectory(prefix="ttt-ddp-") as tmp:
        job = Path(tmp) / "job.json"
        job.write_text(json.dumps({"config": cfg.model_dump(mode="json"), "data": data, "tokens": tokens}))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               "-m", "ttt_pipeline.cli.distributed", "finetune", str(job), *extra_args]
        env = {**os.environ, "TTT_DDP_LOCAL_WORLD": str(nproc)}
        proc = subprocess.run(cmd, env=env, timeout=timeout_s)
        if proc.returncode != 0:
            raise PipelineError(f"data-parallel fine-tuning failed (torchrun exit {proc.returncode})",
                                "see the log above; set TTT_NPROC_PER_NODE=1 to fine-tune on one device")


def run_finetune_job(job_path: Path, dump_weights: Path | None = None) -> None:
    """This rank's part of the fine-tune step of JOB.json (config, data, tokens): rank 0 writes the step output;
    `dump_weights` (diagnostics) makes each rank save its final weights and batch count to DIR/rank<R>.pt."""
    from ttt_pipeline import steps
    from ttt_pipeline.config import PipelineConfig
    from ttt_pipeline.io.remote_store import open_store
    from ttt_pipeline.storage import StepOutput, StepStore

    cuda = torch.cuda.is_available()
    dist.init_process_group(backend="nccl" if cuda else "gloo")
    rank = dist.get_rank()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    job = json.loads(job_path.read_text())
    cfg = PipelineConfig.model_validate(job["config"])
    data, tokens = StepOutput(**job["data"]), StepOutput(**job["tokens"])
    shared = open_store(cfg.store)
    inputs = steps.finetune_inputs(cfg, tokens, data)
    done = torch.tensor([1 if rank == 0 and steps.stored("finetune", inputs, shared) is not None else 0])
    dist.broadcast(done, src=0)
    if done.item():
        dist.destroy_process_group()
        return

    scratch = None
    if rank == 0:
        store = shared
    else:  # the other ranks build into a scratch store (their copy is identical and thrown away) ...
        scratch = Path(tempfile.mkdtemp(prefix=f"ttt-ddp-rank{rank}-"))
        store = StepStore(scratch)
        key = StepStore.key("finetune", inputs, steps.version("finetune"))
        ckpt = shared.root / "finetune" / f"{key}.work"
        if ckpt.is_dir():  # ... resuming from rank 0's checkpoints (single node: same disk)
            shutil.copytree(ckpt, scratch / "finetune" / f"{key}.work")
    dist.barrier()

    parallel = DataParallel()  # modeling.train.set_threads gives each rank its share of the cores (LOCAL_WORLD_SIZE)
    try:
        out = steps.finetune(cfg, data, tokens, store, parallel=parallel)
        if dump_weights is not None:
            dump_weights.mkdir(parents=True, exist_ok=True)  # the trained model in memory (rank > 0 saves no files)
            model = parallel.module.model
            weights = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
            torch.save({"weights": weights, "batches": parallel.batches_seen, "world": parallel.world,
                        "history": json.loads((Path(out.path) / "history.json").read_text())},
                       dump_weights / f"rank{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
