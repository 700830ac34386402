"""The data-parallel fine-tune's orchestration: the torchrun launcher and each rank's job.

Run by the `finetune` flow when the worker sets TTT_NPROC_PER_NODE > 1:
    torchrun --standalone --nproc-per-node N -m ttt_pipeline.cli.distributed finetune JOB.json
(`ttt_pipeline.cli.distributed` reads the command line and calls `run_finetune_job` on every rank). Each rank calls
the ordinary `steps.finetune(..., parallel=DataParallel())`; the torch side (DistributedDataParallel around
`train.TrainingLoss`, each rank's share of the batches) is `ttt_pipeline/modeling/data_parallel.py`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from ttt_pipeline.modeling.data_parallel import DataParallel


def launch_finetune(cfg, data: dict, tokens: dict, nproc: int, extra_args: tuple[str, ...] = (),
                    timeout_s: float | None = None) -> None:
    """Run the finetune step on `nproc` local processes (torchrun); rank 0 writes its output into the store."""
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
    """This rank's part of the finetune step of JOB.json (config, data, tokens): rank 0 writes the step output;
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
