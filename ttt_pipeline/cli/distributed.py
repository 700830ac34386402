"""Data-parallel fine-tuning on one multi-GPU worker (torchrun), around the unchanged `train.finetune`.

The command line torchrun starts on every rank (`tasks.distributed.launch_finetune` builds it; the work is
`tasks.distributed.run_finetune_job`):
    torchrun --standalone --nproc-per-node N -m ttt_pipeline.cli.distributed finetune JOB.json
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ttt_pipeline.cli.distributed", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    f = sub.add_parser("finetune", help="the finetune step of JOB.json (config, data, tokens) on every rank")
    f.add_argument("job", type=Path)
    f.add_argument("--dump-weights", type=Path, default=None,
                   help="diagnostics: each rank saves its final weights and batch count to DIR/rank<R>.pt")
    args = p.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from ttt_pipeline.tasks.distributed import run_finetune_job

    run_finetune_job(args.job, args.dump_weights)
    return 0


if __name__ == "__main__":
    sys.exit(main())
