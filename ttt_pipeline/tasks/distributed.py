"""Data-parallel fine-tuning on one multi-GPU worker (torchrun), around the unchanged `train.finetune`.

Each of the N processes (one per GPU; gloo on CPU for tests) trains on its own 1/N of every epoch's batches
and the gradients are averaged after each backward, exactly what DistributedDataParallel does; every rank
starts from rank 0's weights, so all ranks stay identical and rank 0 writes the step output. The effective
batch is N x finetune.batch_size and the learning-rate schedule counts each rank's (N times fewer) steps.

Why not wrap the model in `torch.nn.parallel.DistributedDataParallel`: joint training adds an MLM loss that
goes through the encoder outside the classifier's forward, and the MLM head gets no gradient at all in
`frozen` mode; DDP's reducer needs every gradient to come from its own forward, so it would either hang or
fail there. Averaging coalesced gradient buckets after backward is DDP's arithmetic without that constraint.
The MLM-head warm-up and DAPT before the epochs run unsharded on every rank; `shard` then broadcasts rank 0's
weights so that any difference (GPU non-determinism) is gone before the first synchronised step.

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
from torch.utils.data import Sampler

BUCKET_BYTES = 25 * 1024 * 1024  # DDP's default bucket size


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
    """The `parallel` hooks of train.finetune for an initialised process group."""

    def __init__(self):
        if not dist.is_initialized():
            raise RuntimeError("DataParallel needs torch.distributed.init_process_group() first")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.batches_seen = 0
        self.model: torch.nn.Module | None = None

    def shard(self, sampler, model: torch.nn.Module):
        self.model = model
        self.broadcast_weights(model)
        return ShardedBatches(sampler, self.rank, self.world)

    @torch.no_grad()
    def broadcast_weights(self, model: torch.nn.Module) -> None:
        for t in list(model.parameters()) + list(model.buffers()):
            dist.broadcast(t.data, src=0)

    @torch.no_grad()
    def sync_gradients(self, model: torch.nn.Module) -> None:
        """All-reduce the mean gradient, in coalesced buckets. A parameter that got a gradient on any rank gets
        one on every rank (zeros where it had none); one that got none anywhere keeps None, so the optimizer
        skips it exactly as in single-process training."""
        self.batches_seen += 1
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            return
        has = torch.tensor([p.grad is not None for p in params], dtype=torch.uint8, device=params[0].device)
        dist.all_reduce(has, op=dist.ReduceOp.MAX)
        live = [p for p, h in zip(params, has.tolist()) if h]
        for p in live:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        bucket, size = [], 0
        for p in live:
            bucket.append(p)
            size += p.grad.numel() * p.grad.element_size()
            if size >= BUCKET_BYTES:
                self._reduce(bucket)
                bucket, size = [], 0
        if bucket:
            self._reduce(bucket)

    def _reduce(self, params: list[torch.nn.Parameter]) -> None:
        by_dtype: dict[torch.dtype, list[torch.nn.Parameter]] = {}
        for p in params:
            by_dtype.setdefault(p.grad.dtype, []).append(p)
        for group in by_dtype.values():
            flat = torch.cat([p.grad.reshape(-1) for p in group])
            dist.all_reduce(flat)
            flat /= self.world
            offset = 0
            for p in group:
                n = p.grad.numel()
                p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
                offset += n


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
        key = StepStore.key("finetune", inputs, steps._v("finetune"))
        ckpt = shared.root / "finetune" / f"{key}.work"
        if ckpt.is_dir():  # ... resuming from rank 0's checkpoints (single node: same disk)
            shutil.copytree(ckpt, scratch / "finetune" / f"{key}.work")
    dist.barrier()

    parallel = DataParallel()  # modeling.train.set_threads gives each rank its share of the cores (LOCAL_WORLD_SIZE)
    try:
        out = steps.finetune(cfg, data, tokens, store, parallel=parallel)
        if dump_weights is not None:
            dump_weights.mkdir(parents=True, exist_ok=True)  # the trained model in memory (rank > 0 saves
            weights = {k: v.detach().cpu().clone() for k, v in parallel.model.state_dict().items()}  # no files)
            torch.save({"weights": weights, "batches": parallel.batches_seen, "world": parallel.world,
                        "history": json.loads((Path(out.path) / "history.json").read_text())},
                       dump_weights / f"rank{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
